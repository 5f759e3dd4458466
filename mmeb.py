"""
mmeb.py: the MMEB benchmark: its 36 datasets, their task formats and instructions, and its evaluation files.

    names = find_mmeb_datasets("MMEB-eval")                        # dataset folders, checked
    rows = read_mmeb_dataset("MMEB-eval/ImageNet-1K", "MMEB-eval/images", instructions=Instructions("paper"))
    meta_task, split = MMEB_DATASETS["ImageNet-1K"]               # ("Classification", "IND")

MMEB-eval (TIGER-Lab/MMEB-eval): one folder per dataset of Parquet rows with `qry_text`, `qry_img_path`,
`tgt_text` (list) and `tgt_img_path` (list), candidate 0 the gold one. MMEB-train (TIGER-Lab/MMEB-train) is
read by data.load_train_rows; its 20 subsets are the in-distribution (IND) datasets here.

Instructions (paper, Appendix A.2 and Table 5). A MMEB query reads "[<|image_1|>\n]INSTRUCTION[ text]\n",
the instruction its dataset's own. The paper writes one instruction per task format instead:
    VQA and classification   "Represent the given image to answer the following question."
    text -> image retrieval  "Retrieve an image that best matches the following description."
    image -> text retrieval  "Find the caption that best describes this image."
    composed retrieval       "Find an image matching the described changes."
instructions="paper" swaps a row's own instruction for its format's, keeping the marker and the rest of the
text; "dataset" keeps every row as it is. A dataset's format is set by what its query and candidates hold:
text queries for images are text -> image (VisDial, VisualNews_t2i, MSCOCO_t2i, WebQA, EDIS, Wiki-SS-NQ), an
image with a change for an image is composed (CIRR, FashionIQ). Table 5 has no row for grounding (MSCOCO,
RefCOCO, RefCOCO-Matching, Visual7W-Pointing), image -> image (NIGHTS) or image+text -> image+text (OVEN):
those keep their own instruction, which for grounding holds the object's label in its sentence.
"""
import collections
import functools
import glob
import os

import data

# name (as the MMEB-eval folder) -> (meta task, split, task format, the dataset's own query instruction)
_ = None
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
    "MSCOCO": ("Visual Grounding", "IND", "grounding", _),  # MMEB-train and MMEB-eval word it differently
    "RefCOCO": ("Visual Grounding", "OOD", "grounding", _),
    "RefCOCO-Matching": ("Visual Grounding", "OOD", "grounding", _),
    "Visual7W-Pointing": ("Visual Grounding", "OOD", "grounding", _),
}
MMEB_DATASETS = {name: row[:2] for name, row in MMEB_TABLE.items()}  # name -> (meta task, split)
TRAIN_NAMES = {"ImageNet_1K": "ImageNet-1K"}  # MMEB-train subsets spelt otherwise than the MMEB-eval folders
PAPER_INSTRUCTIONS = {  # Table 5
    "VQA": "Represent the given image to answer the following question.",
    "classification": "Represent the given image to answer the following question.",
    "text->image": "Retrieve an image that best matches the following description.",
    "image->text": "Find the caption that best describes this image.",
    "composed": "Find an image matching the described changes.",
}


@functools.lru_cache(maxsize=None)
def dataset_of(path):
    """The MMEB dataset a file or folder belongs to: its name (a file's without the suffix), its folder's or the one
    above, the nearest naming one, else None. 'MMEB-train/ImageNet_1K/original-00000.parquet' -> 'ImageNet-1K'."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    for part in reversed(parts[-3:-1] + [os.path.splitext(parts[-1])[0]]):  # the name, its folder and theirs
        name = TRAIN_NAMES.get(part, part)
        if name in MMEB_TABLE:
            return name
    return None


class Instructions:
    """Rewrites a query's instruction (the file docstring says how): Instructions("paper") or ("dataset").
    instructions(text, path) -> text, path being the row's file or dataset folder (dataset_of reads the dataset
    from it); `counts` says what happened to how many rows, summary() in words."""

    def __init__(self, mode="paper"):
        if mode not in ("paper", "dataset"):
            raise ValueError(f"instructions must be 'paper' or 'dataset', got {mode!r}")
        self.mode, self.counts = mode, collections.Counter()

    def __call__(self, text, path):
        if self.mode == "dataset":
            return text
        dataset = dataset_of(path)
        if dataset not in MMEB_TABLE:
            self.counts["unknown dataset"] += 1
            return text
        task_format, own = MMEB_TABLE[dataset][2:]
        if task_format not in PAPER_INSTRUCTIONS:
            self.counts["no Table 5 row"] += 1
            return text
        marker = data.IMAGE_MARKER + "\n"
        head = marker if text.startswith(marker) else ""
        if not text[len(head):].startswith(own):
            self.counts["instruction not found"] += 1
            return text
        self.counts["rewritten"] += 1
        return head + PAPER_INSTRUCTIONS[task_format] + text[len(head) + len(own):]

    def summary(self):
        """'rewritten 1000, unknown dataset 50' (empty when nothing was counted or mode is 'dataset')."""
        return ", ".join(f"{what} {count:,}" for what, count in self.counts.most_common())


def find_mmeb_datasets(mmeb_dir, image_dir=""):
    """Sorted names of the dataset folders of mmeb_dir: every folder but hidden ones and image folders (image_dir
    itself or one holding image files). -> (names with Parquet files, names without any: empty datasets)."""
    image_root = os.path.abspath(image_dir) if image_dir else None
    names, empty = [], []
    for name in sorted(os.listdir(mmeb_dir)):
        folder = os.path.join(mmeb_dir, name)
        if name.startswith(".") or not os.path.isdir(folder) or os.path.abspath(folder) == image_root:
            continue
        if parquet_files(folder):
            names.append(name)
        elif name in MMEB_TABLE or not any(f.lower().endswith((".jpg", ".jpeg", ".png", ".zip"))
                                           for _, _, files in os.walk(folder) for f in files):
            empty.append(name)  # a MMEB dataset's folder is never taken for an image folder
    return names, empty


def parquet_files(folder):
    return sorted(glob.glob(os.path.join(glob.escape(os.fspath(folder)), "**", "*.parquet"), recursive=True))


def read_mmeb_dataset(dataset_dir, image_dir, skip_bad_rows=False, instructions=None, allow_any_image_path=False):
    """One MMEB-eval dataset folder (Parquet files directly or in subfolders) -> data.Rows of
    {"query": {"text", "image"}, "candidates": [{"text", "image"}, ...]}, candidate 0 the gold one. Every image
    file is checked to exist here, so a missing one is an error naming file, row and field (or a skipped row);
    a row with a single candidate would be a free hit and is a bad row too. instructions: an Instructions."""
    files = parquet_files(dataset_dir)
    if not files:
        raise FileNotFoundError(f"no .parquet files under {dataset_dir}")
    images = data.ImagePaths(image_dir, allow_any_image_path, check_exists=True)

    def mmeb_row(record):
        query = data.make_side(data.text_field(record, "qry_text"), data.text_field(record, "qry_img_path"),
                               "qry_text", "qry_img_path", images)
        candidates = data.make_sides(data.list_field(record, "tgt_text", required=True),
                                     data.list_field(record, "tgt_img_path", required=True),
                                     "tgt_text", "tgt_img_path", images)
        if len(candidates) < 2:
            raise data.BadRow("tgt_text", f"{len(candidates)} candidates: at least the gold and one other needed")
        if instructions:
            query["text"] = instructions(query["text"], os.fspath(dataset_dir))
        return {"query": query, "candidates": candidates}

    rows = data.Rows()
    for path in files:
        read, skipped = data.read_rows(path, ("qry_text", "qry_img_path", "tgt_text", "tgt_img_path"), mmeb_row,
                                       skip_bad_rows)
        rows.extend(row for _, row in read)
        rows.skipped += skipped
    return rows
