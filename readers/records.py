"""
readers/records.py: how the downloads write their rows, and how one training record becomes a row of the prepared
table. readers/training.py and readers/evaluation.py read whole downloads with it.

    for location, record in read_records("data/mmE5/mmE5-synthetic/VQA/VQA.parquet", TRAIN_COLUMNS):
        row, missing = train_row(record, ImagePaths("data/mmE5"), rewrite=lambda text: text)

Records are Parquet rows or JSON Lines objects. A list column is a list, a string that parses to a list of strings
(mmE5's "['', 'a']", read with ast.literal_eval, which runs nothing, else as JSON), any other string one entry
(MMEB-train's "[1999, 2003]") or absent. Image paths join image_dir as the official loaders join them ('' is no
image) and must exist; a folder is listed once. Hidden names (macOS's '._name') are never data or images.
A training record has one of two layouts, told apart by its columns:
- mmE5 / MMEB-train (and tools/mine.py's files): qry, qry_image_path, pos_text, pos_image_path, neg_text,
  neg_image_path (entry k pairs neg_text[k] with neg_image_path[k]), from a judge pos_judge and neg_judge. An entry
  with an image and text '' is an image negative, its text the positive's (mmE5's rule when every text is '', else
  the list's first non-empty text); an entry with neither is a missing negative, left for the fill.
- plain, for your own data: query, query_image, positive, positive_image, negatives (texts), negative_images (image
  paths, entry by entry; either list may be absent), optionally positive_judge and negative_judges; a side may hold
  a video instead of an image: query_video, positive_video, negative_videos (entry by entry), each a folder of
  frame files under image_dir (.jpg/.jpeg/.png in natural order, media.frame_files) or a list of frame files.
A field outside its layout (mmE5's also carries mmE5-synthetic's modality and tools/mine.py's neg_score; pandas'
__index_level_0__ is no field) is a bad row naming it and the closest known field: a misspelt query_img would train
a text-only query. So is a query or positive with neither text nor image. A BadRow names the field and a reason: an
error naming the file and the row, or a skip counted by reason.
"""
import ast
import collections
import difflib
import functools
import json
import math
import os
import re

import pyarrow.parquet as pq

from common import UserError
from media import IMAGE_MARKER, VIDEO_MARKER, frame_files

TRAIN_COLUMNS = ("qry", "qry_image_path", "pos_text", "pos_image_path", "neg_text", "neg_image_path", "pos_judge",
                 "neg_judge", "query", "query_image", "positive", "positive_image", "negatives", "negative_images",
                 "positive_judge", "negative_judges", "query_video", "positive_video", "negative_videos")  # a file has one layout's
DATA_SUFFIXES = (".parquet", ".jsonl")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
SPLIT_FILE = re.compile(r"(?P<split>[A-Za-z_]+)-\d{5}-of-\d{5}\.(parquet|jsonl)$")  # Hugging Face's shard names


# -----------------------------------------------------------------------------
# which files of a folder hold rows

def is_junk(name):
    """Hidden files and macOS's AppleDouble '._name' companions, which are never data or images."""
    return name.startswith(".")


def data_files(folder):
    """The Parquet and JSON Lines files directly in folder, sorted."""
    return sorted(os.path.join(folder, name) for name in os.listdir(folder)
                  if name.endswith(DATA_SUFFIXES) and not is_junk(name) and os.path.isfile(os.path.join(folder, name)))


def split_files(folder, split, files):
    """A subset folder's data files (data_files(folder)) -> (the files of one split, the split read). Hugging Face
    names a split's shards <split>-00000-of-00001.parquet: an MMEB-train folder holds 'original',
    'diverse_instruction' and a legacy 'train' side by side, and only `split` is read. A folder with one split only
    (mmE5's 'train', or files named otherwise) is read whole, whatever `split` says."""
    groups = collections.defaultdict(list)
    for path in files:
        match = SPLIT_FILE.match(os.path.basename(path))
        groups[match.group("split") if match else None].append(path)
    if split in groups:
        return groups[split], split
    if len(groups) == 1:
        only = next(iter(groups))
        return groups[only], only or "(one split)"
    if not groups:
        raise UserError(f"{folder}: no .parquet or .jsonl files")
    raise UserError(f"{folder} holds the splits {', '.join(sorted(map(str, groups)))}, not train_split={split!r}: "
                    f"set --train_split to one of them")


# -----------------------------------------------------------------------------
# records and their fields

class BadRow(UserError):
    """One row's problem: the field it is in (None: the row as a whole, a line that does not parse) and its reason
    (counted by reason). Becomes an error naming the file and row (at()), or a skip."""

    def __init__(self, field, problem, reason):
        super().__init__(problem if field is None else f"field {field!r}: {problem}")
        self.field, self.reason = field, reason

    def at(self, location):
        """'t.jsonl line 12' -> "t.jsonl line 12 field 'query': empty: no text and no image", or for a row as a whole
        't.jsonl line 12: not a JSON object (column 41: invalid control character)'."""
        return f"{location} {self}" if self.field is not None else f"{location}: {self}"


def json_error(error, line=False):
    """A json.JSONDecodeError -> 'column 41: invalid control character' (with line: 'line 3, column 41: ...'): a
    line of a JSON Lines file is parsed alone, so its error's own 'line 1' would be a second, wrong line number."""
    what = error.msg.removesuffix(" at")  # 'Invalid control character at'
    return (f"line {error.lineno}, " if line else "") + f"column {error.colno}: {what[:1].lower()}{what[1:]}"


def json_lines(path, max_rows=None):
    """(location, record) of each line of a JSON Lines file, at most max_rows of them; a line that is not a UTF-8
    JSON object comes as (location, BadRow), one bad row, not a crash."""
    count = 0
    with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is one bad row
        for line_number, line in enumerate(f, 1):
            if max_rows is not None and count >= max_rows:
                return
            if not line.strip():
                continue
            count += 1
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as error:
                record = BadRow(None, f"not UTF-8 text ({error.reason} at byte {error.start})", "not UTF-8 JSON")
            except json.JSONDecodeError as error:
                record = BadRow(None, f"not a JSON object ({json_error(error)})", "not UTF-8 JSON")
            except RecursionError:  # valid JSON nested thousands deep
                record = BadRow(None, "not a JSON object (nested too deep to read)", "not UTF-8 JSON")
            if not isinstance(record, (dict, BadRow)):
                record = BadRow(None, f"not a JSON object (a JSON {type(record).__name__})", "not UTF-8 JSON")
            yield f"line {line_number}", record


def read_records(path, columns, max_rows=None):
    """(location, record) of each row of a .jsonl or .parquet file, at most max_rows of them. A line that is not
    UTF-8 JSON comes as (location, BadRow) so the caller can raise or skip it."""
    if path.endswith(".jsonl"):
        yield from json_lines(path, max_rows)
        return
    count = 0
    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds
        raise UserError(f"{path}: cannot read it as Parquet: {error}") from None
    present = [c for c in columns if c in table.schema_arrow.names]  # a missing one is caught per row
    for batch in table.iter_batches(batch_size=4096, columns=present):
        for record in batch.to_pylist():
            if max_rows is not None and count >= max_rows:
                return
            yield f"row {count}", record
            count += 1


def unknown_columns(path):
    """A Parquet file's columns outside its layout (records.unknown_fields) -> the BadRow every row of the file is,
    or None. read_records reads only the known columns, so a misspelt one is caught here, once a file; a JSON Lines
    row names its own fields, which train_row checks."""
    if not path.endswith(".parquet"):
        return None
    try:
        names = pq.read_schema(path).names
    except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds
        raise UserError(f"{path}: cannot read it as Parquet: {error}") from None
    return unknown_fields(names, layout_of(names))


def text_field(record, field):
    """A required text column -> str (null reads as empty)."""
    if field not in record:
        raise BadRow(field, "missing column", "missing column")
    value = record[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRow(field, f"expected a string, got {type(value).__name__}", "not a string")
    return value


def list_field(record, field, required=False):
    """A list column -> list of str: a list, a string that parses to a list of strings (a Python literal, as mmE5
    writes its negatives, or JSON), or else one plain string, one entry: MMEB-train's negative columns are scalar
    strings that VLM2Vec reads whole, and one may begin with '[' ("[Note] no data", ChartQA's "[1999, 2003]").
    Empty, null or absent is no entries."""
    if field not in record:
        if required:
            raise BadRow(field, "missing column", "missing column")
        return []
    value = record[field]
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        parsed = list_literal(value.strip()) if value.lstrip().startswith("[") else None
        if not (isinstance(parsed, tuple) and all(v is None or isinstance(v, str) for v in parsed)):
            return [value]  # a string is a string, unless it is a list of strings
        value = parsed
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, str) for v in value):
        return ["" if v is None else v for v in value]
    raise BadRow(field, f"expected a list of strings, got {str(value)[:80]!r}", "unparsable list")


@functools.lru_cache(maxsize=1024)
def list_literal(text):
    """A list written as a string -> a tuple, or None when it does not parse: a Python literal (mmE5 writes
    "['', 'a']"; parsed with ast.literal_eval, which runs nothing), else JSON (true / false / null). Cached: most
    rows of a subset repeat the same "['', '', '']" of an image negative's text or a text negative's image."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return None
    return tuple(value) if isinstance(value, list) else value


# -----------------------------------------------------------------------------
# images and sides

class ImagePaths:
    """A row's image path -> the file under image_dir, which must exist. Refuses a path that leaves image_dir
    (absolute, or climbing out with ../) unless allow_outside. Existence is looked up in each folder's listing,
    read once (a folder of 100,000 images is one listdir, not 100,000 stats: seconds on a network file system)."""

    def __init__(self, image_dir, allow_outside=False):
        self.root, self.allow_outside, self.listings = os.path.abspath(image_dir or "."), allow_outside, {}
        self.frames = {}  # a video folder -> its frames' count (None: no folder), each listed once

    def exists(self, path):
        folder, name = os.path.split(path)
        if folder not in self.listings:
            names = os.listdir(folder) if os.path.isdir(folder) else []
            self.listings[folder] = frozenset(name for name in names if not is_junk(name))  # never '._' files
        return name in self.listings[folder]

    def resolve(self, value, field, kind="image path"):
        """A row's path -> the file (or with kind 'video folder', the folder) under image_dir; None for ''."""
        if not isinstance(value, str):
            raise BadRow(field, f"expected a path string, got {type(value).__name__}", "not a string")
        if not value:
            return None
        path = os.path.normpath(os.path.join(self.root, value))
        if not self.allow_outside and not path.startswith(self.root.rstrip(os.sep) + os.sep):
            raise BadRow(field, f"{kind} {value!r} leaves image_dir {self.root} (allow_any_image_path=True "
                                "allows it)", "image path leaves image_dir")
        if kind == "image path" and not self.exists(path):
            raise BadRow(field, f"image not found: {path}", "missing image")
        return path

    def add(self, path):
        """Note a file written since its folder was listed (a page tools write while converting)."""
        self.exists(path)
        self.listings[os.path.dirname(path)] |= {os.path.basename(path)}

    def video(self, value, field):
        """A row's video -> the list the table keeps (None: no video): [folder] for a folder of frames under image_dir
        (its frames listed as each row is read, media.frame_files), or the frame files of a list, each resolved as an
        image. A folder that is missing or holds no frame is a bad row. -> (that list, its number of frames)."""
        if isinstance(value, list):
            paths = [self.resolve(frame, f"{field}[{k}]") for k, frame in enumerate(value)]
            if None in paths:
                raise BadRow(field, "a frame path is ''", "empty frame path")
            return (paths, len(paths)) if paths else (None, 0)
        folder = self.resolve(value, field, "video folder")
        if folder is None:
            return None, 0
        if folder not in self.frames:
            self.frames[folder] = None if (found := frame_files(folder)) is None else len(found)
        if self.frames[folder] is None:
            raise BadRow(field, f"video folder not found: {folder}", "missing video folder")
        if not self.frames[folder]:
            raise BadRow(field, f"video folder {folder} holds no .jpg/.jpeg/.png frame", "empty video folder")
        return [folder], self.frames[folder]


def empty_text(text):
    return not text.replace(IMAGE_MARKER, "").replace(VIDEO_MARKER, "").strip()


def make_side(text, image, text_name, image_name, images, reason="empty", video=None, video_name=None):
    """A query or positive -> {"text", "image": a file path or None}, with a video also "video" (ImagePaths.video's
    list) and "frames". One with neither text nor a visual is a bad row, one with an image and a video too."""
    path = images.resolve(image, image_name)
    frames, count = images.video(video, video_name) if video is not None else (None, 0)
    if path is not None and frames is not None:
        raise BadRow(video_name, f"the side has an image ({image_name}) and a video: one or the other", "image and video")
    if path is None and frames is None and empty_text(text):
        raise BadRow(text_name, "empty: no text and no image", reason)
    return {"text": text, "image": path, **({"video": frames, "frames": count} if frames else {})}


def entry_pairs(texts, paths, text_name, image_name):
    """A record's lists of texts and of image paths that go together entry by entry -> [(text, path)]; one of the
    two may be empty or absent (its entries are then ''), lists of different lengths are a bad row."""
    if texts and paths and len(texts) != len(paths):
        raise BadRow(image_name, f"{len(paths)} entries, but {text_name} has {len(texts)}", "list lengths differ")
    count = max(len(texts), len(paths))
    return list(zip(texts or [""] * count, paths or [""] * count))


# -----------------------------------------------------------------------------
# a training record of either layout -> a row of the prepared table

MMEB_NAMES = {"query": "qry", "query_image": "qry_image_path", "positive": "pos_text", "positive_image": "pos_image_path",
              "negatives": "neg_text", "negative_images": "neg_image_path", "positive_judge": "pos_judge",
              "negative_judges": "neg_judge"}  # the plain layout's column -> mmE5's
PLAIN_NAMES = {name: name for name in MMEB_NAMES}
VIDEO_FIELDS = ("query_video", "positive_video", "negative_videos")  # the plain layout's alone
LAYOUT_FIELDS = {"mmE5": frozenset(MMEB_NAMES.values()) | {"modality", "neg_score"},
                 "plain": frozenset(PLAIN_NAMES) | frozenset(VIDEO_FIELDS)}
# every field a layout may hold; mmE5-synthetic's `modality` and tools/mine.py's `neg_score` are carried, never read
PANDAS_INDEX = re.compile(r"__index_level_\d+__$")  # the index pandas' to_parquet may write: a column, not a field


def layout_of(record):
    """'mmE5' (mmE5's and MMEB-train's columns) or 'plain' (the file docstring). record: a dict, or a file's
    column names."""
    return "mmE5" if "qry" in record or "pos_text" in record else "plain"


def closest_field(name, layout):
    """A field name its layout lacks -> ' (did you mean 'query_image'?)', or '' when no field is close."""
    close = difflib.get_close_matches(name, sorted(LAYOUT_FIELDS[layout]), n=1) or \
        difflib.get_close_matches(name, TRAIN_COLUMNS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_fields(fields, layout):
    """A record's fields (or a Parquet file's columns) -> a BadRow naming those its layout does not have, each
    with the closest known field, or None when every field is known. A misspelt field is never dropped in
    silence: `query_img` would leave the query without its image."""
    unknown = [name for name in fields if name not in LAYOUT_FIELDS[layout] and not PANDAS_INDEX.match(str(name))]
    if not unknown:
        return None
    hints = [closest_field(str(name), layout) for name in unknown]
    others = "".join(f"; nor {name!r}{hint}" for name, hint in zip(unknown[1:], hints[1:]))
    fields = "" if any(hints) else f" (its fields: {', '.join(sorted(LAYOUT_FIELDS[layout]))})"
    return BadRow(unknown[0], f"not a field of the {layout} layout{hints[0]}{others}{fields}",
                  f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")


def train_row(record, images, rewrite):
    """One training record (either layout, the file docstring) -> (row, missing negatives): row = {"query",
    "query_image", "positive", "positive_image", "negatives", "negative_images", "query_video", "positive_video",
    "negative_videos", "judge", "frames"}, the query's text through rewrite (the instructions), images as resolved
    paths (None for none), videos as ImagePaths.video keeps them, judge the scores of the positive and of each kept
    negative (None when the record has none), frames each video's frame count. A field outside the record's layout
    is a bad row."""
    layout = layout_of(record)
    mmE5 = layout == "mmE5"
    if not mmE5 and "query" not in record and "positive" not in record:
        got = ", ".join(f"{name}{closest_field(str(name), layout)}" for name in record) or "none"
        raise BadRow("query", f"no query column: mmE5's layout has {', '.join(MMEB_NAMES.values())}; the plain "
                              f"layout {', '.join(MMEB_NAMES)} (got {got})", "missing column")
    if not record.keys() <= LAYOUT_FIELDS[layout] and (unknown := unknown_fields(record, layout)):
        raise unknown
    names = MMEB_NAMES if mmE5 else PLAIN_NAMES
    if not mmE5:  # the plain layout: a side without text or without an image may leave out its column
        record = {**{name: "" for name in ("query", "query_image", "positive", "positive_image")}, **record}
    query = make_side(text_field(record, names["query"]), text_field(record, names["query_image"]), names["query"],
                      names["query_image"], images, "empty query", record.get("query_video"), "query_video")
    positive = make_side(text_field(record, names["positive"]), text_field(record, names["positive_image"]),
                         names["positive"], names["positive_image"], images, "empty positive",
                         record.get("positive_video"), "positive_video")
    pairs = entry_pairs(list_field(record, names["negatives"]), list_field(record, names["negative_images"]),
                        names["negatives"], names["negative_images"])
    videos = list_field(record, "negative_videos")
    if videos and len(videos) != len(pairs):
        raise BadRow("negative_videos", f"{len(videos)} entries, but negatives has {len(pairs)}", "list lengths differ")
    filler = next((t for t, _ in pairs if t), positive["text"])  # mmE5: an image negative's text, when its own is ''
    negatives, kept = [], []
    for k, (text, image) in enumerate(pairs):
        side = make_side(text, image, None, f"{names['negative_images']}[{k}]", images, None,
                         videos[k] if videos else None, f"negative_videos[{k}]") if not empty_text(text) or image \
            or (videos and videos[k]) else None
        if side is None:
            continue  # a missing negative
        side["text"] = (text or filler) if side["image"] and mmE5 else text
        negatives.append(side)
        kept.append(k)
    row = {"query": rewrite(query["text"]), "query_image": query["image"], "positive": positive["text"],
           "positive_image": positive["image"], "negatives": [n["text"] for n in negatives],
           "negative_images": [n["image"] for n in negatives], "query_video": query.get("video"),
           "positive_video": positive.get("video"), "negative_videos": [n.get("video") for n in negatives],
           "judge": judge_scores(record, kept, names), "frames": [s["frames"] for s in [query, positive] + negatives
                                                                  if "video" in s]}
    return row, len(pairs) - len(kept)


def judge_scores(record, kept, names):
    """A judged record's scores (pos_judge, neg_judge) -> [positive's, each kept negative's], each finite: a judge's
    probabilities (tools/mine.py) or a reranker's log-odds (tools/distill.py); None when the record carries none."""
    positive, negatives = record.get(names["positive_judge"]), record.get(names["negative_judges"])
    if positive is None and negatives is None:
        return None
    scores = list_literal(negatives.strip()) if isinstance(negatives, str) else negatives
    if positive is None or not isinstance(scores, (list, tuple)) or \
            not all(isinstance(v, (int, float)) for v in scores) or (kept and max(kept) >= len(scores)):
        raise BadRow(names["negative_judges"], f"expected a score for the positive and a list of a score for each "
                                               f"negative, got {str(negatives)[:80]!r}", "unparsable judge scores")
    values = [float(positive)] + [float(scores[k]) for k in kept]
    if not all(math.isfinite(v) for v in values):
        raise BadRow(names["negative_judges"], f"judge scores are finite numbers, got {values}", "unparsable judge scores")
    return values
