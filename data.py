"""
data.py: rows as the real downloads hold them: training rows with hard negatives (MMEB-train, mmE5) and MMEB
evaluation rows (v1 and V2), read, checked and reported. batching.py turns the rows into model inputs.

    rows, reports = load_train_rows(["data/mmE5/mmE5-MMEB-hardneg", "data/mmE5/mmE5-synthetic",
                                     {"path": "data/MMEB-train/VisDial", "image_dir": "data/MMEB-train"}],
                                    image_dir="data/mmE5", num_hard_negatives=5, seed=0)
    rows[0]   # {"query": {"text", "image"}, "candidates": [positive, 5 negatives], "source": "file row 0"}
    rows, report = read_eval_dataset("data/MMEB-eval/ImageNet-1K", "data/eval_images")

A train_data entry is a file (.parquet / .jsonl), a subset folder, or a download's root (a folder of subset
folders), or a dict {"path": ..., "image_dir": ..., "max_rows": ...} so sources with different image roots mix in
one run (image_dir: the default image_dir; max_rows: at most this many rows of each subset, as mmE5 reads 50,000).
A folder is read through one split (mmeb.split_files: train_split 'original' by default), never every file in it.
Each row's dataset (for the instructions and the leak check) is its subset folder's name, in either spelling.

Training rows (MMEB-train / mmE5 columns): qry, qry_image_path, pos_text, pos_image_path, neg_text,
neg_image_path. Image paths are joined to image_dir as the official loaders join them (os.path.join; '' means no
image). Negatives, as mmE5 means them: neg_text and neg_image_path are lists, or strings holding a Python list
literal, or one plain string (MMEB-train), or absent; entry k pairs neg_text[k] with neg_image_path[k]. An entry
with an image and text '' is an image negative, whose text is then the positive's (mmE5's rule when every text is
'', else the first non-empty text of the list); an entry with neither is a missing negative. Each row ends with
exactly num_hard_negatives: the first ones kept (mined negatives come hardest first), missing ones filled with
candidates of other rows of the same subset (seeded). Only a row whose query or positive is empty is bad.

Bad input is an error naming the file, the row and the field, or with skip_bad_rows=True a skipped row, counted
by reason in the source's report. An image missing on disk is a bad row found here, at load time (folders are
listed once each, so a million images cost seconds, not a stat each); one that exists but does not decode is
found in a DataLoader worker (batching.TrainDataset). A row of one of MMEB's 16 out-of-distribution datasets is
an error unless allow_eval_datasets=True: it would leak a test set into training.
"""
import array
import collections
import json
import os
import random

import numpy as np
import pyarrow.parquet as pq

import mmeb
from common import Progress, UserError
from mmeb import IMAGE_MARKER, BadRow, list_field, list_literal, read_records, text_field

TRAIN_COLUMNS = ("qry", "qry_image_path", "pos_text", "pos_image_path", "neg_text", "neg_image_path", "pos_judge",
                 "neg_judge")  # the last two: a judge's scores (mine.py), read with judge=True
EVAL_COLUMNS = ("qry_text", "qry_img_path", "tgt_text", "tgt_img_path")
V2_COLUMNS = ("qry_inst", "qry_text", "qry_img_path", "tgt_inst", "tgt_text", "tgt_img_path")


# -----------------------------------------------------------------------------
# images and sides

class ImagePaths:
    """A row's image path -> the file under image_dir, which must exist. Refuses a path that leaves image_dir
    (absolute, or climbing out with ../) unless allow_outside. Existence is looked up in each folder's listing,
    read once (a folder of 100,000 images is one listdir, not 100,000 stats: seconds on a network file system)."""

    def __init__(self, image_dir, allow_outside=False):
        self.root, self.allow_outside, self.listings = os.path.abspath(image_dir or "."), allow_outside, {}

    def exists(self, path):
        folder, name = os.path.split(path)
        if folder not in self.listings:
            names = os.listdir(folder) if os.path.isdir(folder) else []
            self.listings[folder] = frozenset(name for name in names if not mmeb.is_junk(name))  # never '._' files
        return name in self.listings[folder]

    def resolve(self, value, field):
        if not isinstance(value, str):
            raise BadRow(field, f"expected a path string, got {type(value).__name__}", "not a string")
        if not value:
            return None
        path = os.path.normpath(os.path.join(self.root, value))
        if not self.allow_outside and not path.startswith(self.root.rstrip(os.sep) + os.sep):
            raise BadRow(field, f"image path {value!r} leaves image_dir {self.root} (allow_any_image_path=True "
                                "allows it)", "image path leaves image_dir")
        if not self.exists(path):
            raise BadRow(field, f"image not found: {path}", "missing image")
        return path


def empty_text(text):
    return not text.replace(IMAGE_MARKER, "").strip()


def make_side(text, image, text_name, image_name, images, reason="empty"):
    """A query or positive -> {"text", "image": a file path or None}. One with neither is a bad row."""
    path = images.resolve(image, image_name)
    if path is None and empty_text(text):
        raise BadRow(text_name, "empty: no text and no image", reason)
    return {"text": text, "image": path}


def paired(texts, paths, text_name, image_name):
    """A record's lists of texts and of image paths that go together entry by entry -> [(text, path)]; one of the
    two may be empty or absent (its entries are then ''), lists of different lengths are a bad row."""
    if texts and paths and len(texts) != len(paths):
        raise BadRow(image_name, f"{len(paths)} entries, but {text_name} has {len(texts)}", "list lengths differ")
    count = max(len(texts), len(paths))
    return list(zip(texts or [""] * count, paths or [""] * count))


def negative_sides(record, positive, images):
    """A training record's negatives, as mmE5 means them (the file docstring). -> (sides, kept entries, missing)"""
    pairs = paired(list_field(record, "neg_text"), list_field(record, "neg_image_path"), "neg_text", "neg_image_path")
    filler = next((t for t, _ in pairs if t), positive["text"])  # an image negative's text, when its own is ''
    sides, kept = [], []
    for k, (text, image) in enumerate(pairs):
        path = images.resolve(image, f"neg_image_path[{k}]")
        if path is None and empty_text(text):
            continue  # a missing negative
        sides.append({"text": (text or filler) if path else text, "image": path})
        kept.append(k)
    return sides, kept, len(pairs) - len(kept)


def judge_scores(record, kept):
    """A judged record's scores (mine.py's pos_judge, neg_judge) -> [positive's, each kept negative's], each in [0, 1]."""
    if record.get("pos_judge") is None or record.get("neg_judge") is None:
        raise BadRow("pos_judge", "no judge scores (mine.py --judge_from=... writes them)", "no judge scores")
    scores = list_literal(record["neg_judge"].strip()) if isinstance(record["neg_judge"], str) else record["neg_judge"]
    if not isinstance(scores, (list, tuple)) or not all(isinstance(v, (int, float)) for v in scores) or \
            (kept and max(kept) >= len(scores)):
        raise BadRow("neg_judge", f"expected a list of a score for each negative, got {str(record['neg_judge'])[:80]!r}",
                     "unparsable list")
    values = [float(record["pos_judge"])] + [float(scores[k]) for k in kept]
    if not all(0.0 <= v <= 1.0 for v in values):
        raise BadRow("neg_judge", f"judge scores lie in [0, 1], got {values}", "unparsable list")
    return values


class SourceReport:
    """What reading one subset (a file or a subset folder) found: the files and split read and their rows, bad
    rows by reason with the first example, negatives per row before the fill, the fill and the cut, what the
    instructions did, a leak. lines() says it; problems() says why a run would not start."""

    def __init__(self, subset, dataset, split, instructions):
        self.subset, self.dataset, self.split = subset, dataset, split
        self.files, self.bad, self.examples, self.negatives = {}, collections.Counter(), {}, collections.Counter()
        self.missing_negatives = self.filled = self.cut = 0
        self.instructions = mmeb.Instructions(instructions) if instructions else None
        self.leak, self.layout, self.failure = False, "v1", None  # leak: training rows of an MMEB OOD dataset

    @property
    def rows(self):
        return sum(self.files.values())

    @property
    def num_bad(self):
        return sum(self.bad.values())

    def bad_row(self, location, error):
        self.bad[error.reason] += 1
        self.examples.setdefault(error.reason, f"{location} {error}")

    def negative_range(self):
        """(min, median, max) of the negatives a row brought (the lower median of an even count)."""
        counts, seen = sorted(self.negatives.items()), 0
        middle = next(n for n, c in counts if (seen := seen + c) * 2 >= sum(self.negatives.values()))
        return counts[0][0], middle, counts[-1][0]

    def lines(self):
        names = ", ".join(os.path.basename(f) for f in self.files) or "-"
        lines = [f"data: {self.subset}: {self.rows:,} rows from {names} (split {self.split}; dataset "
                 f"{self.dataset or 'not one of MMEB'}, layout {self.layout})"]
        if self.negatives:
            low, middle, high = self.negative_range()
            lines.append(f"  negatives per row before the fill: min {low}, median {middle}, max {high}; "
                         f"{self.missing_negatives:,} entries with neither text nor image; {self.filled:,} rows "
                         f"filled from other rows, {self.cut:,} cut to their first ones")
        for reason, count in self.bad.most_common():
            lines.append(f"  bad rows: {count:,} {reason}, e.g. {self.examples[reason]}")
        if self.instructions and self.instructions.counts:
            lines.append(f"  instructions='{self.instructions.mode}': {self.instructions.summary()}")
        if self.leak:
            lines.append(f"  LEAK: {self.dataset} is one of MMEB's out-of-distribution evaluation datasets")
        if self.failure:
            lines.append(f"  cannot be used: {self.failure}")
        return lines

    def problems(self, skip_bad_rows, allow_eval_datasets=False):
        """Why a run would not start on this source: [] when it would."""
        problems = [self.failure] if self.failure else []
        if self.bad and not skip_bad_rows:
            problems.append(f"{self.num_bad:,} bad rows and skip_bad_rows=False")
        if self.leak and not allow_eval_datasets:
            problems.append(f"rows of {self.dataset} (allow_eval_datasets=False)")
        return problems


def read_rows(path, columns, make_row, report, skip_bad_rows, max_rows=None):
    """make_row(record) over one file -> [(location, row)]. A bad row raises, naming file, row and field, or with
    skip_bad_rows is skipped and counted in report (by reason)."""
    rows = []
    progress = Progress(None, f"data: reading {path}", "rows", every=30.0)
    for count, (location, record) in enumerate(read_records(path, columns, max_rows), 1):
        try:
            if isinstance(record, BadRow):
                raise record
            rows.append((location, make_row(record)))
        except BadRow as error:
            if not skip_bad_rows:
                raise UserError(f"{path} {location} {error}") from None
            report.bad_row(f"{path} {location}", error)
        if count % 4096 == 0:
            progress.update(4096)
    report.files[path] = len(rows)
    return rows


# -----------------------------------------------------------------------------
# training rows

def train_row(record, images, report, judged=False):
    """One MMEB-train / mmE5 record -> {"query": side, "candidates": [positive, negatives...]}, the query's text
    through the report's instructions; judged: also "judge", the judge's score of each candidate (judge_scores)."""
    query = make_side(text_field(record, "qry"), text_field(record, "qry_image_path"), "qry", "qry_image_path",
                      images, "empty query")
    if report.instructions:
        query["text"] = report.instructions(query["text"], report.dataset)
    positive = make_side(text_field(record, "pos_text"), text_field(record, "pos_image_path"), "pos_text",
                         "pos_image_path", images, "empty positive")
    negatives, kept, missing = negative_sides(record, positive, images)
    report.negatives[len(negatives)] += 1
    report.missing_negatives += missing
    row = {"query": query, "candidates": [positive] + negatives}
    return dict(row, judge=judge_scores(record, kept)) if judged else row


def fill_or_cut_negatives(rows, num_negatives, seed, subset_index, report):
    """Give each row exactly num_negatives = K negatives, in place. More than K: the first K are kept (mined
    negatives come hardest first). Fewer: the rest are drawn from the original candidates (positive or
    negatives) of other rows of the same subset, by random.Random(f"{seed}/{subset index}/{row index}"), so the
    fill depends only on the data and the seed; a draw equal to the row's own positive (the same text and
    image, e.g. a shared class label) or to one of its candidates already is rejected."""
    key = lambda side: (side["text"], side["image"])  # noqa: E731
    originals = [row["candidates"] for row in rows]  # the fill reads these, never already-filled rows
    for i, row in enumerate(rows):
        report.cut += len(row["candidates"]) > 1 + num_negatives
        candidates = row["candidates"][:1 + num_negatives]  # the positive, then the first K negatives
        if "judge" in row:  # a judged row's scores go with its candidates; the judge never saw a filled one
            row["judge"] = row["judge"][:1 + num_negatives]
            if len(candidates) < 1 + num_negatives:
                raise UserError(f"{row['source']}: {len(candidates) - 1} judged negatives, num_hard_negatives="
                                f"{num_negatives} needed: mine with --num_hard_negatives={num_negatives} or more")
        if len(candidates) < 1 + num_negatives:
            report.filled += 1
            rng = random.Random(f"{seed}/{subset_index}/{i}")
            taken = {key(c) for c in candidates}
            for _ in range(100 * num_negatives):
                if len(candidates) == 1 + num_negatives or len(rows) < 2:
                    break
                j = rng.randrange(len(rows))
                drawn = originals[j][rng.randrange(len(originals[j]))]
                if j != i and key(drawn) not in taken:
                    taken.add(key(drawn))
                    candidates.append(drawn)
            if len(candidates) < 1 + num_negatives:
                raise UserError(f"{report.subset}: cannot fill {row['source']} to {num_negatives} hard negatives; "
                                f"the subset has too few distinct candidates ({len(rows)} rows)")
        row["candidates"] = candidates


def train_entries(train_data, image_dir):
    """train_data -> [{"path", "image_dir", "max_rows"}]: a path, a dict, or a list of them."""
    entries = [train_data] if isinstance(train_data, (str, os.PathLike, dict)) else list(train_data)
    out = []
    for entry in entries:
        if isinstance(entry, (str, os.PathLike)):
            entry = {"path": entry}
        if not isinstance(entry, dict) or "path" not in entry or set(entry) - {"path", "image_dir", "max_rows"}:
            raise UserError(f"train_data entry {entry!r}: expected a path, or a dict with 'path' and optionally "
                            "'image_dir' and 'max_rows', e.g. {'path': 'data/MMEB-train/VisDial', 'max_rows': 50000}")
        out.append({"path": os.fspath(entry["path"]), "image_dir": entry.get("image_dir") or image_dir,
                    "max_rows": entry.get("max_rows")})
    return out


def load_train_rows(train_data, image_dir, num_hard_negatives=5, seed=0, skip_bad_rows=False,
                    allow_any_image_path=False, instructions=None, train_split="original",
                    allow_eval_datasets=False, check=False, judged=False):
    """Training rows of every subset of every entry (the file docstring), each with exactly num_hard_negatives
    negatives. instructions: 'paper', 'dataset' or None (no rewrite). check: read everything and report instead
    of stopping at the first problem (bad rows are counted, leaks and failures recorded): what --check_data does.
    judged: every row must carry a judge's scores (mine.py), kept as rows[i]["judge"] beside its candidates.
    -> (PackedRows; rows[i] = {"query", "candidates": [positive, K negatives], "source": "file row 7"},
        [SourceReport per subset])"""
    packed, reports = PackedRows(), []
    for entry in train_entries(train_data, image_dir):
        images = ImagePaths(entry["image_dir"], allow_any_image_path)
        for dataset, subset, files, split in mmeb.train_subsets(entry["path"], train_split):
            report = SourceReport(subset, dataset, split, instructions)
            report.leak = dataset in mmeb.OOD_DATASETS
            reports.append(report)
            if report.leak and not (allow_eval_datasets or check):
                raise UserError(f"train_data: {subset} holds rows of {dataset}, one of MMEB's 16 out-of-distribution "
                                "evaluation datasets (early MMEB-train revisions carry FashionIQ, ImageNet-A, "
                                "ImageNet-R, ScienceQA, Visual7W-pointing): training on it leaks its test set. Leave "
                                "it out, or set allow_eval_datasets=True")
            try:
                rows = []
                for path in files:
                    left = None if entry["max_rows"] is None else entry["max_rows"] - len(rows)
                    if left is None or left > 0:
                        for location, row in read_rows(path, TRAIN_COLUMNS, lambda r: train_row(r, images, report,
                                                       judged), report, skip_bad_rows or check, left):
                            row["source"] = f"{path} {location}"
                            rows.append(row)
                if not rows and not report.bad:
                    raise UserError(f"{subset}: no rows in it")
                if rows:  # (a subset whose every row was bad and skipped is reported, and adds nothing)
                    fill_or_cut_negatives(rows, num_hard_negatives, seed, len(reports) - 1, report)
            except UserError as error:
                if not check:
                    raise
                report.failure, rows = str(error), []
            print("\n".join(report.lines()), flush=True)
            packed.extend(rows)
            del rows  # a subset's row dicts are the peak of the load: one subset at a time
        images.listings.clear()  # the folder listings: memory no longer needed
    return packed.finish(), reports


class PackedRows:
    """Rows as one buffer of JSON and an offsets array: two objects in all, so forked DataLoader workers share
    them instead of copying per-row objects touched by reference counts, and 2M rows cost about their JSON size in
    memory (bench: --sections=startup). extend() appends rows while loading; finish() freezes them."""

    def __init__(self):
        self.buffer, self.offsets = bytearray(), array.array("q", [0])

    def extend(self, rows):
        for row in rows:
            self.buffer += json.dumps(row).encode()
            self.offsets.append(len(self.buffer))

    def finish(self):
        self.offsets = np.frombuffer(self.offsets, dtype=np.int64)  # (N + 1,), no copy
        return self

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return json.loads(self.buffer[self.offsets[i]:self.offsets[i + 1]])


# -----------------------------------------------------------------------------
# evaluation rows

def eval_row(record, images, report, v2):
    """One MMEB-eval record (v1, or V2 with its instruction columns joined as VLM2Vec-V2 joins them) ->
    {"query": side, "candidates": [gold, others...]}."""
    query_image = text_field(record, "qry_img_path")
    query_text = text_field(record, "qry_text")
    candidate_texts = list_field(record, "tgt_text", required=True)
    candidate_images = list_field(record, "tgt_img_path", required=True)
    if v2:
        kind = mmeb.v2_kind(report.dataset, bool(query_image), query_text)
        query_text = mmeb.v2_query(kind, report.dataset, text_field(record, "qry_inst"), query_text)
        candidate_texts = mmeb.v2_candidates(kind, text_field(record, "tgt_inst"), candidate_texts)
    query = make_side(query_text, query_image, "qry_text", "qry_img_path", images, "empty query")
    candidates = [make_side(t, i, f"tgt_text[{k}]", f"tgt_img_path[{k}]", images, "empty candidate")
                  for k, (t, i) in enumerate(paired(candidate_texts, candidate_images, "tgt_text", "tgt_img_path"))]
    if len(candidates) < 2:
        raise BadRow("tgt_text", f"{len(candidates)} candidates: at least the gold and one other needed",
                     "too few candidates")
    if report.instructions:
        query["text"] = report.instructions(query["text"], report.dataset)
    return {"query": query, "candidates": candidates}


def read_eval_dataset(folder, image_dir, skip_bad_rows=False, instructions=None, allow_any_image_path=False,
                      check=False):
    """One evaluation dataset folder (Parquet files directly or in subfolders) -> (rows, SourceReport); rows[i] =
    {"query": side, "candidates": [side, ...]}, candidate 0 the gold one. The layout (v1, or V2 with qry_inst /
    tgt_inst columns) is read from the first file's columns and named in the report. Every image is checked to
    exist; a row with a single candidate would be a free hit and is a bad row too."""
    folder = os.fspath(folder)
    files = mmeb.eval_files(folder)
    if not files:
        raise UserError(f"no .parquet files under {folder}")
    name = os.path.basename(os.path.normpath(folder))
    report = SourceReport(folder, mmeb.canonical_name(name) or name, "test", instructions)
    v2 = "qry_inst" in pq.ParquetFile(files[0]).schema_arrow.names
    report.layout = "V2" if v2 else "v1"
    images = ImagePaths(image_dir, allow_any_image_path)
    rows = []
    for path in files:
        rows += [row for _, row in read_rows(path, V2_COLUMNS if v2 else EVAL_COLUMNS,
                                             lambda r: eval_row(r, images, report, v2), report, skip_bad_rows or check)]
    return rows, report
