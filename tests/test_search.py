"""
Tests of search.py on a toy export trained here (two steps of Stage I through train.py): an item found top-1 by
its own text and by its own image, what the vectors file holds, scores by the checkpoint's similarity, a step
folder as init_from, the retrieval sheet, and the errors, each naming the file or folder at fault.

    python -m pytest -q tests/test_search.py
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

import checkpoint
import mmeb
import plot
import search
from checkpoint import load_embedder
from common import UserError
from shapes.prepare import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CAPTIONS = ["a large red circle at the top left", "", "a small blue square at the bottom right",
            "a green triangle and a yellow cross"]  # line 2 is empty: not an item, yet counted in the ids


@pytest.fixture(scope="module")
def toy(tmp_path_factory, tiny_checkpoint):
    """A two-step Stage I run on the toy benchmark (its step folder and export), a gallery of its images in two
    folders (one a JPEG, beside a file that is no image and a macOS ._ file) and a caption file."""
    root = tmp_path_factory.mktemp("search")
    paths = prepare(str(root / "shapes"), seed=0, num_train=50, num_eval=10)
    command = [sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "shapes_stage1.py"),
               f"--init_from={tiny_checkpoint}", f"--train_data={[paths['train']]!r}", f"--image_dir={paths['images']}",
               f"--out_dir={root / 'run'}", "--max_iters=2", "--checkpoint_interval=2", "--batch_size=8",
               "--num_hard_negatives=2", "--num_workers=0", "--max_pixels=4096"]
    run = subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    gallery = root / "gallery"
    shutil.copytree(os.path.join(paths["images"], "Shapes-T2I"), gallery)
    os.makedirs(gallery / "more")
    for name in ("00007.png", "00008.png"):
        os.replace(gallery / name, gallery / "more" / name)
    with Image.open(gallery / "00009.png") as image:
        image.save(gallery / "more" / "00009.jpg")
    os.remove(gallery / "00009.png")
    (gallery / "notes.txt").write_text("not an image\n")
    (gallery / "more" / "._00009.jpg").write_bytes(b"\x00\x05\x16\x07")  # AppleDouble junk: never an image
    (root / "captions.txt").write_text("\n".join(CAPTIONS) + "\n")
    return {"export": str(root / "run" / "export"), "step": str(root / "run" / "step_000002"),
            "gallery": str(gallery), "captions": str(root / "captions.txt"), "root": root}


IDS = [f"0000{k}.png" for k in range(7)] + ["more/00007.png", "more/00008.png", "more/00009.jpg",
                                            "captions.txt:1", "captions.txt:3", "captions.txt:4"]


def search_main(init_from, vectors, *args):
    return search.main([f"--init_from={init_from}", f"--vectors={vectors}", "--num_workers=0", "--max_pixels=4096",
                        *args])


@pytest.fixture(scope="module")
def indexed(toy):
    """Index the gallery and the captions, and query one caption, in one command. -> (vectors path, result)"""
    vectors = str(toy["root"] / "gallery.safetensors")
    result = search_main(toy["export"], vectors, f"--index_images={toy['gallery']}",
                         f"--index_text={toy['captions']}", f"--query_text={CAPTIONS[2]}", "--top_k=3")
    return vectors, result


def test_an_item_is_found_by_its_own_text_and_by_its_own_image(toy, indexed, capsys):
    vectors, by_text = indexed
    assert by_text["indexed"] == len(IDS) and by_text["similarity"] == "cos"  # Stage I trains with cosine
    assert by_text["results"][0][0]["id"] == "captions.txt:3"
    assert by_text["results"][0][0]["score"] == pytest.approx(1.0, abs=1e-5)  # itself, at cosine 1
    image = os.path.join(toy["gallery"], "more", "00009.jpg")
    by_image = search_main(toy["export"], vectors, f"--query_image={image}", f"--query_text={search.image_text}")
    found = by_image["results"][0]
    assert [r["id"] for r in found][:1] == ["more/00009.jpg"] and len(found) == 5  # the default top_k
    assert found[0]["score"] == pytest.approx(1.0, abs=1e-5) and found[1]["score"] < found[0]["score"] - 1e-4
    printed = capsys.readouterr().out
    assert re.search(r"\n   1     1\.0000  more/00009\.jpg  Represent the given image\.\n   2  ", printed)


def test_the_vectors_file_holds_the_items_their_vectors_and_the_checkpoint(toy, indexed):
    vectors, _ = indexed
    with safe_open(vectors, framework="pt") as f:
        metadata, stored = f.metadata(), f.get_tensor("vectors")
    items = json.loads(metadata["items"])
    assert [item["id"] for item in items] == IDS and stored.shape == (len(IDS), 64) and stored.dtype == torch.float32
    assert metadata["similarity"] == "cos" and metadata["init_from"] == toy["export"]
    assert metadata["fingerprint"] == checkpoint.fingerprint(toy["export"]) and len(metadata["sha256"]) == 64
    assert items[7] == {"id": "more/00007.png", "text": search.image_text,
                        "image": os.path.join(toy["gallery"], "more", "00007.png")}
    assert items[-1] == {"id": "captions.txt:4", "text": CAPTIONS[3], "image": None}
    embedder, _ = load_embedder(toy["export"], max_pixels=4096)
    torch.testing.assert_close(stored[[0, 7, -1]], embedder.encode([items[0], items[7], items[-1]]), atol=1e-5, rtol=0)


def test_scores_are_the_checkpoints_similarity_unless_told_otherwise(toy, indexed, tmp_path):
    vectors, _ = indexed
    with safe_open(vectors, framework="pt") as f:
        stored = f.get_tensor("vectors")
    dot_export = str(tmp_path / "dot_export")  # the export, saying it was trained with the dot product
    shutil.copytree(toy["export"], dot_export)
    info = os.path.join(dot_export, "pace.json")
    with open(info) as f:
        trained = json.load(f)
    with open(info, "w") as f:
        json.dump(dict(trained, similarity="dot"), f)
    embedder, _ = load_embedder(toy["export"], max_pixels=4096)
    query = embedder.encode([{"text": CAPTIONS[0], "image": None}])[0]
    by_hand = {"dot": stored @ query, "cos": torch.nn.functional.cosine_similarity(stored, query[None], dim=1)}
    dot_vectors = str(tmp_path / "dot.safetensors")  # the same weights indexed again: its pace.json differs
    search_main(dot_export, dot_vectors, f"--index_images={toy['gallery']}", f"--index_text={toy['captions']}")
    for init_from, stored_at, args, ranking in ((dot_export, dot_vectors, [], "dot"),
                                                (dot_export, dot_vectors, ["--similarity=cos"], "cos"),
                                                (toy["export"], vectors, ["--similarity=dot"], "dot")):
        result = search_main(init_from, stored_at, f"--query_text={CAPTIONS[0]}", "--top_k=4", *args)
        expected, order = by_hand[ranking].sort(descending=True)
        assert result["similarity"] == ranking
        assert [r["id"] for r in result["results"][0]] == [IDS[j] for j in order[:4]]
        assert [r["score"] for r in result["results"][0]] == pytest.approx(expected[:4].tolist(), abs=1e-4)


def test_a_step_folder_and_a_plain_release_work_as_init_from(toy, indexed, tiny_checkpoint, capsys):
    vectors, by_export = indexed
    with pytest.raises(UserError, match=re.escape(f"{vectors} was indexed with {toy['export']} (another checkpoint")):
        search_main(toy["step"], vectors, f"--query_text={CAPTIONS[2]}")  # another checkpoint's space: refused
    by_step = search_main(toy["step"], vectors, f"--query_text={CAPTIONS[2]}", "--top_k=3", "--allow_other_checkpoint=True")
    assert by_step["similarity"] == "cos"  # the similarity the vectors were indexed for
    assert [(r["id"], pytest.approx(r["score"], abs=1e-4)) for r in by_step["results"][0]] == \
           [(r["id"], r["score"]) for r in by_export["results"][0]]  # the same weights, LoRA merged or not
    assert f"note: ranking the vectors of {toy['export']} (allow_other_checkpoint=True)" in capsys.readouterr().out
    items = toy["root"] / "items.jsonl"  # ids: its own, else the line's; an image relative to the file's folder
    items.write_text(json.dumps({"id": "red", "text": CAPTIONS[0]}) + "\n" + json.dumps({"text": CAPTIONS[3]}) + "\n"
                     + json.dumps({"text": search.image_text, "image": "gallery/00001.png"}) + "\n")
    by_release = search_main(tiny_checkpoint, str(toy["root"] / "release.safetensors"), f"--index_jsonl={items}",
                             f"--query_image={os.path.join(toy['gallery'], '00001.png')}",
                             f"--query_text={search.image_text}")
    assert by_release["similarity"] == "cos"  # a plain release does not say: cosine
    found = by_release["results"][0]
    assert found[0]["id"] == "items.jsonl:3" and {r["id"] for r in found[1:]} == {"red", "items.jsonl:2"}
    assert found[0]["image"] == os.path.join(toy["gallery"], "00001.png")


def test_the_sheet_draws_each_query_with_its_results_and_frames_the_gold(toy, indexed, tmp_path):
    vectors, by_text = indexed
    gold = by_text["results"][0][1]["id"]  # the second result of CAPTIONS[2]
    image = os.path.relpath(os.path.join(toy["gallery"], "00003.png"), tmp_path)  # relative to the queries file
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "blue", "text": CAPTIONS[2]}) + "\n\n"
                       + json.dumps({"text": search.image_text, "image": image}) + "\n")
    sheet = str(tmp_path / "sheet.png")
    result = search_main(toy["export"], vectors, f"--queries={queries}", "--top_k=3", f"--sheet={sheet}",
                         f"--gold_id={gold}")
    assert result["results"][0][1]["id"] == gold
    width, height = plot.cell_size(96, 220)
    with Image.open(sheet) as image:
        assert image.size == plot.sheet_size(2, 3, title="titled")
        for row, found in enumerate(result["results"]):
            for rank, item in enumerate(found, 1):  # the left edge of its frame, halfway down
                pixel = image.getpixel((rank * width + 3, plot.TITLE_HEIGHT + row * height + height // 2))
                assert (pixel == plot.GREEN) == (item["id"] == gold), (row, rank)


def write_text(path, text):
    path.write_text(text)
    return str(path)


def write_tensors(path, tensors, metadata=None):
    save_file(tensors, str(path), metadata)
    return str(path)


def test_each_mistake_is_an_error_naming_what_is_wrong(toy, indexed, tmp_path):
    vectors, _ = indexed
    empty = tmp_path / "empty"
    os.makedirs(empty / "sub")
    write_text(empty / "sub" / "readme.txt", "no image here")
    items = json.dumps([{"id": "a", "text": "a", "image": None}] * 2)
    narrow = write_tensors(tmp_path / "narrow.safetensors", {"vectors": torch.zeros(2, 32)},
                           {"items": items, "similarity": "cos", "init_from": "/elsewhere/export", "fingerprint": "x",
                            "sha256": search.vectors_checksum(torch.zeros(2, 32))})
    nan = torch.zeros(2, 64)
    nan[1, 3] = math.nan  # a NaN vector would rank first
    not_finite = write_tensors(tmp_path / "nan.safetensors", {"vectors": nan}, {
        "items": json.dumps([{"id": "a", "text": "a", "image": None}, {"id": "b", "text": "b", "image": None}]),
        "similarity": "cos", "init_from": "x", "fingerprint": "x", "sha256": search.vectors_checksum(nan)})
    with safe_open(vectors, framework="pt") as f:
        metadata, flipped = f.metadata(), f.get_tensor("vectors")
    flipped[2, 5] *= -1  # one sign bit flipped, the metadata kept
    changed = write_tensors(tmp_path / "flipped.safetensors", {"vectors": flipped}, metadata)
    empty_queries = write_text(tmp_path / "empty_queries.txt", "\n\n")
    plain = write_tensors(tmp_path / "plain.safetensors", {"vectors": torch.zeros(2, 64)})
    not_safetensors = write_text(tmp_path / "notes.safetensors", "hello")
    bad_query = write_text(tmp_path / "bad.jsonl", '{"text": "fine"}\n{"id": "q"}\n')
    missing = str(tmp_path / "missing")
    cases = [  # (init_from, vectors, args, error, what the message says)
        (toy["export"], vectors, [f"--index_images={empty}"], UserError, f"no images (.jpg .jpeg .png .webp .bmp "
                                                                          f".gif .tif .tiff) in {empty}"),
        (toy["export"], vectors, [f"--index_images={missing}"], UserError, f"no folder '{missing}'"),
        (toy["export"], vectors, [f"--index_text={missing}.txt"], UserError, f"no file '{missing}.txt'"),
        (toy["export"], vectors, [f"--query_image={missing}.png"], UserError,
         f"no query image '{missing}.png'"),
        (toy["export"], f"{missing}.safetensors", ["--query_text=a red circle"], UserError,
         f"no vectors file '{missing}.safetensors'"),
        (str(empty), vectors, ["--query_text=a red circle"], UserError, f"'{empty}' is neither a Hugging Face"),
        (toy["export"], narrow, ["--query_text=a red circle"], ValueError,
         f"{narrow} holds vectors of dimension 32 made by /elsewhere/export; {toy['export']} makes 64"),
        (toy["export"], plain, ["--query_text=a red circle"], UserError, f"{plain} was not written by this search.py"),
        (toy["export"], not_finite, ["--query_text=a red circle"], UserError, "1 vectors are not finite, e.g. item 'b'"),
        (toy["export"], changed, ["--query_text=a red circle"], UserError,
         f"{changed}: its vectors have changed since they were written (SHA-256)"),
        (toy["export"], vectors, [f"--queries={empty_queries}"], UserError, "holds no query (every line is empty)"),
        (toy["export"], vectors, ["--query_text=a", "--top_k=0"], UserError, "top_k must be at least 1, got 0"),
        (toy["export"], not_safetensors, ["--query_text=a red circle"], ValueError,
         f"{not_safetensors} is not a safetensors file"),
        (toy["export"], vectors, ["--query_text=   "], UserError, "a query needs text or an image"),
        (toy["export"], vectors, [f"--queries={bad_query}"], ValueError,
         f'{bad_query}, line 2: expected an object with a "text" and/or an "image"'),
        (toy["export"], vectors, [], UserError, "nothing to do"),
    ]
    for init_from, vectors_path, args, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            search_main(init_from, vectors_path, *args)


def test_the_command_line_ends_a_mistake_in_one_line(tmp_path):
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "search.py"), "--init_from=out/never_loaded",
                          f"--index_images={empty}", f"--vectors={tmp_path / 'v.safetensors'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        f"error: no images ({' '.join(mmeb.IMAGE_SUFFIXES)}) in {empty}"]
