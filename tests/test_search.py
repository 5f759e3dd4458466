"""
Tests of tools/search.py on the export of the suite's straight run on the toy (conftest.py): an item found top-1 by
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

from common import UserError
from readers.records import IMAGE_SUFFIXES
from runs.checkpoint import fingerprint
from runs.export import load_embedder
from tools import plot, search

pytestmark = pytest.mark.slow  # on the suite's straight run of train.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CAPTIONS = ["a large red circle at the top left", "", "a small blue square at the bottom right",
            "a green triangle and a yellow cross"]  # line 2 is empty: not an item, yet counted in the ids


@pytest.fixture(scope="module")
def search_toy(tmp_path_factory, straight):
    """The straight run's step folder and export (four steps of Stage I on the toy, conftest.py), a gallery of the
    toy's images in two folders (one a JPEG, beside a file that is no image and a macOS ._ file), a caption file."""
    root, run = tmp_path_factory.mktemp("search"), straight[0]
    images = json.load(open(os.path.join(run, "config.json")))["config"]["image_dir"]
    gallery = root / "gallery"
    shutil.copytree(os.path.join(images, "Shapes-T2I"), gallery)
    os.makedirs(gallery / "more")
    for name in ("00007.png", "00008.png"):
        os.replace(gallery / name, gallery / "more" / name)
    with Image.open(gallery / "00009.png") as image:
        image.save(gallery / "more" / "00009.jpg")
    os.remove(gallery / "00009.png")
    (gallery / "notes.txt").write_text("not an image\n")
    (gallery / "more" / "._00009.jpg").write_bytes(b"\x00\x05\x16\x07")  # AppleDouble junk: never an image
    (root / "captions.txt").write_text("\n".join(CAPTIONS) + "\n")
    return {"export": os.path.join(run, "export"), "step": os.path.join(run, "step_000004"),
            "gallery": str(gallery), "captions": str(root / "captions.txt"), "root": root}


IDS = [f"0000{k}.png" for k in range(7)] + ["00010.png", "00011.png", "more/00007.png", "more/00008.png", "more/00009.jpg",
                                            "captions.txt:1", "captions.txt:3", "captions.txt:4"]


def search_main(init_from, vectors, *args):
    return search.main([f"--init_from={init_from}", f"--vectors={vectors}", "--num_workers=0", "--max_pixels=4096",
                        *args])


@pytest.fixture(scope="module")
def indexed(search_toy):
    """Index the gallery and the captions, and query one caption, in one command. -> (vectors path, result)"""
    vectors = str(search_toy["root"] / "gallery.safetensors")
    result = search_main(search_toy["export"], vectors, f"--index_images={search_toy['gallery']}",
                         f"--index_text={search_toy['captions']}", f"--query_text={CAPTIONS[2]}", "--top_k=3")
    return vectors, result


def test_an_item_is_found_by_its_own_text_and_by_its_own_image(search_toy, indexed, capsys):
    vectors, by_text = indexed
    assert by_text["indexed"] == len(IDS) and by_text["similarity"] == "cos"  # Stage I trains with cosine
    assert by_text["results"][0][0]["id"] == "captions.txt:3"
    assert by_text["results"][0][0]["score"] == pytest.approx(1.0, abs=1e-5)  # itself, at cosine 1
    image = os.path.join(search_toy["gallery"], "more", "00009.jpg")
    by_image = search_main(search_toy["export"], vectors, f"--query_image={image}", f"--query_text={search.image_text}")
    found = by_image["results"][0]
    assert [r["id"] for r in found][:1] == ["more/00009.jpg"] and len(found) == 5  # the default top_k
    assert found[0]["score"] == pytest.approx(1.0, abs=1e-5) and found[1]["score"] < found[0]["score"] - 1e-4
    printed = capsys.readouterr().out
    assert re.search(r"\n   1     1\.0000  more/00009\.jpg  Represent the given image\.\n   2  ", printed)


def test_the_vectors_file_holds_the_items_their_vectors_and_the_checkpoint(search_toy, indexed):
    vectors, _ = indexed
    with safe_open(vectors, framework="pt") as f:
        metadata, stored = f.metadata(), f.get_tensor("vectors")
    items = json.loads(metadata["items"])
    assert [item["id"] for item in items] == IDS and stored.shape == (len(IDS), 64) and stored.dtype == torch.float32
    assert metadata["similarity"] == "cos" and metadata["init_from"] == search_toy["export"]
    assert metadata["fingerprint"] == fingerprint(search_toy["export"]) and len(metadata["sha256"]) == 64
    assert items[9] == {"id": "more/00007.png", "text": search.image_text,
                        "image": os.path.join(search_toy["gallery"], "more", "00007.png")}
    assert items[-1] == {"id": "captions.txt:4", "text": CAPTIONS[3], "image": None}
    embedder, _ = load_embedder(search_toy["export"], max_pixels=4096)
    torch.testing.assert_close(stored[[0, 9, -1]], embedder.encode([items[0], items[9], items[-1]]), atol=1e-5, rtol=0)


def test_scores_are_the_checkpoints_similarity_unless_told_otherwise(search_toy, indexed, tmp_path):
    vectors, _ = indexed
    with safe_open(vectors, framework="pt") as f:
        stored = f.get_tensor("vectors")
    dot_export = str(tmp_path / "dot_export")  # the export, its embedding spec saying it was trained with dot
    shutil.copytree(search_toy["export"], dot_export)
    spec = os.path.join(dot_export, "embedding_spec.json")
    with open(spec) as f:
        trained = json.load(f)
    with open(spec, "w") as f:
        json.dump(dict(trained, similarity="dot"), f)
    embedder, _ = load_embedder(search_toy["export"], max_pixels=4096)
    query = embedder.encode([{"text": CAPTIONS[0], "image": None}])[0]
    by_hand = {"dot": stored @ query, "cos": torch.nn.functional.cosine_similarity(stored, query[None], dim=1)}
    dot_vectors = str(tmp_path / "dot.safetensors")  # the same weights indexed again: its spec differs
    search_main(dot_export, dot_vectors, f"--index_images={search_toy['gallery']}", f"--index_text={search_toy['captions']}")
    for init_from, stored_at, args, ranking in ((dot_export, dot_vectors, [], "dot"),
                                                (dot_export, dot_vectors, ["--similarity=cos"], "cos"),
                                                (search_toy["export"], vectors, ["--similarity=dot"], "dot")):
        result = search_main(init_from, stored_at, f"--query_text={CAPTIONS[0]}", "--top_k=4", *args)
        expected, order = by_hand[ranking].sort(descending=True)
        assert result["similarity"] == ranking
        assert [r["id"] for r in result["results"][0]] == [IDS[j] for j in order[:4]]
        assert [r["score"] for r in result["results"][0]] == pytest.approx(expected[:4].tolist(), abs=1e-4)


def test_a_step_folder_and_a_plain_release_work_as_init_from(search_toy, indexed, tiny_checkpoint, capsys):
    vectors, by_export = indexed
    with pytest.raises(UserError, match=re.escape(f"{vectors} was indexed with {search_toy['export']} (another checkpoint")):
        search_main(search_toy["step"], vectors, f"--query_text={CAPTIONS[2]}")  # another checkpoint's space: refused
    by_step = search_main(search_toy["step"], vectors, f"--query_text={CAPTIONS[2]}", "--top_k=3", "--allow_other_checkpoint=True")
    assert by_step["similarity"] == "cos"  # the similarity the vectors were indexed for
    assert [(r["id"], pytest.approx(r["score"], abs=1e-4)) for r in by_step["results"][0]] == \
           [(r["id"], r["score"]) for r in by_export["results"][0]]  # the same weights, LoRA merged or not
    assert f"note: ranking the vectors of {search_toy['export']} (allow_other_checkpoint=True)" in capsys.readouterr().out
    items = search_toy["root"] / "items.jsonl"  # ids: its own, else the line's; an image relative to the file's folder
    items.write_text(json.dumps({"id": "red", "text": CAPTIONS[0]}) + "\n" + json.dumps({"text": CAPTIONS[3]}) + "\n"
                     + json.dumps({"text": search.image_text, "image": "gallery/00001.png"}) + "\n")
    by_release = search_main(tiny_checkpoint, str(search_toy["root"] / "release.safetensors"), f"--index_jsonl={items}",
                             f"--query_image={os.path.join(search_toy['gallery'], '00001.png')}",
                             f"--query_text={search.image_text}")
    assert by_release["similarity"] == "cos"  # a plain release does not say: cosine
    found = by_release["results"][0]
    assert found[0]["id"] == "items.jsonl:3" and {r["id"] for r in found[1:]} == {"red", "items.jsonl:2"}
    assert found[0]["image"] == os.path.join(search_toy["gallery"], "00001.png")


def test_the_sheet_draws_each_query_with_its_results_frames_the_gold_and_prints_its_rank(search_toy, indexed, tmp_path,
                                                                                      capsys):
    vectors, by_text = indexed
    gold = by_text["results"][0][1]["id"]  # the second result of CAPTIONS[2]
    image = os.path.relpath(os.path.join(search_toy["gallery"], "00003.png"), tmp_path)  # relative to the queries file
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "blue", "text": CAPTIONS[2]}) + "\n\n"
                       + json.dumps({"text": search.image_text, "image": image}) + "\n")
    sheet = str(tmp_path / "sheet.png")
    result = search_main(search_toy["export"], vectors, f"--queries={queries}", "--top_k=3", f"--sheet={sheet}",
                         f"--gold_id={gold}")
    assert result["results"][0][1]["id"] == gold and result["gold_ranks"][0] == 2  # its rank, also past top_k
    ranked = [item["id"] for item in result["results"][1]]
    assert ranked.index(gold) + 1 == result["gold_ranks"][1] if gold in ranked else result["gold_ranks"][1] > 3
    assert f"gold {gold}: rank 2 of {len(IDS)}" in capsys.readouterr().out
    with pytest.raises(UserError, match="gold_id 'nowhere.png' is none of the"):
        search_main(search_toy["export"], vectors, f"--query_text={CAPTIONS[2]}", "--gold_id=nowhere.png")
    with Image.open(sheet) as image:
        assert image.format == "PNG" and image.width > image.height  # two rows of four cells
    figure = plot.retrieval_sheet(search.sheet_rows(queries_read(queries), result["results"], gold))
    for row, found in enumerate(result["results"]):
        for rank, item in enumerate(found, 1):
            colour = frame_colour(figure, f"query {row} #{rank}")
            assert (colour == plot.GREEN) == (item["id"] == gold), (row, rank, colour)


def queries_read(path):
    return search.query_items(str(path), "", "")


def frame_colour(figure, label):
    """The frame colour of a sheet cell, by its axes' label (tools/plot.py labels each cell)."""
    import matplotlib.colors
    ax = next(ax for ax in figure.axes if ax.get_label() == label)
    return matplotlib.colors.to_hex(ax.spines["left"].get_edgecolor())


def write_text(path, text):
    path.write_text(text)
    return str(path)


def write_tensors(path, tensors, metadata=None):
    save_file(tensors, str(path), metadata)
    return str(path)


def test_each_mistake_is_an_error_naming_what_is_wrong(search_toy, indexed, tmp_path):
    vectors, _ = indexed
    empty = tmp_path / "empty"
    os.makedirs(empty / "sub")
    write_text(empty / "sub" / "readme.txt", "no image here")
    items = json.dumps([{"id": "a", "text": "a", "image": None}] * 2)
    narrow = write_tensors(tmp_path / "narrow.safetensors", {"vectors": torch.zeros(2, 32)},
                           {"items": items, "similarity": "cos", "init_from": "/elsewhere/export", "fingerprint": "x",
                            "sha256": search.vectors_checksum(torch.zeros(2, 32))})
    wide = write_tensors(tmp_path / "wide.safetensors", {"vectors": torch.zeros(2, 96)},  # wider than the model
                         {"items": items, "similarity": "cos", "init_from": "/elsewhere/export", "fingerprint": "x",
                          "sha256": search.vectors_checksum(torch.zeros(2, 96))})
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
        (search_toy["export"], vectors, [f"--index_images={empty}"], UserError, f"no images (.jpg .jpeg .png .webp .bmp "
                                                                          f".gif .tif .tiff) in {empty}"),
        (search_toy["export"], vectors, [f"--index_images={missing}"], UserError, f"no folder '{missing}'"),
        (search_toy["export"], vectors, [f"--index_text={missing}.txt"], UserError, f"no file '{missing}.txt'"),
        (search_toy["export"], vectors, [f"--query_image={missing}.png"], UserError,
         f"no query image '{missing}.png'"),
        (search_toy["export"], f"{missing}.safetensors", ["--query_text=a red circle"], UserError,
         f"no vectors file '{missing}.safetensors'"),
        (str(empty), vectors, ["--query_text=a red circle"], UserError, f"'{empty}' is neither a Hugging Face"),
        (search_toy["export"], narrow, ["--query_text=a red circle"], ValueError,
         f"{narrow} holds vectors of dimension 32 made by /elsewhere/export; {search_toy['export']} makes 64 here: "
         "query with --dim=32, the dimension it was indexed at"),
        (search_toy["export"], wide, ["--query_text=a red circle"], ValueError,
         f"{wide} holds vectors of dimension 96 made by /elsewhere/export; {search_toy['export']} makes 64 here: "
         "index again with it"),
        (search_toy["export"], plain, ["--query_text=a red circle"], UserError, f"{plain} was not written by tools/search.py"),
        (search_toy["export"], not_finite, ["--query_text=a red circle"], UserError, "1 vectors are not finite, e.g. item 'b'"),
        (search_toy["export"], changed, ["--query_text=a red circle"], UserError,
         f"{changed}: its vectors have changed since they were written (SHA-256)"),
        (search_toy["export"], vectors, [f"--queries={empty_queries}"], UserError, "holds no query (every line is empty)"),
        (search_toy["export"], vectors, ["--query_text=a", "--top_k=0"], UserError, "top_k must be at least 1, got 0"),
        (search_toy["export"], not_safetensors, ["--query_text=a red circle"], ValueError,
         f"{not_safetensors} is not a safetensors file"),
        (search_toy["export"], vectors, ["--query_text=   "], UserError, "a query needs text or an image"),
        (search_toy["export"], vectors, [f"--queries={bad_query}"], ValueError,
         f'{bad_query}, line 2: expected an object with a "text" and/or an "image"'),
        (search_toy["export"], vectors, [], UserError, "nothing to do"),
    ]
    for init_from, vectors_path, args, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            search_main(init_from, vectors_path, *args)


def test_the_command_line_ends_a_mistake_in_one_line(tmp_path):
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    run = subprocess.run([sys.executable, "-m", "tools.search", "--init_from=out/never_loaded",
                          f"--index_images={empty}", f"--vectors={tmp_path / 'v.safetensors'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        f"error: no images ({' '.join(IMAGE_SUFFIXES)}) in {empty}"]
