"""
Tests of readers/mmeb.py and readers/evaluation.py: the MMEB-eval reader on the official layout, its bad rows, the
36-dataset table, and the paper's instructions (Table 5) written into real-looking MMEB rows of every task format.

    python -m pytest -q tests/test_mmeb.py
"""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from common import UserError
from readers.evaluation import find_eval_datasets, read_eval_dataset
from readers.mmeb import MMEB_DATASETS, MMEB_TABLE, PAPER_INSTRUCTIONS, Instructions, dataset_of
from tests.rows import read_rows


def save_image(path, size=(40, 30)):
    Image.new("RGB", size, (200, 30, 30)).save(path)
    return path.name


def mmeb_row(i, **fields):
    return {"qry_text": f"<|image_1|>\nRepresent the given image for classification {i}", "qry_img_path": "A/q.jpg",
            "tgt_text": [f"label {i}", "other", "<|image_1|>\nRepresent the given image."],
            "tgt_img_path": ["", "", "A/c.jpg"], **fields}


def write_mmeb(root, name, rows, nested):
    folder = root / name / (name if nested else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "test-00000-of-00001.parquet")


def test_mmeb_reader_on_the_official_layout(tmp_path):
    images = tmp_path / "eval_images"
    (images / "A").mkdir(parents=True)
    save_image(images / "A" / "q.jpg")
    save_image(images / "A" / "c.jpg")
    write_mmeb(tmp_path / "mmeb", "ImageNet-1K", [mmeb_row(i) for i in range(3)], nested=True)
    write_mmeb(tmp_path / "mmeb", "MyOwnSet", [mmeb_row(9, qry_img_path="")], nested=False)
    (tmp_path / "mmeb" / "images").mkdir()  # an image folder beside the datasets: not a dataset
    save_image(tmp_path / "mmeb" / "images" / "x.png")
    (tmp_path / "mmeb" / "VOC2007").mkdir()  # a dataset folder without its Parquet files: an empty dataset
    assert find_eval_datasets(tmp_path / "mmeb") == (["ImageNet-1K", "MyOwnSet"], ["VOC2007"])
    rows, report = read_eval_dataset(tmp_path / "mmeb" / "ImageNet-1K", str(images))
    assert len(rows) == 3 and not report.bad and report.layout == "v1"
    assert rows[1]["query"] == {"text": "<|image_1|>\nRepresent the given image for classification 1",
                                "image": str(images / "A" / "q.jpg")}
    assert rows[1]["candidates"][0] == {"text": "label 1", "image": None}  # gold first
    assert rows[1]["candidates"][2]["image"] == str(images / "A" / "c.jpg")
    assert read_eval_dataset(tmp_path / "mmeb" / "MyOwnSet", str(images))[0][0]["query"]["image"] is None


@pytest.mark.parametrize("fields, field", [
    (dict(qry_img_path="A/missing.jpg"), "qry_img_path"),
    (dict(tgt_img_path=["", "", "A/missing.jpg"]), "tgt_img_path[2]"),
    (dict(qry_text="  ", qry_img_path=""), "qry_text"),
    (dict(tgt_img_path=None), "tgt_img_path"),  # the column is dropped below
])
def test_bad_mmeb_rows(tmp_path, fields, field):
    images = tmp_path / "images"
    (images / "A").mkdir(parents=True)
    save_image(images / "A" / "q.jpg")
    save_image(images / "A" / "c.jpg")
    rows = [mmeb_row(i) for i in range(4)]
    rows[1].update(fields)
    if fields.get("tgt_img_path", "") is None:
        rows = [{k: v for k, v in r.items() if k != "tgt_img_path"} for r in rows]  # every row lacks it
    write_mmeb(tmp_path, "Set", rows, nested=False)
    with pytest.raises(UserError) as error:
        read_eval_dataset(tmp_path / "Set", str(images))
    assert "test-00000-of-00001.parquet" in str(error.value) and repr(field) in str(error.value)
    assert "row 0" in str(error.value) if "tgt_img_path" == field else "row 1" in str(error.value)
    read, report = read_eval_dataset(tmp_path / "Set", str(images), skip_bad_rows=True)
    skipped = sum(report.bad.values())
    assert skipped == (4 if field == "tgt_img_path" else 1) and len(read) == 4 - skipped
    assert any("bad rows" in line for line in report.lines())


def test_mmeb_table():
    assert len(MMEB_DATASETS) == 36
    splits = [split for _, split in MMEB_DATASETS.values()]
    assert splits.count("IND") == 20 and splits.count("OOD") == 16
    tasks = [task for task, _ in MMEB_DATASETS.values()]
    assert [tasks.count(t) for t in ("Classification", "VQA", "Retrieval", "Visual Grounding")] == [10, 10, 12, 4]
    assert MMEB_DATASETS["MSCOCO"] == ("Visual Grounding", "IND")
    assert MMEB_DATASETS["Wiki-SS-NQ"] == ("Retrieval", "OOD")


# real-looking query texts, one dataset of each task format, as MMEB-eval writes them -> the paper's rewrite
QUERIES = {
    "VOC2007": ("<|image_1|>\nIdentify the object shown in the image\n",  # classification, image only
                "<|image_1|>\nRepresent the given image to answer the following question.\n"),
    "N24News": ("<|image_1|>\nRepresent the given news image with the following caption for domain classification: "
                "Storm floods the coast\n", "<|image_1|>\nRepresent the given image to answer the following question. "
                "Storm floods the coast\n"),
    "OK-VQA": ("<|image_1|>\nRepresent the given image with the following question: What sport is this?\n",
               "<|image_1|>\nRepresent the given image to answer the following question. What sport is this?\n"),
    "VisDial": ("Represent the given dialogue about an image, which is used for image retrieval: Q:is it a dog\nA:yes\n\n",
                "Retrieve an image that best matches the following description. Q:is it a dog\nA:yes\n\n"),
    "VisualNews_t2i": ("Retrieve an image of this news caption. Crowds gather in the square\n",
                       "Retrieve an image that best matches the following description. Crowds gather in the square\n"),
    "WebQA": ("<|image_1|>\nFind a Wikipedia image that answers this question: What colour is the bridge?\n",  # no image
              "<|image_1|>\nRetrieve an image that best matches the following description. What colour is the bridge?\n"),
    "MSCOCO_i2t": ("<|image_1|>\nFind an image caption describing the given everyday image.\n",
                   "<|image_1|>\nFind the caption that best describes this image.\n"),
    "CIRR": ("<|image_1|>\nGiven an image, find a similar everyday image with the described changes: make it red\n",
             "<|image_1|>\nFind an image matching the described changes. make it red\n"),
}
KEPT = {  # no Table 5 row: their own instruction stays
    "MSCOCO": '<|image_1|>\nCrop the image to to isolate the object labeled as "dog"\n',  # grounding
    "RefCOCO": '<|image_1|>\nSelect the portion of the image that follows the language expressions. "the man"\n',
    "NIGHTS": "<|image_1|>\nFind a day-to-day image that looks similar to the provided image.\n",  # image -> image
    "OVEN": "<|image_1|>\nRetrieve a Wikipedia image-description pair that provides evidence for the question of "
            "this image: What is it?\n",
}


def test_paper_instructions_replace_the_datasets_own_keeping_marker_and_text():
    paper, own = Instructions("paper"), Instructions("dataset")
    for name, (text, expected) in QUERIES.items():
        assert paper(text, name) == expected, name
        assert own(text, name) == text
    for name, text in KEPT.items():
        assert paper(text, name) == text, name
    assert paper("<|image_1|>\nWhat is this?\n", "OK-VQA") == "<|image_1|>\nWhat is this?\n"
    assert paper("Find the red one", None) == "Find the red one"  # a dataset MMEB does not know keeps its text
    assert paper.counts == {"rewritten": len(QUERIES), "kept (no Table 5 row)": len(KEPT),
                            "kept (instruction not found)": 1, "not of an MMEB dataset (kept)": 1}
    assert "8 rewritten" in paper.summary() and own.counts == {"kept (instructions='dataset')": len(QUERIES)}
    with pytest.raises(UserError, match="instructions must be"):
        Instructions("mine")
    # every format with a Table 5 row is one of the paper's, and every MMEB dataset has a format
    assert {row[2] for row in MMEB_TABLE.values()} >= set(PAPER_INSTRUCTIONS)
    assert len(MMEB_TABLE) == 36 and all(row[3] or row[2] == "grounding" for row in MMEB_TABLE.values())


def test_the_dataset_is_read_from_the_path_of_a_training_file_or_an_evaluation_folder(tmp_path):
    assert dataset_of("/data/MMEB-train/ImageNet_1K/original-00000-of-00001.parquet") == "ImageNet-1K"
    assert dataset_of("/data/MMEB-train/VOC2007.parquet") == "VOC2007"
    assert dataset_of("/data/MMEB-eval/MSCOCO_t2i") == "MSCOCO_t2i"
    assert dataset_of("/data/mmE5/synthetic/Retrieval.parquet") is None
    assert dataset_of("/data/MMEB-train/Visual7W-pointing/original-00000-of-00001.parquet") == "Visual7W-Pointing"
    folder = tmp_path / "OK-VQA"
    folder.mkdir()
    rows = [{"qry": QUERIES["OK-VQA"][0], "qry_image_path": "", "pos_text": "tennis", "pos_image_path": "",
             "neg_text": "['golf']", "neg_image_path": ""}] * 2
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    train_rows, reports = read_rows(tmp_path, str(folder / "train.parquet"), str(tmp_path), 1, instructions="paper")
    assert train_rows[0]["query"]["text"] == QUERIES["OK-VQA"][1]
    assert reports[0].instructions["counts"] == {"rewritten": 2}


def test_evaluation_rows_get_the_paper_instruction(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    save_image(images / "q.jpg")
    row = {"qry_text": QUERIES["OK-VQA"][0], "qry_img_path": "q.jpg", "tgt_text": ["tennis", "golf"],
           "tgt_img_path": ["", ""]}
    write_mmeb(tmp_path / "mmeb", "OK-VQA", [row, row], nested=False)
    rows, report = read_eval_dataset(tmp_path / "mmeb" / "OK-VQA", str(images), instructions="paper")
    assert rows[0]["query"]["text"] == QUERIES["OK-VQA"][1] and report.instructions["counts"] == {"rewritten": 2}
    assert read_eval_dataset(tmp_path / "mmeb" / "OK-VQA", str(images))[0][0]["query"]["text"] == QUERIES["OK-VQA"][0]
    write_mmeb(tmp_path / "mmeb", "Single", [dict(row, tgt_text=["tennis"], tgt_img_path=[""])], nested=False)
    with pytest.raises(UserError, match="1 candidates: at least the gold and one other"):  # a free hit otherwise
        read_eval_dataset(tmp_path / "mmeb" / "Single", str(images))
