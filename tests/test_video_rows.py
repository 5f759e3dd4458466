"""
Videos and visual documents in training: the plain layout's videos (a folder of frames or a list of frame files) in
the prepared table and through the Preprocessor, what a bad video does, VLM2Vec-V2's four video and document parsers
against its own code on the same records (tests/fixtures/vlm2vec_v2_train.json, whose "provenance" says how it was
made), config/vlm2vec_v2_mixture.py, and a two-rank run of an image, a video and a document source stopped and
resumed to the straight run's losses.

    python -m pytest -q tests/test_video_rows.py
"""
import base64
import hashlib
import io
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import data
from common import UserError
from media import IMAGE_MARKER, VIDEO_MARKER, frame_choice
from readers import training
from tests.rows import read_rows, table, train_dataset
from tests.toyrun import launch, run_train

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "vlm2vec_v2_train.json")
with open(FIXTURE) as f:
    VLM2VEC = json.load(f)
THEIR_MARKERS = {"<|video_pad|>": VIDEO_MARKER, "<|image_pad|>": IMAGE_MARKER}  # Qwen2-VL's tokens in their texts


def frames(folder, count, size=(32, 32), suffix=".png"):
    """A folder of count frames, a colour each, named frame_1 ... (natural order differs from the names' order)."""
    os.makedirs(folder, exist_ok=True)
    for k in range(1, count + 1):
        Image.new("RGB", size, (20 * k % 256, 100, 200 - 10 * k % 200)).save(os.path.join(folder, f"frame_{k}{suffix}"))
    return os.path.basename(folder)


def write_jsonl(path, records):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


def theirs(text):
    for token, marker in THEIR_MARKERS.items():
        text = text.replace(token, marker)
    return text


def test_plain_rows_carry_a_video_as_a_folder_or_as_frame_files(tmp_path, preprocessor):
    frames(tmp_path / "clip_a", 10)
    frames(tmp_path / "clip_b", 3)
    path = write_jsonl(tmp_path / "v.jsonl", [
        {"query": f"{VIDEO_MARKER} Which way does it move?", "query_video": "clip_a", "positive": "to the left"},
        {"query": "a red square moves up", "positive": VIDEO_MARKER, "positive_video": ["clip_b/frame_2.png",
                                                                                          "clip_b/frame_1.png"]},
        {"query": "q", "positive": "p", "negatives": ["n0", "", "n2"], "negative_videos": ["", "clip_b", ""]}])
    rows, reports = read_rows(tmp_path, path, tmp_path, num_hard_negatives=3)
    assert rows[0]["query"]["video"] == [str(tmp_path / "clip_a")] and rows[0]["query"]["image"] is None
    assert rows[1]["candidates"][0]["video"] == [str(tmp_path / "clip_b" / "frame_2.png"),
                                                 str(tmp_path / "clip_b" / "frame_1.png")]  # a list: its own order
    assert [c.get("video") for c in rows[2]["candidates"]] == [None, None, [str(tmp_path / "clip_b")], None]
    assert data.video_of(rows[0]["query"]["video"])[:3] == [str(tmp_path / "clip_a" / f"frame_{k}.png") for k in (1, 2, 3)]
    lines = "\n".join(reports[0].lines(video_frames=8))
    assert "videos: 3, frames each min 2, median 3, max 10; 2 with fewer than video_frames=8: all kept, not padded" in lines
    item = train_dataset(tmp_path, preprocessor, path, tmp_path)[0]
    assert item["query"]["video_grid_thw"][0, 0].item() == 8 // 2  # 10 frames -> 8 kept, 2 a temporal patch
    assert "pixel_values" not in item["query"] and "pixel_values_videos" not in item["candidates"][0]
    assert train_dataset(tmp_path, preprocessor, path, tmp_path)[1]["candidates"][0]["video_grid_thw"][0, 0] == 1


def test_a_missing_or_empty_video_folder_is_named_or_counted(tmp_path, preprocessor):
    frames(tmp_path / "clip", 4)
    os.makedirs(tmp_path / "empty")
    (tmp_path / "empty" / "notes.txt").write_text("no frames")
    good = [{"query": f"q{k}", "query_video": "clip", "positive": f"p{k}"} for k in range(3)]
    bad = [{"query": "q", "query_video": "gone", "positive": "p"}, {"query": "q", "query_video": "empty", "positive": "p"},
           {"query": "q", "query_video": "clip", "query_image": "clip/frame_1.png", "positive": "p"}]
    path = write_jsonl(tmp_path / "v.jsonl", good + bad)
    with pytest.raises(UserError, match=r"v\.jsonl line 4 field 'query_video': video folder not found: .*gone"):
        table(tmp_path, path, tmp_path)
    _, reports = read_rows(tmp_path, path, tmp_path, skip_bad_rows=True)
    assert reports[0].bad == {"missing video folder": 1, "empty video folder": 1, "image and video": 1}
    assert "line 5 field 'query_video': video folder " in reports[0].examples["empty video folder"]
    shutil.rmtree(tmp_path / "clip")  # gone after the conversion: --check_data counts it, a worker names it
    found = table(tmp_path, path, tmp_path, skip_bad_rows=True)
    checked = training.subsets_on_disk(found)
    assert checked[0]["bad"]["missing video folder"] == 1 + 3 and sum(checked[0]["files"].values()) == 0
    with pytest.raises(UserError, match=r"v\.jsonl line 1 field 'query_video': video folder .*clip is gone"):
        data.TrainDataset(found, preprocessor, 0, 0)[0]


def fixture_sources(tmp_path):
    """The fixture's records as files a user has: the frame folders, the JSON Lines, the Parquet with page bytes."""
    root = tmp_path / "frames"
    for folder, names in VLM2VEC["videos"].items():
        os.makedirs(root / folder)
        for name in names:
            path = root / folder / name
            if name.endswith(".txt"):
                path.write_text("not a frame")
            else:
                Image.new("RGB", (16, 16), (len(name) * 20 % 256, 0, 0)).save(path, format="PNG")
    pages = [base64.b64decode(p) for p in VLM2VEC["pages"]]
    sources = []
    for k, case in enumerate(VLM2VEC["cases"]):
        if case["parser"].startswith("llavahound"):
            path = write_jsonl(tmp_path / f"{k}.jsonl", case["records"])
            entry = {"path": path, "parser": case["parser"], "image_dir": str(root)}
        else:
            records = [dict(r, image={"bytes": pages[r["image"]["page"]], "path": r["image"]["path"]})
                       for r in case["records"]]
            os.makedirs(tmp_path / f"hf{k}" / "data")
            path = str(tmp_path / f"hf{k}" / "data" / "train-00000-of-00001.parquet")
            pq.write_table(pa.Table.from_pylist(records), path)
            (tmp_path / f"hf{k}" / "README.md").write_text("a dataset card")
            entry = {"path": str(tmp_path / f"hf{k}"), "parser": case["parser"]}
        sources.append(dict(entry, **({"data_mode": case["data_mode"]} if case["data_mode"] else {})))
    return root, pages, sources


def test_the_parsers_read_each_fixture_as_vlm2vec_v2s_own_code(tmp_path):
    root, pages, sources = fixture_sources(tmp_path)
    assert "TIGER-AI-Lab/VLM2Vec @ " in VLM2VEC["provenance"] and len(VLM2VEC["cases"]) == 5
    for case, entry in zip(VLM2VEC["cases"], sources):
        rows, reports = read_rows(tmp_path / case["parser"], [entry], tmp_path)
        assert [r["query"]["text"] for r in rows] == [theirs(t) for t in case["query_text"]], case["parser"]
        assert [r["candidates"][0]["text"] for r in rows] == [theirs(t) for t in case["pos_text"]], case["parser"]
        if case["parser"].startswith("llavahound"):
            for side, expected in (("query", case["query_frames"]), ("positive", case["pos_frames"])):
                got = [r["query"] if side == "query" else r["candidates"][0] for r in rows]
                kept = [[os.path.relpath(v[k], root) for k in frame_choice(len(v), 8)]
                        for v in (data.video_of(s.get("video")) or [] for s in got)]
                assert kept == expected, (case["parser"], case["data_mode"], side)
            assert reports[0].dataset == f"{case['parser']}:{case['data_mode'] or ''}".rstrip(":")
        else:
            for side, expected in (("query", case["query_page"]), ("positive", case["pos_page"])):
                got = [(r["query"] if side == "query" else r["candidates"][0])["image"] for r in rows]
                assert [None if p is None else pages.index(open(p, "rb").read()) for p in got] == expected
            assert all(os.path.basename(p).split(".")[0] == hashlib.sha1(open(p, "rb").read()).hexdigest()
                       for r in rows for p in [r["query"]["image"] or r["candidates"][0]["image"]])


def test_bad_sources_of_the_parsers_are_named(tmp_path, preprocessor):
    with pytest.raises(UserError, match=r"parser 'llava' is none of llavahound_caption, llavahound_qa, vidore, visrag"):
        training.train_entries([{"path": "x.jsonl", "parser": "llava"}], "")
    with pytest.raises(UserError, match=r"data_mode 'video_retrieval' is not a mode of parser 'vidore' \(it has none\)"):
        training.train_entries([{"path": "x", "parser": "vidore", "data_mode": "video_retrieval"}], "")
    frames(tmp_path / "clip", 2)
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "video": "clip", "conversations": [{"value": "only one"}]},
                                              {"id": "b", "video": "clip", "conversations": [
                                                  {"value": "<video>"}, {"value": "a caption"}]}])
    with pytest.raises(UserError, match=r"c\.jsonl line 1 field 'conversations': expected two turns"):
        table(tmp_path, [{"path": path, "parser": "llavahound_qa", "image_dir": str(tmp_path)}], tmp_path)
    # a page that does not decode is met as an image that does not decode: named, or the next row
    records = []
    for k in range(3):
        Image.new("RGB", (20, 20), (100 * k, 0, 0)).save(buffer := io.BytesIO(), format="PNG")
        records.append({"query": f"q{k}", "image": {"bytes": b"not an image" if k == 1 else buffer.getvalue(),
                                                     "path": None}, "image_filename": "", "answer": f"a{k}"})
    os.makedirs(tmp_path / "vidore")
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "vidore" / "train-00000-of-00001.parquet")
    entry = [{"path": str(tmp_path / "vidore"), "parser": "vidore"}]
    assert train_dataset(tmp_path, preprocessor, entry, tmp_path)[0]["query"]["image_grid_thw"] is not None
    with pytest.raises(UserError, match=r"train-00000-of-00001\.parquet row 1 field 'qry_image_path': .*cannot"):
        train_dataset(tmp_path, preprocessor, entry, tmp_path)[1]
    assert train_dataset(tmp_path, preprocessor, entry, tmp_path, skip_bad_rows=True)[1]["row"] == 2


def test_the_vlm2vec_v2_mixture_config_is_its_recipe():
    from configurator import configure
    from tests.toyrun import ROOT, script_defaults
    config = configure(dict(script_defaults("train.py")), [os.path.join(ROOT, "config", "vlm2vec_v2_mixture.py")])
    entries = training.train_entries(config["train_data"], config["image_dir"])
    parsers = [e["parser"] for e in entries]
    assert len(entries) == 25 and parsers.count(None) == 20 and sum(e["weight"] for e in entries) == 15 + 10 + 12 + 15
    video = [e for e in entries if e["parser"] and e["parser"].startswith("llavahound")]
    assert [(e["parser"], e["data_mode"], e["weight"]) for e in video] == [
        ("llavahound_caption", "caption_retrieval", 5), ("llavahound_caption", "video_retrieval", 5),
        ("llavahound_qa", None, 5)]
    assert all(e["image_dir"].endswith("train_300k") for e in video) and config["video_frames"] == 8
    assert {e["parser"]: e["weight"] for e in entries if e["parser"] in ("vidore", "visrag")} == {"vidore": 10,
                                                                                               "visrag": 12}


def mixed_sources(toy, folder):
    """An image source (the toy's rows), a video source (moving squares, plain rows) and a document source (pages
    in a Hugging Face Parquet, read by the vidore parser): the train_data of a 2:1:1 mixture."""
    os.makedirs(folder, exist_ok=True)
    rows = []
    for k in range(24):
        clip = os.path.join(folder, "clips", f"clip{k}")
        os.makedirs(clip)
        for t in range(4):  # a square of colour k moving right
            picture = Image.new("RGB", (32, 32), "white")
            picture.paste((40 * k % 256, 80, 160), (2 + 6 * t, 12, 10 + 6 * t, 20))
            picture.save(os.path.join(clip, f"{t}.png"))
        rows.append({"query": f"{VIDEO_MARKER} What moves?", "query_video": f"clip{k}", "positive": f"square {k}"})
    write_jsonl(os.path.join(folder, "video.jsonl"), rows)
    pages = []
    for k in range(24):
        page = Image.new("RGB", (48, 32), "white")
        page.paste((10 * k, 10 * k, 10 * k), (4, 4 + k % 20, 44, 8 + k % 20))
        page.save(buffer := io.BytesIO(), format="PNG")
        pages.append({"query": f"Which line is at {k}?", "image": {"bytes": buffer.getvalue(), "path": None},
                      "image_filename": f"{k}.png", "answer": f"line {k}"})
    os.makedirs(os.path.join(folder, "pages", "data"))
    pq.write_table(pa.Table.from_pylist(pages), os.path.join(folder, "pages", "data", "train-00000-of-00001.parquet"))
    return [{"path": toy["train"], "weight": 2}, {"path": os.path.join(folder, "video.jsonl"), "weight": 1,
                                                  "image_dir": os.path.join(folder, "clips")},
            {"path": os.path.join(folder, "pages"), "parser": "vidore", "weight": 1}]


@pytest.mark.slow
def test_two_ranks_train_images_videos_and_pages_stopped_and_resumed_to_the_straight_runs_losses(toy, tmp_path):
    train_data = mixed_sources(toy, str(tmp_path / "sources"))
    args = [f"--train_data={train_data!r}", "--video_frames=4", "--max_iters=4", "--checkpoint_interval=2"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    records = run_train(toy, straight, *args, nproc=2)  # a rank's batch mixes kinds; both make the same calls
    shutil.copytree(straight, resumed)  # stopped after step 2: its checkpoint, nothing after it
    for name in ("step_000004", "export"):
        shutil.rmtree(os.path.join(resumed, name))
    again = run_train(toy, resumed, *args, "--resume=True", nproc=2)
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in records], rel=1e-5)
    code, check = launch(toy, str(tmp_path / "check"), *args, "--check_data=True")
    assert code == 0 and "videos: 24, frames each min 4, median 4, max 4" in check and "vidore" in check, check[-3000:]
