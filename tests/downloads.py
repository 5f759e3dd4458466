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
    v2 = mmeb_v2_video(tmp_path)          # tmp/data/MMEB-V2/{annotations,video-tasks/frames}: a task per parser
    v2 = mmeb_v2_visdoc(tmp_path)         # tmp/data/MMEB-V2/{annotations,visdoc-tasks}: ViDoRe v1, v2, VisRAG
"""
import hashlib
import io
import json
import os
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from media import IMAGE_MARKER
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


# -----------------------------------------------------------------------------
# MMEB-V2 video and visdoc tasks (readers/mmeb_v2_data.py, readers/mmeb_v2_rows.py)
#
# annotations/<repo>/ is where this project asks a user to `huggingface-cli download --repo-type dataset
# <owner>/<repo> --local-dir` each annotation set (ASSUMED: no download was possible here). The file layouts
# below are CONFIRMED from the Hugging Face pages where the docstring says so (VLM2Vec/SmthSmthV2's
# data/test.jsonl, VLM2Vec/MSVD's msvd_test.json, VLM2Vec/EgoSchema's Subset/test-00000-of-00001.parquet, MVBench's
# json/<subset>.json with a config each, vidore's BEIR corpus/ qrels/ queries/ with README configs and their
# dtypes, openbmb/VisRAG-Ret-Test-*'s corpus/ qrels/ queries/train-*.parquet and string corpus ids), else
# UNCONFIRMED: data/<split>-00000-of-00001.parquet. The columns are those VLM2Vec-V2's parsers read (CONFIRMED);
# their types where no card shows them are INFERRED. Frame folders hold frame_1.jpg, frame_2.jpg and
# frame_10.jpg (file names UNCONFIRMED), which only a natural sort orders.

STRING, STRINGS = pa.string(), pa.list_(pa.string())
PAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # Hugging Face's Image feature in Parquet
CLIPS = pa.list_(pa.struct([("output_path", pa.string())]))
FRAMES = "video-tasks/frames"


def jpeg_bytes(size=(8, 8), colour=(90, 120, 150), kind="JPEG"):
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format=kind)
    return out.getvalue()


def frame_folder(folder, names=("frame_10.jpg", "frame_2.jpg", "frame_1.jpg")):
    for name in names:
        touch(os.path.join(folder, name), jpeg_bytes())


def json_file(path, rows, lines=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows) if lines else json.dumps(rows))


def readme(folder, configs):
    """A dataset card whose YAML header lists configs: {config: {split: pattern}}."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {pattern}" for split, pattern in splits.items()]
    touch(os.path.join(folder, "README.md"), ("\n".join(lines + ["---", "# card"]) + "\n").encode())


def v2_ssv2(root):
    """VLM2Vec/SmthSmthV2: data/test.jsonl and data/train.jsonl (CONFIRMED), 1,002 test rows (VLM2Vec reads the first
    1,000), video_id a number (INFERRED)."""
    first = {"video_id": 74225, "pos_text": "Pushing something from left to right",
             "neg_text": ["Pushing something from left to right", "Pulling something from right to left",
                          "Closing something"]}
    second = {"video_id": 1100, "pos_text": "Closing something",
              "neg_text": ["Opening something", "Closing something", "Pulling something from right to left"]}
    json_file(f"{root}/annotations/SmthSmthV2/data/test.jsonl", [first, second] + [first] * 1000, lines=True)
    json_file(f"{root}/annotations/SmthSmthV2/data/train.jsonl", [dict(first, pos_text="TRAIN")], lines=True)
    for video in (74225, 1100):
        frame_folder(f"{root}/{FRAMES}/video_cls/SSv2/{video}")


def v2_breakfast(root):
    parquet(f"{root}/annotations/Breakfast/data/test-00000-of-00001.parquet",
            [{"video_id": "P03_cam01_P03_coffee", "pos_text": "coffee"},
             {"video_id": "P04_webcam02_P04_tea", "pos_text": "tea"}], [("video_id", STRING), ("pos_text", STRING)])
    for video in ("P03_cam01_P03_coffee", "P04_webcam02_P04_tea"):
        frame_folder(f"{root}/{FRAMES}/video_cls/Breakfast/{video}")


def v2_msrvtt(root):
    """README configs test_1k and train_9k over msrvtt_*.json (INFERRED from friedrichor/MSR-VTT, its likely
    source); video7020 captioned twice; a macOS '._' companion and a text file beside its frames."""
    folder = f"{root}/annotations/MSR-VTT"
    readme(folder, {"test_1k": {"test": "msrvtt_test_1k.json"}, "train_9k": {"train": "msrvtt_train_9k.json"}})
    json_file(f"{folder}/msrvtt_test_1k.json", [
        {"video_id": "video7020", "video": "video7020.mp4", "caption": "a woman creating a fondant baby and flower"},
        {"video_id": "video7021", "video": "video7021.mp4", "caption": "a boy plays grand theft auto 5"},
        {"video_id": "video7020", "video": "video7020.mp4", "caption": "a woman is making a cake"}])
    json_file(f"{folder}/msrvtt_train_9k.json", [{"video_id": "video0", "video": "video0.mp4", "caption": "TRAIN"}])
    for video in ("video7020", "video7021"):
        frame_folder(f"{root}/{FRAMES}/video_ret/MSR-VTT/{video}")
    touch(f"{root}/{FRAMES}/video_ret/MSR-VTT/video7020/._frame_1.jpg", b"\x00\x05\x16\x07")
    touch(f"{root}/{FRAMES}/video_ret/MSR-VTT/video7020/notes.txt", b"not a frame")


def v2_msvd(root):
    """msvd_test.json (CONFIRMED name), captions a list; frames in Qwen3-VL-Embedding's video_ret nesting."""
    json_file(f"{root}/annotations/MSVD/msvd_test.json", [
        {"video_id": "-4wsuPCjDBc_5_15", "video": "-4wsuPCjDBc_5_15.avi",
         "caption": ["a squirrel is eating a peanut", "a chipmunk eats"]}])
    frame_folder(f"{root}/{FRAMES}/video_ret/data/ziyan/video_retrieval/MSVD/frames/-4wsuPCjDBc_5_15")


def v2_didemo(root):
    parquet(f"{root}/annotations/DiDeMo/data/test-00000-of-00001.parquet",
            [{"video": "10015567@N08_3655084291.mp4", "caption": "a girl in a pink shirt walks away"}],
            [("video", STRING), ("caption", STRING)])
    frame_folder(f"{root}/{FRAMES}/video_ret/DiDeMo/10015567@N08_3655084291")


def v2_youcook2(root):
    """lmms-lab/YouCook2, split val beside a test file."""
    schema = [("id", STRING), ("video_path", STRING), ("sentence", STRING)]
    parquet(f"{root}/annotations/YouCook2/data/val-00000-of-00001.parquet",
            [{"id": "GLd3aX16zBg_0", "video_path": "validation/101/GLd3aX16zBg.mp4",
              "sentence": "spread margarine on two slices of white bread"}], schema)
    parquet(f"{root}/annotations/YouCook2/data/test-00000-of-00001.parquet",
            [{"id": "TEST_0", "video_path": "test/TEST.mp4", "sentence": "TEST"}], schema)
    frame_folder(f"{root}/{FRAMES}/video_ret/YouCook2/GLd3aX16zBg_0")


def v2_vatex(root):
    parquet(f"{root}/annotations/VATEX/data/test-00000-of-00001.parquet",
            [{"videoID": "G9zN5TTuGO4_000179_000189", "enCap": ["a man is playing the drums", "drums are played"]}],
            [("videoID", STRING), ("enCap", STRINGS)])
    frame_folder(f"{root}/{FRAMES}/video_ret/VATEX/G9zN5TTuGO4_000179_000189")


def v2_moments(root):
    """QVHighlight (VLM2Vec's spelling) and Charades-STA (Qwen's Charades-STA, not Charades_STA): per video a
    query/ folder and its clip folders, one positive*; a stray file beside them."""
    schema = [("query", STRING), ("video_path", STRING)]
    parquet(f"{root}/annotations/QVHighlight/data/test-00000-of-00001.parquet",
            [{"query": "a man talks to the camera", "video_path": "videos/NUsG9BgSes0_210.0_360.0.mp4"}], schema)
    parquet(f"{root}/annotations/Charades-STA/data/test-00000-of-00001.parquet",
            [{"query": "person opens the door", "video_path": "3MSZA.mp4"}], schema)
    for folder, clips in ((f"{FRAMES}/video_mret/QVHighlight/NUsG9BgSes0_210.0_360.0",
                           ("query", "positive_0", "negative_10", "negative_2")),
                          (f"{FRAMES}/video_mret/Charades-STA/3MSZA", ("query", "negative_0", "positive"))):
        for clip in clips:
            frame_folder(f"{root}/{folder}/{clip}")
        touch(f"{root}/{folder}/meta.json", b"{}")


def v2_momentseeker(root):
    """MomentSeeker's three query kinds: text only (input_frames ''), text and an image (*.jpg, at
    query_<name>), text and a video (*.mp4, its frames under video_frames/ with / as _)."""
    def clips(*paths):
        return [{"output_path": p} for p in paths]
    parquet(f"{root}/annotations/MomentSeeker/data/test-00000-of-00001.parquet", [
        {"query": "the dog jumps into the lake", "input_frames": "", "positive_frames": clips("clips/ego4d/a_pos.mp4"),
         "negative_frames": clips("clips/ego4d/a_neg1.mp4", "clips/ego4d/a_neg2.mp4")},
        {"query": "what happens next to this cup", "input_frames": "cup_17.jpg",
         "positive_frames": clips("clips/movie/b_pos1.mp4", "clips/movie/b_pos2.mp4"),
         "negative_frames": clips("clips/ego4d/a_neg1.mp4")},
        {"query": "the same man later", "input_frames": "queries/movie101_77.mp4",
         "positive_frames": clips("clips/movie/c_pos.mp4"), "negative_frames": clips("clips/movie/b_pos1.mp4")}],
        [("query", STRING), ("input_frames", STRING), ("positive_frames", CLIPS), ("negative_frames", CLIPS)])
    seeker = f"{root}/{FRAMES}/video_mret/MomentSeeker"
    for clip in ("clips_ego4d_a_pos", "clips_ego4d_a_neg1", "clips_ego4d_a_neg2", "clips_movie_b_pos1",
                 "clips_movie_b_pos2", "clips_movie_c_pos", "queries_movie101_77"):
        frame_folder(f"{seeker}/video_frames/{clip}")
    touch(f"{seeker}/query_cup_17.jpg", jpeg_bytes())


def v2_videomme(root):
    """Video-MME under README configs with its one config, videomme (INFERRED from lmms-lab/Video-MME)."""
    folder = f"{root}/annotations/Video-MME"
    readme(folder, {"videomme": {"test": "videomme/test-*"}})
    parquet(f"{folder}/videomme/test-00000-of-00001.parquet", [
        {"question_id": "001-1", "videoID": "fFjv93ACGo8", "domain": "Knowledge", "sub_category": "History",
         "question": "Which decoration is most common?",
         "options": ["A. Apples.", "B. Candles.", "C. Berries.", "D. The same number."], "answer": "C"}],
        [("question_id", STRING), ("videoID", STRING), ("domain", STRING), ("sub_category", STRING),
         ("question", STRING), ("options", STRINGS), ("answer", STRING)])
    frame_folder(f"{root}/{FRAMES}/video_qa/Video-MME/fFjv93ACGo8")


def v2_nextqa(root):
    """NExTQA's MC/ beside OE/ (lmms-lab/NExTQA's layout), no README: the config is the folder; video, answer and
    qid numbers (INFERRED)."""
    row = {"video": 4010069381, "frame_count": 369, "width": 640, "height": 480,
           "question": "how do the two man play the instrument", "answer": 1, "qid": 6, "type": "CH",
           "a0": "roll the handle", "a1": "tap their feet", "a2": "strum the string", "a3": "hit with sticks",
           "a4": "pat with hand"}
    schema = [(k, pa.int64()) for k in ("video", "frame_count", "width", "height")] + \
        [("question", STRING), ("answer", pa.int64()), ("qid", pa.int64()), ("type", STRING)] + \
        [(f"a{k}", STRING) for k in range(5)]
    parquet(f"{root}/annotations/NExTQA/MC/test-00000-of-00001.parquet", [row], schema)
    parquet(f"{root}/annotations/NExTQA/OE/test-00000-of-00001.parquet", [{"video": 1, "question": "OE"}],
            [("video", pa.int64()), ("question", STRING)])
    frame_folder(f"{root}/{FRAMES}/video_qa/NExTQA/4010069381")


def v2_egoschema(root):
    """Subset/test-00000-of-00001.parquet (CONFIRMED) beside MC/; answer a string of digits (INFERRED)."""
    schema = [("video_idx", STRING), ("question", STRING), ("answer", STRING), ("question_idx", STRING),
              ("option", STRINGS)]
    parquet(f"{root}/annotations/EgoSchema/Subset/test-00000-of-00001.parquet", [
        {"video_idx": "001934bb-81bd", "question": "What is c doing?", "answer": "2", "question_idx": "0074f737",
         "option": ["A. c is cooking", "B. c is reading", "C. c is cleaning the table", "D. c is writing",
                    "E. c is painting"]}], schema)
    parquet(f"{root}/annotations/EgoSchema/MC/test-00000-of-00001.parquet", [
        {"video_idx": "MC", "question": "MC", "answer": "0", "question_idx": "MC", "option": ["A. MC"]}], schema)
    frame_folder(f"{root}/{FRAMES}/video_qa/EgoSchema/001934bb-81bd")


def v2_mvbench(root):
    """json/<subset>.json for the 20 subsets, a README config each (CONFIRMED for OpenGVLab/MVBench, which
    VLM2Vec/MVBench copies), one row each; action_antonym's answer is two of its candidates."""
    from readers.mmeb_v2_data import MVBENCH_SUBSETS
    folder = f"{root}/annotations/MVBench"
    readme(folder, {subset: {"train": f"json/{subset}.json"} for subset in MVBENCH_SUBSETS})
    for subset in MVBENCH_SUBSETS:
        row = {"video": f"{subset}_1.mp4", "question": "What happened after the person took the food?",
               "candidates": ["Ate the medicine.", "Tidied up the blanket.", "Put down the cup."],
               "answer": "Tidied up the blanket."}
        if subset == "action_antonym":
            row.update(candidates=["not sure", "throwing", "throwing"], answer="throwing")
        json_file(f"{folder}/json/{subset}.json", [row])
        frame_folder(f"{root}/{FRAMES}/video_qa/MVBench/{subset}/{subset}_1.mp4")


def v2_activitynetqa(root):
    parquet(f"{root}/annotations/ActivityNetQA/data/test-00000-of-00001.parquet",
            [{"video_name": "Rp8ZbRd4Hu8", "question": "is the person in the video outdoors", "answer": "yes",
              "question_id": "v_Rp8ZbRd4Hu8_3", "type": 3}],
            [("video_name", STRING), ("question", STRING), ("answer", STRING), ("question_id", STRING),
             ("type", pa.int64())])
    frame_folder(f"{root}/{FRAMES}/video_qa/ActivityNetQA/v_Rp8ZbRd4Hu8")


V2_VIDEO = {"SmthSmthV2": v2_ssv2, "Breakfast": v2_breakfast, "MSR-VTT": v2_msrvtt, "MSVD": v2_msvd,
            "DiDeMo": v2_didemo, "YouCook2": v2_youcook2, "VATEX": v2_vatex, "QVHighlight": v2_moments,
            "MomentSeeker": v2_momentseeker, "Video-MME": v2_videomme, "NExTQA": v2_nextqa,
            "EgoSchema": v2_egoschema, "MVBench": v2_mvbench, "ActivityNetQA": v2_activitynetqa}


def beir(folder, split, corpus, qrels, queries, id_type, score_type, card=True, language=False):
    """A BEIR-style visdoc set: corpus (corpus-id, image), qrels (query-id, corpus-id, score), queries
    (query-id, query[, language]), each <config>/<split>-00000-of-00001.parquet, with README configs or not."""
    if card:
        readme(folder, {c: {split: f"{c}/{split}-*"} for c in ("corpus", "qrels", "queries")})
    parquet(f"{folder}/corpus/{split}-00000-of-00001.parquet",
            [{"corpus-id": i, "image": {"bytes": b, "path": None}} for i, b in corpus],
            [("corpus-id", id_type), ("image", PAGE)])
    parquet(f"{folder}/qrels/{split}-00000-of-00001.parquet",
            [{"query-id": q, "corpus-id": c, "score": s} for q, c, s in qrels],
            [("query-id", id_type), ("corpus-id", id_type), ("score", score_type)])
    parquet(f"{folder}/queries/{split}-00000-of-00001.parquet",
            [dict(zip(("query-id", "query", "language"), q)) for q in queries],
            [("query-id", id_type), ("query", STRING)] + ([("language", STRING)] if language else []))


def mmeb_v2_visdoc(base):
    """base/data/MMEB-V2 with four visdoc sets: vidore/arxivqa_test_subsampled_beir (int ids, float graded
    qrels with a score-0 pair and a repeated pair, pages only in the corpus's bytes, README configs: CONFIRMED
    layout and dtypes), vidore/esg_reports_v2 (queries in two languages, no README; the multilingual task's pages
    also under visdoc-tasks/esg_reports_v2_multilingual/<id>.png, VLM2Vec's image_root), and
    openbmb/VisRAG-Ret-Test-ArxivQA (split train, string ids, one page as a file under Qwen's
    visdoc-tasks/images/VisRAG_ArxivQA/ named by VisRAG's md5 rule), and VLM2Vec/MMLongBench-doc (OOD). -> v2_dir"""
    root = os.path.join(base, "data", "MMEB-V2")
    sizes = {10: (30, 40), 11: (31, 41), 12: (32, 42), 13: (33, 43)}
    beir(f"{root}/annotations/arxivqa_test_subsampled_beir", "test",
         [(i, jpeg_bytes(size, kind="PNG")) for i, size in sizes.items()],
         [(0, 11, 1.0), (0, 10, 2.0), (0, 12, 0.0), (0, 11, 0.5), (1, 12, 1.0), (1, 10, 1.0)],
         [(0, "Which figure shows the loss curve?"), (1, "What is the accuracy in Table 2?")],
         pa.int64(), pa.float64())
    beir(f"{root}/annotations/esg_reports_v2", "test", [(5, jpeg_bytes()), (6, jpeg_bytes())],
         [(0, 5, 1), (1, 5, 2), (1, 6, 1)],
         [(0, "What is the CO2 target?", "english"), (1, "Quel est l'objectif CO2 ?", "french")],
         pa.int64(), pa.int64(), card=False, language=True)
    for page in (5, 6):
        touch(f"{root}/visdoc-tasks/esg_reports_v2_multilingual/{page}.png", jpeg_bytes(kind="PNG"))
    long_id = "1709.01234_figure_2_a_rather_long_file_name_that_goes_well_past_fifty_characters.png"
    beir(f"{root}/annotations/VisRAG-Ret-Test-ArxivQA", "train",
         [(long_id, jpeg_bytes()), ("short.jpeg", jpeg_bytes((12, 9)))],
         [("q-1", long_id, 1), ("q-2", "short.jpeg", 1)],
         [("q-1", "What does the figure plot?"), ("q-2", "How many bars?")], STRING, pa.int64(), card=False)
    base_name, ext = os.path.splitext(long_id)
    touch(f"{root}/visdoc-tasks/images/VisRAG_ArxivQA/"
          f"{base_name[:50]}_{hashlib.md5(long_id.encode()).hexdigest()[:8]}{ext}", jpeg_bytes())
    # the OOD family: VLM2Vec/MMLongBench-doc, read by the same parser as ViDoRe (its BEIR layout INFERRED from
    # VLM2Vec's vidore parser loading it with the same three configs)
    beir(f"{root}/annotations/MMLongBench-doc", "test", [(1, jpeg_bytes()), (2, jpeg_bytes((20, 30)))],
         [(0, 2, 1)], [(0, "Which page has the revenue table?")], pa.int64(), pa.int64())
    return root


def mmeb_v2_video(base, names=tuple(V2_VIDEO)):
    """base/data/MMEB-V2 with one video task of each parser (and both spellings where the yamls differ): their
    annotations under annotations/<repo>/ and frames under video-tasks/frames/ as the archives unpack. -> v2_dir"""
    root = os.path.join(base, "data", "MMEB-V2")
    for name in names:
        V2_VIDEO[name](root)
    return root
