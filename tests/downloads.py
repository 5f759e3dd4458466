"""
The real downloads in miniature, for tests/test_downloads.py: the file trees, file names, columns, column types
and string forms of TIGER-Lab/MMEB-eval, TIGER-Lab/MMEB-train, intfloat/mmE5-MMEB-hardneg, intfloat/mmE5-synthetic
and the MMEB-V2 image tasks, as a user has them after the download and unzip commands of the README, each with a
few rows. What the dataset cards and the official loaders confirm is copied as it is; what is only inferred is
marked so below, and the reader is tested on both answers where they differ (the hardneg file names).

    root = mmeb_eval(tmp_path)            # tmp/data/MMEB-eval/<37 folders>/test-00000-of-00001.parquet,
                                          # tmp/data/eval_images/<Subset>/... (unzip images.zip -d eval_images/)
    root = mmeb_train(tmp_path)           # tmp/data/MMEB-train/<20 subsets>/{original,diverse_instruction,train}-...
    roots = mme5(tmp_path)                # tmp/data/mmE5/{mmE5-MMEB-hardneg,mmE5-synthetic}, tmp/data/mmE5/images/
    root = mmeb_v2(tmp_path)              # tmp/data/MMEB-V2/{annotations,image-tasks}
"""
import json
import os
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from common import IMAGE_MARKER
from readers.mmeb import MMEB_TABLE, TRAIN_SUBSETS, canonical_name

M = IMAGE_MARKER
EVAL_NAMES = sorted(list(MMEB_TABLE) + ["CIFAR-100"])  # the 37 folders of MMEB-eval's main branch
TRAIN_NAMES = list(TRAIN_SUBSETS)  # MMEB-train's 20 subsets on main, its spellings
EARLY_TRAIN_NAMES = ["CIFAR_100", "FashionIQ", "ImageNet-A", "ImageNet-R", "ScienceQA", "Visual7W-pointing"]
HARDNEG_EXTRA = ["TAT-DQA", "ArxivQA", "InfoSeek_it2t", "InfoSeek_it2it"]  # mmE5-MMEB-hardneg's 24 = these + the 20
INSTRUCTION_ONLY = {"ImageNet_1K", "HatefulMemes", "SUN397", "VOC2007", "NIGHTS", "MSCOCO_i2t", "VisualNews_i2t"}
WITH_NEGATIVES = {"A-OKVQA", "ChartQA", "VisDial"}  # MMEB-train subsets whose README lists neg_text / neg_image_path


def picture(path, colour=(200, 40, 40)):
    """A small JPEG at path (folders made)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (40, 32), colour).save(path, format="JPEG")


def touch(path, content=b""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content)


def parquet(path, rows, schema):
    """rows (dicts) -> a Parquet file with exactly these Arrow types (string, list<string>)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(schema)), path)


def task_format(name):
    return MMEB_TABLE[name][2] if name in MMEB_TABLE else "classification"  # CIFAR-100: a classification set


# -----------------------------------------------------------------------------
# MMEB-eval

EVAL_SCHEMA = [("qry_text", pa.string()), ("qry_img_path", pa.string()), ("tgt_text", pa.list_(pa.string())),
               ("tgt_img_path", pa.list_(pa.string()))]


def eval_row(name, i, candidates):
    """A v1 row of dataset `name` as MMEB-eval stores it (the strings INFERRED from the official loaders, the CONFIRMED
    columns, gold first, "" for no image, tgt lists of equal length). Image names are UNCONFIRMED:
    <Subset>/image_<row>_<q or candidate>.jpg."""
    kind, own = task_format(name), (MMEB_TABLE.get(name, ("", "", "", "Represent the given image for classification")))[3]
    image = lambda k: f"{name}/image_{i}_{k}.jpg"  # noqa: E731
    if kind in ("classification", "VQA", "image->text"):
        text = {"classification": "", "VQA": f" What is object {i}?", "image->text": ""}[kind]
        return {"qry_text": f"{M}\n{own}{text}\n", "qry_img_path": image("q"),
                "tgt_text": [f"label {i} {k}" for k in range(candidates)], "tgt_img_path": [""] * candidates}
    if kind == "text->image":
        tail = "\n\n" if name == "VisDial" else "\n"
        return {"qry_text": f"{own} Q:what is in picture {i}\nA:a shape{tail}" if name == "VisDial" else
                f"{own} caption number {i}{tail}", "qry_img_path": "",
                "tgt_text": [f"{M}\nRepresent the given image.\n"] * candidates,
                "tgt_img_path": [image(k) for k in range(candidates)]}
    instruction = own or 'Select the portion of the image that follows the language expressions.'
    return {"qry_text": f"{M}\n{instruction} change {i}\n", "qry_img_path": image("q"),
            "tgt_text": [f"{M}\nRepresent the given image."] * candidates,
            "tgt_img_path": [image(k) for k in range(candidates)]}


def mmeb_eval(base, names=EVAL_NAMES, rows=2, candidates=3):
    """base/data/MMEB-eval as `huggingface-cli download --repo-type dataset TIGER-Lab/MMEB-eval` leaves it, and
    base/data/eval_images as `unzip images.zip -d eval_images/` (subset folders at the top, no images/ wrapper:
    INFERRED). -> (MMEB-eval folder, eval_images folder)"""
    root, images = os.path.join(base, "data", "MMEB-eval"), os.path.join(base, "data", "eval_images")
    for name in (".gitattributes", "README.md", "images.zip", "leaderboard.png", "statistics.png"):
        touch(os.path.join(root, name), b"not a dataset")
    for n, name in enumerate(names):
        table = [eval_row(name, i, candidates) for i in range(rows)]
        parquet(os.path.join(root, name, "test-00000-of-00001.parquet"), table, EVAL_SCHEMA)
        for row in table:
            for path in [row["qry_img_path"]] + row["tgt_img_path"]:
                if path:
                    picture(os.path.join(images, path), (30 + 5 * n, 200 - 5 * n, zlib.crc32(path.encode()) % 256))
    beside = "ImageNet-1K" if "ImageNet-1K" in names else names[0]  # AppleDouble junk beside an image (UNCONFIRMED)
    touch(os.path.join(images, beside, f"._image_{rows - 1}_q.jpg"), b"\x00\x05\x16\x07")
    return root, images


# -----------------------------------------------------------------------------
# MMEB-train

TRAIN_SCHEMA = [("qry", pa.string()), ("qry_image_path", pa.string()), ("pos_text", pa.string()),
                ("pos_image_path", pa.string())]
TRAIN_SCHEMA_NEGATIVES = TRAIN_SCHEMA + [("neg_text", pa.string()), ("neg_image_path", pa.string())]


def train_row(name, i, split, negatives):
    """An MMEB-train row (CONFIRMED columns; the strings as third-party copies of real rows show them): image paths
    images/<Subset>/Train/<file>; the negatives a single string, often "", where the subset has them at all."""
    dataset = canonical_name(name) or name  # CIFAR_100, not one of MMEB's, is a classification as MMEB's are
    kind = task_format(dataset)
    own = MMEB_TABLE.get(dataset, ("", "", "", "Represent the given image for classification"))[3] \
        or "Select the portion of the image that follows the language expressions."
    image = lambda k: f"images/{name}/Train/{name}_image_{i}_{k}.jpg"  # noqa: E731
    if split == "diverse_instruction":  # archive/diverse_inst.py: a paraphrase, marker then a space (INFERRED)
        instruction_line = f"{M} Please represent this picture {i}."
    else:
        instruction_line = f"{M}\n{own}"
    if kind == "text->image":
        row = {"qry": f"{own} caption {i}\n" if split != "diverse_instruction" else f"Look for the picture {i}\n",
               "qry_image_path": "", "pos_text": f"{M}\nRepresent the given image\n", "pos_image_path": image("pos")}
        if negatives:
            row.update(neg_text="", neg_image_path=image("neg"))  # VisDial: an image negative, its text ""
    else:
        row = {"qry": f"{instruction_line} about {i}\n" if kind != "classification" else f"{instruction_line}\n",
               "qry_image_path": image("q"), "pos_text": f"answer {name} {i}", "pos_image_path": ""}
        if negatives:
            row.update(neg_text="" if i % 2 else f"wrong answer {name} {i}", neg_image_path="")
    if split == "diverse_instruction" and name in INSTRUCTION_ONLY:
        row["qry"] = instruction_line  # the whole qry replaced by the paraphrase: no trailing newline (INFERRED)
    if split == "train":  # the legacy Oct-2024 file, on disk but referenced by no config: never to be read
        row["qry"] = "LEGACY " + row["qry"]
    return row


def mmeb_train(base, names=TRAIN_NAMES, rows=3):
    """base/data/MMEB-train after `huggingface-cli download --repo-type dataset TIGER-Lab/MMEB-train` and
    `python unzip_file.py` (images_zip/*.zip into images/): each subset folder with its three split files
    (CONFIRMED names). -> the download's root"""
    root = os.path.join(base, "data", "MMEB-train")
    for name in (".gitattributes", "README.md", "unzip_file.py"):
        touch(os.path.join(root, name), b"# not data")
    for name in names:
        touch(os.path.join(root, "images_zip", f"{name}.zip"), b"PK")
        negatives = name in WITH_NEGATIVES
        for split in ("train", "original", "diverse_instruction"):
            table = [train_row(name, i, split, negatives) for i in range(rows)]
            parquet(os.path.join(root, name, f"{split}-00000-of-00001.parquet"), table,
                    TRAIN_SCHEMA_NEGATIVES if negatives else TRAIN_SCHEMA)
        for row in [train_row(name, i, "original", negatives) for i in range(rows)]:
            for key in ("qry_image_path", "pos_image_path", "neg_image_path"):
                if row.get(key):
                    picture(os.path.join(root, row[key]))
    return root


# -----------------------------------------------------------------------------
# mmE5-MMEB-hardneg and mmE5-synthetic

def hardneg_row(name, i, negatives):
    """An mmE5-MMEB-hardneg row: neg_text / neg_image_path strings holding Python list literals (CONFIRMED),
    '' for an image negative's text and a text negative's image; entry 1 of a row with an odd i has neither (a
    missing negative, which the reader fills)."""
    if name.startswith("InfoSeek"):  # images under images/mbeir_images/oven_images/ (INFERRED), 170 GB to download
        image = lambda k: f"images/mbeir_images/oven_images/oven_{i}_{k}.jpg"  # noqa: E731
    else:
        image = lambda k: f"images/{name}/Train/{name}_image_{i}_{k}.jpg"  # noqa: E731
    texts, paths = [f"wrong {name} {i} {k}" for k in range(negatives)], [""] * negatives
    if name in ("VisDial", "MSCOCO_t2i", "VisualNews_t2i", "CIRR", "NIGHTS"):  # image candidates
        texts, paths = [""] * negatives, [image(f"n{k}") for k in range(negatives)]
        row = {"qry": f"Find me an everyday image that matches the given caption: photo {i}\n", "qry_image_path": "",
               "pos_text": f"{M}\nRepresent the given image.\n", "pos_image_path": image("pos")}
    else:
        row = {"qry": f"{M}\nRepresent the given image with the following question: what is {i}?\n",
               "qry_image_path": image("q"), "pos_text": f"answer {name} {i}", "pos_image_path": ""}
    if i % 2:
        texts[1], paths[1] = "", ""  # a missing negative
    return dict(row, neg_text=repr(texts), neg_image_path=repr(paths))


def synthetic_row(subset, i):
    """An mmE5-synthetic row, with its extra `modality` column (CONFIRMED): T2I rows carry "<|image_1|>\\n" in qry
    though they have no query image (seen in a third-party copy), one row has an empty pos_text beside its positive image."""
    image = lambda k: f"images/laion_synthetic/{subset}/{i}_{k}.jpg"  # noqa: E731 - top folder UNCONFIRMED
    if subset == "Retrieval":
        return {"qry": f"{M}\nFind an image of a bridge number {i} in the rain", "qry_image_path": "",
                "pos_text": "" if i == 0 else f"{M}\nRepresent the given image.", "pos_image_path": image("pos"),
                "neg_text": repr(["", ""]), "neg_image_path": repr([image("n0"), image("n1")]), "modality": "T2I"}
    return {"qry": f"{M}\nWhat is in this {subset.lower()} picture {i}?", "qry_image_path": image("q"),
            "pos_text": f"a thing {i}", "pos_image_path": "", "neg_text": repr([f"another thing {i}", f"no thing {i}"]),
            "neg_image_path": repr(["", ""]), "modality": "I2T"}


def mme5(base, rows=6, negatives=3, infoseek_images=True):
    """base/data/mmE5/mmE5-MMEB-hardneg and .../mmE5-synthetic after `huggingface-cli download`, their images
    extracted under base/data/mmE5/images as mmE5's prepare_images.sh extracts them (image_dir: base/data/mmE5).
    The hardneg file names are UNCONFIRMED: most subsets here use train-00000-of-00001.parquet, TAT-DQA uses
    TAT-DQA.parquet (the synthetic set's naming): the reader must take either. infoseek_images=False leaves out
    the M-BEIR images InfoSeek needs, as most users do. -> {"root", "hardneg", "synthetic"}"""
    root = os.path.join(base, "data", "mmE5")
    hardneg, synthetic = os.path.join(root, "mmE5-MMEB-hardneg"), os.path.join(root, "mmE5-synthetic")
    touch(os.path.join(hardneg, "README.md"), b"# card")
    for name in ("TAT-DQA", "ArxivQA"):
        touch(os.path.join(hardneg, "supplement_images_zip", f"{name}.tar.gz"), b"\x1f\x8b")
    schema = TRAIN_SCHEMA_NEGATIVES
    for name in HARDNEG_EXTRA + TRAIN_NAMES:
        table = [hardneg_row(name, i, negatives) for i in range(rows)]
        file = f"{name}.parquet" if name == "TAT-DQA" else "train-00000-of-00001.parquet"
        parquet(os.path.join(hardneg, name, file), table, schema)
        for row in table:
            if name.startswith("InfoSeek") and not infoseek_images:
                continue
            for path in [row["qry_image_path"], row["pos_image_path"]] + eval(row["neg_image_path"]):  # noqa: S307
                if path:
                    picture(os.path.join(root, path))
    touch(os.path.join(synthetic, "README.md"), b"# card")
    touch(os.path.join(synthetic, "LAION_Synthetic.tar.gz"), b"\x1f\x8b")
    for subset in ("Classification", "Retrieval", "VQA"):
        table = [synthetic_row(subset, i) for i in range(rows)]
        parquet(os.path.join(synthetic, subset, f"{subset}.parquet"), table, schema + [("modality", pa.string())])
        for row in table:
            for path in [row["qry_image_path"], row["pos_image_path"]] + eval(row["neg_image_path"]):  # noqa: S307
                if path:
                    picture(os.path.join(root, path))
    return {"root": root, "hardneg": hardneg, "synthetic": synthetic}


# -----------------------------------------------------------------------------
# MMEB-V2 image tasks

V2_SCHEMA = [("qry_inst", pa.string()), ("qry_text", pa.string()), ("qry_img_path", pa.string()),
             ("tgt_inst", pa.string()), ("tgt_text", pa.list_(pa.string())), ("tgt_img_path", pa.list_(pa.string()))]
V2_ROWS = {  # dataset -> (its V2 row, the v1 query string and candidate strings VLM2Vec-V2 reproduces)
    "ImageNet-1K": ({"qry_inst": f"{M}\nRepresent the given image for classification", "qry_text": "",
                     "qry_img_path": "ImageNet-1K/q.jpg", "tgt_inst": "", "tgt_text": ["tench", "goldfish"],
                     "tgt_img_path": ["", ""]},
                    f"{M}\nRepresent the given image for classification\n", ["tench", "goldfish"]),
    "OK-VQA": ({"qry_inst": f"{M}\nRepresent the given image with the following question:", "qry_text": "What sport?",
                "qry_img_path": "OK-VQA/q.jpg", "tgt_inst": "", "tgt_text": ["tennis", "golf"], "tgt_img_path": ["", ""]},
               f"{M}\nRepresent the given image with the following question: What sport?\n", ["tennis", "golf"]),
    "VisDial": ({"qry_inst": "Represent the given dialogue about an image, which is used for image retrieval:",
                 "qry_text": "Q:how old does the woman look\nA:maybe 20", "qry_img_path": "",
                 "tgt_inst": f"{M}\nRepresent the given image.", "tgt_text": ["", ""],
                 "tgt_img_path": ["VisDial/a.jpg", "VisDial/b.jpg"]},
                "Represent the given dialogue about an image, which is used for image retrieval: Q:how old does the "
                "woman look\nA:maybe 20\n\n", [f"{M}\nRepresent the given image.\n"] * 2),
    # a text -> image row whose qry_img_path is not empty: VLM2Vec-V2's t2i parser never reads that column
    "MSCOCO_t2i": ({"qry_inst": "Find me an everyday image that matches the given caption:",
                    "qry_text": "A man riding a horse.", "qry_img_path": "MSCOCO_t2i/q.jpg",
                    "tgt_inst": f"{M}\nRepresent the given image.", "tgt_text": ["", ""],
                    "tgt_img_path": ["MSCOCO_t2i/a.jpg", "MSCOCO_t2i/b.jpg"]},
                   "Find me an everyday image that matches the given caption: A man riding a horse.\n",
                   [f"{M}\nRepresent the given image.\n"] * 2),
    "CIRR": ({"qry_inst": f"{M}\nGiven an image, find a similar everyday image with the described changes:",
              "qry_text": "Show three bottles of soft drink.", "qry_img_path": "CIRR/q.jpg",
              "tgt_inst": f"{M}\nRepresent the given image.", "tgt_text": ["", ""],
              "tgt_img_path": ["CIRR/a.jpg", "CIRR/b.jpg"]},
             f"{M}\nGiven an image, find a similar everyday image with the described changes: Show three bottles of "
             "soft drink.\n", [f"{M}\nRepresent the given image."] * 2),
}


def mmeb_v2(base):
    """base/data/MMEB-V2: image-tasks/ as `tar -xzvf mmeb_v1.tar.gz; mv MMEB/* .` leaves it (CONFIRMED commands),
    and annotations/<Subset>/test-00000-of-00001.parquet, ziyjiang/MMEB_Test_Instruct's rows downloaded locally
    (its local file layout UNCONFIRMED). -> (annotations folder, image-tasks folder)"""
    root = os.path.join(base, "data", "MMEB-V2")
    annotations, images = os.path.join(root, "annotations"), os.path.join(root, "image-tasks")
    for name, (row, _, _) in V2_ROWS.items():
        parquet(os.path.join(annotations, name, "test-00000-of-00001.parquet"), [row, row], V2_SCHEMA)
        for path in [row["qry_img_path"]] + row["tgt_img_path"]:
            if path:
                picture(os.path.join(images, path))
    return annotations, images


def plain_rows(root, rows=260):
    """Your own data as docs/data.md describes it: data/mine/rows.jsonl in the plain layout (query, query_image,
    positive, positive_image, negatives, negative_images), its images under data/mine/. -> the file"""
    folder = os.path.join(root, "data", "mine")
    os.makedirs(os.path.join(folder, "photos"), exist_ok=True)
    picture(os.path.join(folder, "photos", "0.jpg"))
    path = os.path.join(folder, "rows.jsonl")
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"query": f"a question {i}", "query_image": "photos/0.jpg" if i % 2 else "",
                                "positive": f"its answer {i}", "negatives": [f"another answer {i}"]}) + "\n")
    return path
