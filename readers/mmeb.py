"""
readers/mmeb.py: what this project knows of MMEB: the 36 datasets (meta task, split, task format, own
instruction), their spellings, the paper's instructions (Table 5), how MMEB-V2 joins its instruction columns into
the texts, and Table 8's means. readers/records.py knows how the downloads write their rows.

    meta_task, split = MMEB_DATASETS["ImageNet-1K"]               # ("Classification", "IND")
    canonical_name("ImageNet_1K")                                  # 'ImageNet-1K' (MMEB-train spells it so)
    aggregate(per_dataset)                                         # Table 8's meta-task, IND, OOD and overall means

The downloads (docs/data.md):
- MMEB-eval (TIGER-Lab/MMEB-eval): 37 folders, the 36 MMEB datasets and CIFAR-100, each <Subset>/test-*.parquet
  with qry_text, qry_img_path, tgt_text (list), tgt_img_path (list), candidate 0 the gold one; image paths
  <Subset>/<file> relative to where images.zip was unzipped.
- MMEB-train (TIGER-Lab/MMEB-train): 20 subset folders, each with three files: original-00000-of-00001.parquet
  (what VLM2Vec and mmE5 train on), diverse_instruction-... (paraphrased instructions) and a legacy train-...;
  image paths images/<Subset>/Train/<file> relative to the download's root.
- mmE5-MMEB-hardneg (24 subset folders) and mmE5-synthetic (Classification/, Retrieval/, VQA/): one split each
  ("train"); negatives are strings holding Python list literals (readers/records.py); image paths images/... relative to
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
import collections
import os

from common import UserError
from media import IMAGE_MARKER

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
