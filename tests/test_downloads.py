"""
The real downloads read as a user has them (tests/downloads.py builds each in miniature): MMEB-eval's 37 folders,
MMEB-train's three split files per subset, mmE5's list-literal negatives with '' entries and images/ paths, the
MMEB-V2 instruction columns, the leak check, the row quirks, --check_data, and the README's data commands.

    python -m pytest -q tests/test_downloads.py
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

import eval as evaluation
from common import UserError
from readers.evaluation import read_eval_dataset
from readers.mmeb import MMEB_TABLE
from readers.training import train_subsets
from tests import downloads
from tests.rows import read_rows

pytestmark = pytest.mark.slow  # each layout read whole, train.py --check_data=True in subprocesses


def said(reports):
    """What train.py and --check_data=True print of these subsets."""
    return "\n".join(line for report in reports for line in report.lines())

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MMEB_36 = sorted(MMEB_TABLE)


def python(*args, cwd=ROOT):
    """Run `python ARGS` (a script of this repository) in cwd. -> (return code, stdout + stderr)"""
    run = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return run.returncode, run.stdout + run.stderr


# -----------------------------------------------------------------------------
# MMEB-eval

@pytest.fixture(scope="module")
def mmeb_eval(tmp_path_factory):
    return downloads.mmeb_eval(str(tmp_path_factory.mktemp("eval")))


def run_eval(tiny_checkpoint, mmeb_dir, images, out, *args):
    return evaluation.main([f"--init_from={tiny_checkpoint}", f"--mmeb_dir={mmeb_dir}", f"--image_dir={images}",
                            f"--out={out}", "--num_workers=0", "--device=cpu", "--dtype=float32", "--geometry=False",
                            "--batch_size=32", *args])


def test_eval_scores_mmebs_36_by_default_and_anything_else_apart(mmeb_eval, tiny_checkpoint, tmp_path, capsys):
    mmeb_dir, images = mmeb_eval
    default = run_eval(tiny_checkpoint, mmeb_dir, images, tmp_path / "default.json")
    printed = capsys.readouterr().out
    assert default["benchmark"] == "MMEB" and list(default["datasets"]) == MMEB_36  # CIFAR-100 is not one of them
    assert default["coverage"] == {"evaluated": 36, "of": 36, "missing": []} and "others" not in default
    assert "not scored: CIFAR-100 (not among MMEB's 36" in printed and "Final score: MMEB overall, all 36" in printed
    assert default["datasets"]["ImageNet-1K"]["instructions"] == {"rewritten": 2}  # the paper's Table 5 instruction
    assert default["datasets"]["MSCOCO"]["instructions"] == {"kept (no Table 5 row)": 2}  # grounding keeps its own
    assert {r["layout"] for r in default["datasets"].values()} == {"v1"}

    named = run_eval(tiny_checkpoint, mmeb_dir, images, tmp_path / "named.json", f"--datasets={MMEB_36 + ['CIFAR-100']}")
    assert list(named["others"]["datasets"]) == ["CIFAR-100"] and "CIFAR-100" not in named["datasets"]
    for key in ("IND", "OOD", "overall", "meta_tasks"):  # MMEB's means never take CIFAR-100 in
        assert named[key] == default[key], key
    assert named["others"]["overall"] == named["others"]["datasets"]["CIFAR-100"]["precision_at_1"]
    assert named["others"]["datasets"]["CIFAR-100"]["instructions"] == {"not of an MMEB dataset (kept)": 2}
    assert "apart from MMEB (in no MMEB mean)" in capsys.readouterr().out

    partial = tmp_path / "partial"
    shutil.copytree(mmeb_dir, partial)
    for name in ("VisDial", "RefCOCO"):
        shutil.rmtree(partial / name)
    some = run_eval(tiny_checkpoint, str(partial), images, tmp_path / "partial.json")
    assert some["coverage"] == {"evaluated": 34, "of": 36, "missing": ["RefCOCO", "VisDial"]}
    assert "34 of MMEB's 36 datasets (NOT MMEB overall; missing: RefCOCO, VisDial)" in capsys.readouterr().out


def test_eval_check_data_reads_every_dataset_without_a_model(mmeb_eval, tmp_path):
    mmeb_dir, images = mmeb_eval
    code, output = python("eval.py", f"--mmeb_dir={mmeb_dir}", f"--image_dir={images}", "--check_data=True")
    assert code == 0 and "check_data: 36 datasets; the evaluation would run" in output, output[-3000:]
    assert "instructions='paper': 2 rewritten" in output and "Loading weights" not in output
    broken = tmp_path / "images"
    shutil.copytree(images, broken)
    os.remove(broken / "ImageNet-1K" / "image_1_q.jpg")  # its ._ companion is no image either
    code, output = python("eval.py", f"--mmeb_dir={mmeb_dir}", f"--image_dir={broken}", "--check_data=True")
    assert code == 1 and "the evaluation would NOT run" in output
    assert re.search(r"bad rows: 1 missing image, e\.g\. .*ImageNet-1K/test-00000-of-00001\.parquet row 1 field "
                     r"'qry_img_path': image not found: .*ImageNet-1K/image_1_q\.jpg", output)


# -----------------------------------------------------------------------------
# MMEB-train

@pytest.fixture(scope="module")
def mmeb_train(tmp_path_factory):
    return downloads.mmeb_train(str(tmp_path_factory.mktemp("train")))


def test_mmeb_train_is_read_through_one_split_with_its_images_under_the_root(mmeb_train, tmp_path):
    rows, reports = read_rows(tmp_path, [mmeb_train], mmeb_train, num_hard_negatives=2, instructions="paper")
    assert len(reports) == 20 and len(rows) == 20 * 3  # each row once: not the three files of every subset
    assert all([os.path.basename(f) for f in r.files] == ["original-00000-of-00001.parquet"] for r in reports)
    assert not any("LEGACY" in rows[i]["query"]["text"] for i in range(len(rows)))  # the legacy train-* file unread
    by_subset = {os.path.basename(r.subset): r for r in reports}
    assert by_subset["ImageNet_1K"].dataset == "ImageNet-1K" and by_subset["ImageNet_1K"].instructions["counts"] == \
        {"rewritten": 3}  # MMEB-train's spelling is MMEB-eval's dataset: its instruction is rewritten
    assert rows[0]["query"]["image"] == os.path.join(mmeb_train, "images", "A-OKVQA", "Train", "A-OKVQA_image_0_q.jpg")
    visdial = [rows[i] for i in range(len(rows)) if "VisDial" in rows[i]["source"]]
    # VisDial's one negative: neg_text "" and an image (a single string, not a list): an image negative, whose text
    # is its positive's; the second negative is filled from another row of the subset
    assert visdial[0]["candidates"][1] == {"text": visdial[0]["candidates"][0]["text"], "image": os.path.join(
        mmeb_train, "images", "VisDial", "Train", "VisDial_image_0_neg.jpg")}
    assert "split original; dataset ImageNet-1K" in said(reports)
    diverse, reports = read_rows(tmp_path, [mmeb_train], mmeb_train, 2, instructions="paper",
                                 train_split="diverse_instruction")
    assert len(diverse) == 60 and "Please represent this picture" in diverse[0]["query"]["text"]
    assert reports[0].instructions["counts"] == {"kept (instruction not found)": 3}  # a paraphrase: nothing to swap
    with pytest.raises(UserError, match=r"holds the splits diverse_instruction, original, train, not "
                                        r"train_split='test': set --train_split"):
        train_subsets(os.path.join(mmeb_train, "VisDial"), "test")


def test_an_image_that_left_only_its_macos_companion_is_missing(tmp_path):
    root = downloads.mmeb_train(str(tmp_path), names=["VisDial"], rows=3)
    image = os.path.join(root, "images", "VisDial", "Train", "VisDial_image_1_pos.jpg")
    os.remove(image)  # a truncated extraction left the AppleDouble file and not the image
    downloads.touch(os.path.join(os.path.dirname(image), "._VisDial_image_1_pos.jpg"), b"\x00\x05\x16\x07")
    rows, reports = read_rows(tmp_path, [root], root, 1, skip_bad_rows=True)
    assert len(rows) == 2 and dict(reports[0].bad) == {"missing image": 1}
    assert "VisDial_image_1_pos.jpg" in reports[0].examples["missing image"]


def test_training_on_an_out_of_distribution_evaluation_set_is_refused_unless_allowed(tmp_path, tiny_checkpoint):
    early = downloads.mmeb_train(str(tmp_path), names=downloads.TRAIN_NAMES + downloads.EARLY_TRAIN_NAMES, rows=2)
    with pytest.raises(UserError, match=r"FashionIQ: rows of FashionIQ, one of MMEB's 16 out-of-distribution.*"
                                        r"allow_eval_datasets=True"):
        read_rows(tmp_path, [early], early, 1)
    rows, reports = read_rows(tmp_path, [early], early, 1, allow_eval_datasets=True, instructions="paper")
    leaks = sorted(r.dataset for r in reports if r.leak)
    assert leaks == ["FashionIQ", "ImageNet-A", "ImageNet-R", "ScienceQA", "Visual7W-Pointing"]  # CIFAR-100: not MMEB's
    assert "LEAK: FashionIQ is one of MMEB's out-of-distribution evaluation datasets" in said(reports)
    code, output = python("train.py", f"--train_data={early}", f"--image_dir={early}", "--check_data=True",
                          "--batch_size=4", f"--table_dir={tmp_path / 'tables'}", f"--init_from={tiny_checkpoint}",
                          f"--out_dir={tmp_path / 'out'}")
    assert code == 1 and "would NOT start" in output and re.search(r"FashionIQ: rows of FashionIQ.*"
                                                                   r"allow_eval_datasets=True", output)


def test_check_data_names_an_image_deleted_after_the_conversion(tmp_path, tiny_checkpoint):
    rows = downloads.plain_rows(str(tmp_path), rows=260)  # every odd row's query is photos/0.jpg
    folder = os.path.dirname(rows)
    image = os.path.join(folder, "photos", "0.jpg")
    args = ("train.py", f"--train_data={rows}", f"--image_dir={folder}", "--check_data=True", "--batch_size=4",
            f"--table_dir={tmp_path / 'tables'}", f"--init_from={tiny_checkpoint}", f"--out_dir={tmp_path / 'out'}")
    code, output = python(*args)
    assert code == 0 and "260 usable rows, 0 bad, on 1 rank(s); the run would start" in output, output[-3000:]
    os.remove(image)  # the table's name does not change: the next start finds it cached
    code, output = python(*args)
    assert code == 1 and "data: converting" not in output, output[-3000:]
    assert f"{rows}: 130 bad rows, e.g. {rows} line 2 field 'query_image': image not found: {image}" in output
    assert "130 usable rows, 130 bad, on 1 rank(s); the run would NOT start" in output
    code, output = python(*args, "--skip_bad_rows=True")
    assert code == 0 and "bad rows: 130 missing image" in output, output[-3000:]
    assert "130 usable rows, 130 bad, on 1 rank(s); the run would start" in output


# -----------------------------------------------------------------------------
# mmE5-MMEB-hardneg and mmE5-synthetic

def test_mme5_as_downloaded_with_its_list_literal_negatives(tmp_path):
    paths = downloads.mme5(str(tmp_path), rows=6, negatives=3)
    rows, reports = read_rows(tmp_path, [paths["hardneg"], paths["synthetic"]], paths["root"], num_hard_negatives=3)
    names = [os.path.basename(r.subset) for r in reports]
    assert len(reports) == 24 + 3 and names[:4] == ["A-OKVQA", "ArxivQA", "CIRR", "ChartQA"] and len(rows) == 27 * 6
    assert [os.path.basename(f) for f in reports[names.index("TAT-DQA")].files] == ["TAT-DQA.parquet"]
    assert reports[names.index("VQA")].split == "(one split)"  # VQA/VQA.parquet, the synthetic set's naming
    visdial = reports[names.index("VisDial")]
    assert visdial.missing_negatives == 3 and visdial.filled_and_cut(3) == (3, 0) and visdial.negative_range() == (2, 2, 3)
    row = next(rows[i] for i in range(len(rows)) if "VisDial/train-00000-of-00001.parquet row 0" in rows[i]["source"])
    image = lambda name: os.path.join(paths["root"], "images", "VisDial", "Train", name)  # noqa: E731
    assert row["candidates"][1:] == [{"text": row["candidates"][0]["text"], "image": image(f"VisDial_image_0_n{k}.jpg")}
                                     for k in range(3)]  # '' text beside an image: the positive's text (mmE5)
    retrieval = [rows[i] for i in range(len(rows)) if "Retrieval.parquet row 0" in rows[i]["source"]][0]
    assert retrieval["candidates"][0]["text"] == "" and retrieval["candidates"][0]["image"]  # an image-only positive
    assert retrieval["query"]["text"].startswith("<|image_1|>\nFind") and retrieval["query"]["image"] is None
    assert "entries with neither text nor image" in said(reports)


def test_infoseeks_missing_images_are_bad_rows_counted_at_load_time(tmp_path):
    paths = downloads.mme5(str(tmp_path), rows=4, negatives=2, infoseek_images=False)
    with pytest.raises(UserError, match=r"InfoSeek_it2it: 4 bad rows, e\.g\. .*InfoSeek_it2it/train-00000-of-00001\.parquet "
                                        r"row 0 field 'qry_image_path': image not found: .*images/mbeir_images/"
                                        r"oven_images/oven_0_q\.jpg.*skip_bad_rows=True"):
        read_rows(tmp_path, [paths["hardneg"]], paths["root"], 2)
    rows, reports = read_rows(tmp_path, [paths["hardneg"]], paths["root"], 2, skip_bad_rows=True)
    bad = {os.path.basename(r.subset): dict(r.bad) for r in reports if r.bad}
    assert bad == {"InfoSeek_it2it": {"missing image": 4}, "InfoSeek_it2t": {"missing image": 4}}
    assert len(rows) == 22 * 4
    said_all = said(reports)  # what --check_data=True prints of them
    assert "InfoSeek_it2t: 0 rows" in said_all and "bad rows: 4 missing image, e.g. " in said_all


# -----------------------------------------------------------------------------
# MMEB-V2

def test_v2_instruction_columns_are_joined_as_vlm2vec_v2_joins_them(tmp_path):
    annotations, images = downloads.mmeb_v2(str(tmp_path))
    for name, (_, query, candidates) in downloads.V2_ROWS.items():
        rows, report = read_eval_dataset(os.path.join(annotations, name), images)
        assert report.layout == "V2" and len(rows) == 2
        assert rows[0]["query"]["text"] == query, name  # the v1 string, which V2's parsers reproduce
        assert [c["text"] for c in rows[0]["candidates"]] == candidates, name
        expected_image = None if name in ("VisDial", "MSCOCO_t2i") else os.path.join(images, name, "q.jpg")
        assert rows[0]["query"]["image"] == expected_image, name  # a t2i query is its text alone, as V2 reads it
        paper, report = read_eval_dataset(os.path.join(annotations, name), images, instructions="paper")
        assert report.instructions["counts"] == {"rewritten": 2}, name  # Table 5's, as for the v1 rows
    ok_vqa, _ = read_eval_dataset(os.path.join(annotations, "OK-VQA"), images, instructions="paper")
    assert ok_vqa[0]["query"]["text"] == "<|image_1|>\nRepresent the given image to answer the following question. " \
                                         "What sport?\n"


# -----------------------------------------------------------------------------
# the README's data commands, run on the downloads as the README lays them out

def readme_data_commands():
    """The `python train.py ... --check_data=True` and `python eval.py ... --check_data=True` lines of the data's
    reference (docs/data.md, which the README points to) and of the README itself."""
    text = "".join(open(os.path.join(ROOT, name)).read() for name in ("README.md", os.path.join("docs", "data.md")))
    return [line.strip() for line in text.splitlines()
            if line.strip().startswith(("python train.py", "python eval.py")) and "--check_data=True" in line]


def test_the_readmes_data_commands_work_on_the_layouts_it_describes(tmp_path, tiny_checkpoint):
    commands = readme_data_commands()
    assert len(commands) >= 4, commands
    os.makedirs(tmp_path / "models")  # the backbone where train.py's default looks: --check_data checks it too
    os.symlink(tiny_checkpoint, tmp_path / "models" / "Qwen3.5-0.8B-Base")
    downloads.mme5(str(tmp_path), rows=10)  # 270 rows: the paper's batch of 256 fits
    downloads.mmeb_train(str(tmp_path), rows=13)
    downloads.plain_rows(str(tmp_path), rows=260)  # your own rows, in the plain layout
    downloads.mmeb_eval(str(tmp_path))
    annotations, images = downloads.mmeb_v2(str(tmp_path))
    downloads.mmeb_v2_video(str(tmp_path))  # MMEB-V2's video and visdoc tasks beside its image tasks
    downloads.mmeb_v2_visdoc(str(tmp_path))
    for command in commands:
        args = command.split("#")[0].split()[1:]  # after "python", before a comment
        args = [os.path.join(ROOT, a) if a.endswith(".py") and not a.startswith("--") else a for a in args]
        if args[0].endswith("eval.py"):  # eval.py's own entry, in this process: the same main() the script runs
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(tmp_path)
                with pytest.raises(SystemExit) as done:
                    evaluation.main(args[1:])
            assert done.value.code == 0, command
            continue
        code, output = python(*args, cwd=str(tmp_path))
        assert code == 0, command + "\n" + output[-3000:]
        assert "the run would start" in output, command
