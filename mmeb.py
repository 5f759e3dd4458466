"""
mmeb.py: what this project knows of MMEB and of the real downloads: the 36 datasets (meta task, split, task
format, own instruction), their spellings, the paper's instructions (Table 5), which files of a download hold the
rows, how their records and list fields are written (Parquet or JSON Lines; lists or Python list literals), how
MMEB-V2 joins its instruction columns into the texts, and Table 8's means. data.py makes rows of the records.

    meta_task, split = MMEB_DATASETS["ImageNet-1K"]               # ("Classification", "IND")
    canonical_name("ImageNet_1K")                                  # 'ImageNet-1K' (MMEB-train spells it so)
    train_subsets("data/MMEB-train", split="original")           # 20 subset folders, each its original-*.parquet
    names, empty = find_eval_datasets("data/MMEB-eval")           # the dataset folders of an MMEB-eval download

The downloads (README, "The data"):
- MMEB-eval (TIGER-Lab/MMEB-eval): 37 folders, the 36 MMEB datasets and CIFAR-100, each <Subset>/test-*.parquet
  with qry_text, qry_img_path, tgt_text (list), tgt_img_path (list), candidate 0 the gold one; image paths
  <Subset>/<file> relative to where images.zip was unzipped.
- MMEB-train (TIGER-Lab/MMEB-train): 20 subset folders, each with three files: original-00000-of-00001.parquet
  (what VLM2Vec and mmE5 train on), diverse_instruction-... (paraphrased instructions) and a legacy train-...;
  image paths images/<Subset>/Train/<file> relative to the download's root.
- mmE5-MMEB-hardneg (24 subset folders) and mmE5-synthetic (Classification/, Retrieval/, VQA/): one split each
  ("train"); negatives are strings holding Python list literals (data.py); image paths images/... relative to
  the folder where their archives were extracted.
- MMEB-V2 image tasks: qry_inst, qry_text, qry_img_path, tgt_inst, tgt_text, tgt_img_path; the instructions are
  joined into the texts as VLM2Vec-V2 joins them (v2_query, v2_candidates), which reproduces the v1 strings.

Instructions (paper, Appendix A.2 and Table 5). A MMEB query reads "[<|image_1|>\\n]INSTRUCTION[ text]\\n", the
instruction its dataset's own. The paper writes one instruction per task format instead (PAPER_INSTRUCTIONS);
instructions="paper" swaps a row's own instruction for its format's, keeping the marker and the rest of the text;
"dataset" keeps every row as it is. Table 5 has no row for grounding (MSCOCO, RefCOCO, RefCOCO-Matching,
Visual7W-Pointing), image -> image (NIGHTS) or image+text -> image+text (OVEN): those keep their own instruction,
which for grounding holds the object's label in its sentence.
"""
import ast
import collections
import functools
import glob
import json
import os
import re

import pyarrow.parquet as pq

from common import UserError

IMAGE_MARKER = "<|image_1|>"  # in MMEB / mmE5 text: where the side's image goes
IMAGE_CANDIDATE = IMAGE_MARKER + "\nRepresent the given image."  # MMEB's text beside an image candidate
GROUNDING_OWN = None  # MMEB-train and MMEB-eval word the grounding instructions differently: none to swap

TRAIN_SUBSETS = ("A-OKVQA", "CIRR", "ChartQA", "DocVQA", "HatefulMemes", "ImageNet_1K", "InfographicsVQA", "MSCOCO",
                 "MSCOCO_i2t", "MSCOCO_t2i", "N24News", "NIGHTS", "OK-VQA", "SUN397", "VOC2007", "VisDial", "Visual7W",
                 "VisualNews_i2t", "VisualNews_t2i", "WebQA")  # MMEB-train's 20 subset folders, in its spellings

# name (as the MMEB-eval folder) -> (meta task, split, task format, the dataset's own query instruction)
MMEB_TABLE = {
    "ImageNet-1K": ("Classification", "IND", "classification", "Represent the given image for classification"),
    "N24News": ("Classification", "IND", "classification",
                "Represent the given news image with the following caption for domain classification:"),
    "HatefulMemes": ("Classification", "IND", "classification", "Represent the given image for binary "
                     "classification to determine whether it constitutes hateful speech or not"),
    "VOC2007": ("Classification", "IND", "classification", "Identify the object shown in the image"),
    "SUN397": ("Classification", "IND", "classification", "Identify the scene shown in the image"),
    "Place365": ("Classification", "OOD", "classification", "Identify the scene shown in the image"),
    "ImageNet-A": ("Classification", "OOD", "classification", "Represent the given image for classification"),
    "ImageNet-R": ("Classification", "OOD", "classification", "Represent the given image for classification"),
    "ObjectNet": ("Classification", "OOD", "classification", "Identify the object shown in the image"),
    "Country211": ("Classification", "OOD", "classification", "Identify the country depicted in the image"),
    **{name: ("VQA", split, "VQA", "Represent the given image with the following question:")
       for name, split in [("OK-VQA", "IND"), ("A-OKVQA", "IND"), ("DocVQA", "IND"), ("InfographicsVQA", "IND"),
                           ("ChartQA", "IND"), ("Visual7W", "IND"), ("ScienceQA", "OOD"), ("VizWiz", "OOD"),
                           ("GQA", "OOD"), ("TextVQA", "OOD")]},
    "VisDial": ("Retrieval", "IND", "text->image",
                "Represent the given dialogue about an image, which is used for image retrieval:"),
    "CIRR": ("Retrieval", "IND", "composed", "Given an image, find a similar everyday image with the described changes:"),
    "VisualNews_t2i": ("Retrieval", "IND", "text->image", "Retrieve an image of this news caption."),
    "VisualNews_i2t": ("Retrieval", "IND", "image->text", "Find a caption for the news in the given photo."),
    "MSCOCO_t2i": ("Retrieval", "IND", "text->image", "Find me an everyday image that matches the given caption:"),
    "MSCOCO_i2t": ("Retrieval", "IND", "image->text", "Find an image caption describing the given everyday image."),
    "NIGHTS": ("Retrieval", "IND", "image->image", "Find a day-to-day image that looks similar to the provided image."),
    "WebQA": ("Retrieval", "IND", "text->image", "Find a Wikipedia image that answers this question:"),
    "OVEN": ("Retrieval", "OOD", "image+text->image+text",
             "Retrieve a Wikipedia image-description pair that provides evidence for the question of this image:"),
    "FashionIQ": ("Retrieval", "OOD", "composed", "Find an image to match the fashion image and style note:"),
    "EDIS": ("Retrieval", "OOD", "text->image", "Find a news image that matches the provided caption:"),
    "Wiki-SS-NQ": ("Retrieval", "OOD", "text->image", "Find the document image that can answer the given query:"),
    "MSCOCO": ("Visual Grounding", "IND", "grounding", GROUNDING_OWN),
    "RefCOCO": ("Visual Grounding", "OOD", "grounding", GROUNDING_OWN),
    "RefCOCO-Matching": ("Visual Grounding", "OOD", "grounding", GROUNDING_OWN),
    "Visual7W-Pointing": ("Visual Grounding", "OOD", "grounding", GROUNDING_OWN),
}
MMEB_DATASETS = {name: row[:2] for name, row in MMEB_TABLE.items()}  # name -> (meta task, split)
OOD_DATASETS = sorted(name for name, (_, split) in MMEB_DATASETS.items() if split == "OOD")  # the 16 never to train on
META_TASKS = ("Classification", "VQA", "Retrieval", "Visual Grounding")
PAPER_INSTRUCTIONS = {  # Table 5
    "VQA": "Represent the given image to answer the following question.",
    "classification": "Represent the given image to answer the following question.",
    "text->image": "Retrieve an image that best matches the following description.",
    "image->text": "Find the caption that best describes this image.",
    "composed": "Find an image matching the described changes.",
}


def spelling(name):
    """The form two spellings of one dataset share: MMEB-train writes ImageNet_1K and Visual7W-pointing where
    MMEB-eval writes ImageNet-1K and Visual7W-Pointing."""
    return name.lower().replace("_", "-")


CANONICAL = {spelling(name): name for name in MMEB_TABLE}


def canonical_name(name):
    """A folder or file name -> the MMEB dataset it names (MMEB-eval's spelling), or None."""
    return CANONICAL.get(spelling(name))


def dataset_of(path):
    """The MMEB dataset a file or folder belongs to: its name (a file's without the suffix), its folder's or the one
    above, the nearest naming one, else None. 'MMEB-train/ImageNet_1K/original-00000.parquet' -> 'ImageNet-1K'."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    for part in reversed(parts[-3:-1] + [os.path.splitext(parts[-1])[0]]):  # the name, its folder and theirs
        if name := canonical_name(part):
            return name
    return None


class Instructions:
    """Rewrites a query's instruction (the file docstring says how): Instructions("paper") or ("dataset").
    instructions(text, dataset) -> text, dataset an MMEB name or None; `counts` says what happened to how many
    queries: rewritten, kept (their dataset has no Table 5 row, or the text does not start with its dataset's own
    instruction), or not of an MMEB dataset (kept); summary() in words."""

    def __init__(self, mode="paper"):
        if mode not in ("paper", "dataset"):
            raise UserError(f"instructions must be 'paper' or 'dataset', got {mode!r}")
        self.mode, self.counts = mode, collections.Counter()

    def __call__(self, text, dataset):
        if self.mode == "dataset":
            self.counts["kept (instructions='dataset')"] += 1
            return text
        if dataset not in MMEB_TABLE:
            self.counts["not of an MMEB dataset (kept)"] += 1
            return text
        task_format, own = MMEB_TABLE[dataset][2:]
        if task_format not in PAPER_INSTRUCTIONS:
            self.counts["kept (no Table 5 row)"] += 1
            return text
        marker = IMAGE_MARKER + "\n"
        head = marker if text.startswith(marker) else ""
        if not text[len(head):].startswith(own):
            self.counts["kept (instruction not found)"] += 1
            return text
        self.counts["rewritten"] += 1
        return head + PAPER_INSTRUCTIONS[task_format] + text[len(head) + len(own):]

    def summary(self):
        """'1,000 rewritten, 50 not of an MMEB dataset (kept)' (empty when nothing was counted)."""
        return ", ".join(f"{count:,} {what}" for what, count in self.counts.most_common())


# -----------------------------------------------------------------------------
# MMEB-V2: its instruction columns joined into the texts as VLM2Vec-V2's image parsers join them (the parser's
# own comments say this reproduces the v1 strings). IMAGE_MARKER stands where V2 puts the backbone's image token.

def v2_kind(dataset, has_query_image, query_text):
    """Which VLM2Vec-V2 parser reads a dataset: 'cls' (classification, image -> text), 'qa' (VQA), 't2i' (text ->
    image) or 'i2i' (composed, image -> image, grounding, OVEN). A dataset MMEB does not know is read by what its
    row holds: an image query with text as 'qa', without as 'cls', a text query as 't2i'."""
    task_format = MMEB_TABLE[dataset][2] if dataset in MMEB_TABLE else None
    if task_format in ("classification", "image->text"):
        return "cls"
    if task_format == "VQA":
        return "qa"
    if task_format == "text->image":
        return "t2i"
    if task_format is not None:
        return "i2i"
    return ("qa" if query_text else "cls") if has_query_image else "t2i"


def v2_query(kind, dataset, instruction, text):
    """A V2 row's query string from qry_inst and qry_text."""
    if kind == "t2i":
        return instruction + " " + text + "\n" + ("\n" if dataset == "VisDial" else "")
    instruction = instruction.replace(IMAGE_MARKER, "")
    if kind != "cls":
        instruction = "\n" + instruction.strip()
    return (IMAGE_MARKER + " " + instruction + (" " + text if text else "")).replace(" \n", "\n") + "\n"


def v2_candidates(kind, instruction, texts):
    """A V2 row's candidate strings from tgt_inst and tgt_text: the raw texts for 'cls' and 'qa'; else an image
    candidate's instruction, with its caption where the row has captions."""
    if kind in ("cls", "qa"):
        return list(texts)
    instruction = instruction.replace(IMAGE_MARKER, "")
    if texts and texts[0].strip():
        return [(IMAGE_MARKER + " " + instruction + " " + caption).replace(" \n", "\n") + "\n" for caption in texts]
    alone = (IMAGE_MARKER + " " + instruction).replace(" \n", "\n") + ("\n" if kind == "t2i" else "")
    return [alone] * len(texts)


# -----------------------------------------------------------------------------
# which files of a download hold the rows

DATA_SUFFIXES = (".parquet", ".jsonl")
SPLIT_FILE = re.compile(r"(?P<split>[A-Za-z_]+)-\d{5}-of-\d{5}\.(parquet|jsonl)$")  # Hugging Face's shard names


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


def train_subsets(path, split):
    """A train_data path -> [(dataset name or None, subset folder or file, [files], split read)]: a file is one
    subset; a folder with data files is a subset folder (split_files); a folder of such folders is a download's
    root, each subfolder with data files a subset (folders without, such as images/ or images_zip/, are passed
    over). The dataset is the subset's name when it is an MMEB dataset (either spelling), else dataset_of(path)."""
    if not os.path.exists(path):
        raise UserError(f"train_data: {path} does not exist")
    if os.path.isfile(path):
        if not path.endswith(DATA_SUFFIXES):
            raise UserError(f"train_data: {path}: unknown file type, expected .parquet or .jsonl")
        return [(dataset_of(path), path, [path], "(a file)")]
    if files := data_files(path):
        files, read = split_files(path, split, files)
        return [(dataset_of(path), path, files, read)]
    subsets = []
    for name in sorted(os.listdir(path)):
        folder = os.path.join(path, name)
        if not is_junk(name) and os.path.isdir(folder) and (files := data_files(folder)):
            files, read = split_files(folder, split, files)
            subsets.append((canonical_name(name) or dataset_of(folder), folder, files, read))
    if not subsets:
        raise UserError(f"train_data: {path} holds no .parquet or .jsonl files, nor folders of them")
    return subsets


def eval_files(folder):
    """An evaluation dataset folder's Parquet files, directly or in subfolders (Hugging Face's refs/convert/parquet
    branch nests them in test/), sorted."""
    paths = glob.glob(os.path.join(glob.escape(os.fspath(folder)), "**", "*.parquet"), recursive=True)
    return sorted(p for p in paths if not is_junk(os.path.basename(p)))


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def find_eval_datasets(mmeb_dir, image_dir=""):
    """Sorted names of the dataset folders of mmeb_dir: every folder but hidden ones and image folders (image_dir
    itself or one holding image files). -> (names with Parquet files, names without any: empty datasets)."""
    if not os.path.isdir(mmeb_dir):
        raise UserError(f"mmeb_dir: {mmeb_dir} is not a folder")
    image_root = os.path.abspath(image_dir) if image_dir else None
    names, empty = [], []
    for name in sorted(os.listdir(mmeb_dir)):
        folder = os.path.join(mmeb_dir, name)
        if is_junk(name) or not os.path.isdir(folder) or os.path.abspath(folder) == image_root:
            continue
        if eval_files(folder):
            names.append(name)
        elif name in MMEB_TABLE or not any(f.lower().endswith(IMAGE_SUFFIXES + (".zip",)) and not is_junk(f)
                                           for _, _, files in os.walk(folder) for f in files):
            empty.append(name)  # a MMEB dataset's folder is never taken for an image folder
    return names, empty


# -----------------------------------------------------------------------------
# how the downloads write their rows: Parquet or JSON Lines records, list fields as lists or list literals

class BadRow(UserError):
    """One row's problem: the field it is in and its reason (counted by reason). Becomes an error naming the file
    and row, or a skip."""

    def __init__(self, field, problem, reason):
        super().__init__(f"field {field!r}: {problem}")
        self.reason = reason


def read_records(path, columns, max_rows=None):
    """(location, record) of each row of a .jsonl or .parquet file, at most max_rows of them. A line that is not
    UTF-8 JSON comes as (location, BadRow) so the caller can raise or skip it."""
    count = 0
    if path.endswith(".jsonl"):
        with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is one bad row, not a crash
            for line_number, line in enumerate(f, 1):
                if max_rows is not None and count >= max_rows:
                    return
                if not line.strip():
                    continue
                count += 1
                try:
                    record = json.loads(line.decode("utf-8"))
                    if not isinstance(record, dict):
                        raise ValueError("not a JSON object")
                except UnicodeDecodeError as error:
                    record = BadRow("<line>", f"not UTF-8 text ({error.reason} at byte {error.start})", "not UTF-8 JSON")
                except (ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
                    record = BadRow("<line>", f"not a JSON object: {str(error)[:120]}", "not UTF-8 JSON")
                yield f"line {line_number}", record
        return
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
    """A list column -> list of str: a list, a list written as a string (a Python literal, as mmE5 writes it, or
    JSON), or one plain string (one entry); empty, null or absent is no entries."""
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
        if not value.lstrip().startswith("["):
            return [value]
        value = list_literal(value.strip())
        if value is None:
            raise BadRow(field, f"cannot parse {record[field][:80]!r} as a list", "unparsable list")
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
# the scores as the paper's Table 8 has them

META_TASK_WORDS = {"CLS": "Classification", "VQA": "VQA", "T2I": "Retrieval", "I2T": "Retrieval",
                   "RET": "Retrieval", "GRD": "Visual Grounding"}  # last word of a dataset name MMEB does not know


def dataset_group(name):
    """-> (meta task, 'IND' | 'OOD') of a dataset folder name: MMEB's own for its 36; for another (the toy's, a
    user's) OOD when the name ends in '-OOD', the meta task from the last word before that (CLS, VQA, T2I / I2T /
    RET, GRD), else 'Other'."""
    if name in MMEB_DATASETS:
        return MMEB_DATASETS[name]
    split = "OOD" if name.endswith("-OOD") else "IND"
    base = name[:-len("-OOD")] if split == "OOD" else name
    return META_TASK_WORDS.get(base.replace("_", "-").split("-")[-1].upper(), "Other"), split


def mean(values):
    return sum(values) / len(values) if values else None


def aggregate(per_dataset, key="precision_at_1"):
    """{name: {key, "meta_task", "split", ...}} -> {"meta_tasks": {task: mean}, "IND", "OOD", "overall"}: each an
    unweighted mean over its datasets, as in Table 8 (None when empty). Call it on one family at a time: MMEB's
    datasets, or the others, never both mixed."""
    tasks = [t for t in META_TASKS if any(r["meta_task"] == t for r in per_dataset.values())]
    tasks += sorted({r["meta_task"] for r in per_dataset.values()} - set(META_TASKS))
    scores = lambda keep: [r[key] for r in per_dataset.values() if keep(r)]  # noqa: E731
    return {"meta_tasks": {t: mean(scores(lambda r: r["meta_task"] == t)) for t in tasks},
            "IND": mean(scores(lambda r: r["split"] == "IND")), "OOD": mean(scores(lambda r: r["split"] == "OOD")),
            "overall": mean(scores(lambda r: True))}


def format_table(per_dataset, title):
    """Table 8's shape for one family of datasets: datasets by meta task (OOD marked *), meta-task means and the
    final score, strict P@1 and beside it the official argmax reading. title: what the final score is."""
    number = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    summary, argmax = aggregate(per_dataset), aggregate(per_dataset, "precision_at_1_argmax")
    lines = [f"{'dataset':<28}{'P@1':>7}{'argmax':>8}{'queries':>9}{'ties':>7}{'candidates':>12}"]
    for task, task_mean in summary["meta_tasks"].items():
        names = [n for n, r in per_dataset.items() if r["meta_task"] == task]
        lines.append(f"{task} ({len(names)} datasets)")
        for name in names:
            r = per_dataset[name]
            label, (low, high) = name + ("*" if r["split"] == "OOD" else ""), r.get("candidates", ("-", "-"))
            lines.append(f"  {label:<26}{number(r['precision_at_1']):>7}{number(r.get('precision_at_1_argmax')):>8}"
                         f"{r['num_queries']:>9}{r['ties']:>7}{low if low == high else f'{low}-{high}':>12}")
        lines.append(f"{'All ' + task:<28}{number(task_mean):>7}{number(argmax['meta_tasks'][task]):>8}")
    lines.append(title)
    for label, key in (("All IND", "IND"), ("All OOD", "OOD"), ("All", "overall")):
        lines.append(f"{label:<28}{number(summary[key]):>7}{number(argmax[key]):>8}")
    return "\n".join(lines)
