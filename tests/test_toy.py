"""The toy's backbone: the embedding norm as a function of the direction (Qwen3.5's zero-centred final RMSNorm),
the non-uniform final norm of make_tiny_checkpoint, and shapes/pretrain.py's data, determinism and command line.
The video and document families (shapes/media_tasks.py): what their pixels show is what their captions, answers and
questions say, in the training rows as the conversion reads them and in the evaluation tasks as eval.py's MMEB-V2
parsers read them; the main job's configs train on them and its evaluation scores them by MMEB-V2's metrics.

    python -m pytest -q tests/test_toy.py
    python -m pytest -q tests/test_toy.py -m "not slow"    # the families' data and configs alone, in seconds
"""
import json
import math
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import eval as evaluation
from common import UserError
from configurator import file_values
from data import TrainTable, video_of
from readers.mmeb import IMAGE_CANDIDATE
from readers.mmeb_v2_data import OWN_TASKS, own_tasks
from readers.mmeb_v2_rows import read_v2_task, select_v2_tasks
from readers.training import prepared_table
from model import Embedder
from shapes import media_tasks, prepare, pretrain
from shapes.tiny_model import FINAL_NORM_STD, make_tiny_checkpoint

slow = pytest.mark.slow  # the toy's pretraining, training and evaluation


@pytest.fixture(scope="module")
def spread_checkpoint(tmp_path_factory):
    """A tiny Qwen3.5 whose final norm weight is not uniform."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_spread")), seed=0, final_norm_std=FINAL_NORM_STD)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy benchmark at its smallest: 50 training rows and 36 of videos and pages, 9 queries a dataset."""
    return prepare.prepare(str(tmp_path_factory.mktemp("shapes")), num_train=50, num_eval=9, num_candidates=5,
                           num_media=36)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The video and document families alone, small: 12 training rows a format, 12 queries a task."""
    out = str(tmp_path_factory.mktemp("media"))
    return dict(media_tasks.prepare_media(out, os.path.join(out, "images"), seed=0, num_train=36, num_eval=12),
                root=out, images=os.path.join(out, "images"))


def pooled_with_norm_input(embedder, items):
    """-> (e (B, D) the pooled embeddings, x (B, D) the final norm's input at the pooled token), both float64."""
    preprocessor = embedder.preprocessor
    batch = preprocessor.collate([preprocessor(item["text"], item["image"]) for item in items])
    captured = []
    hook = embedder.model.language_model.norm.register_forward_hook(
        lambda module, args, output: captured.append((args[0].detach(), output.detach())))  # (B, L, D) each
    try:
        with torch.no_grad():
            pooled = embedder(**batch)  # (B, D)
    finally:
        hook.remove()
    (x, normed), = captured
    rows, last = torch.arange(len(items)), batch["attention_mask"].sum(dim=1) - 1
    assert torch.equal(normed[rows, last], pooled)  # the embedding is the final norm's output at the pooled token
    return pooled.double(), x[rows, last].double()


@slow
def test_embedding_norm_is_a_function_of_its_direction(spread_checkpoint, tiny_checkpoint, toy):
    """|e| = sqrt(D) / |e^ / (1 + w)| / sqrt(1 + eps / mean(x^2)): Qwen3.5's final norm gives e = (1 + w) x / rms(x),
    so the norm is fixed by the embedding's own direction e^ (up to the eps term), whatever the input."""
    embedder = Embedder.from_pretrained(spread_checkpoint).eval()
    norm = embedder.model.language_model.norm
    w, eps, dim = norm.weight.detach().double(), norm.eps, embedder.dim  # (D,)
    assert w.std() > 0.1 and (1 + w).min() > 0  # not uniform; the identity needs 1 + w != 0
    images = os.path.join(toy["images"], "Shapes-CLS"), os.path.join(toy["images"], "train/T2I")
    items = [{"text": "a small red square at the top left", "image": None},
             {"text": "x", "image": None},
             {"text": "a much longer text that goes on and on " * 6, "image": None},
             {"text": IMAGE_CANDIDATE, "image": os.path.join(images[1], "00000.png")},
             {"text": "What colour is the object?", "image": os.path.join(images[0], "00001.png")},
             {"text": "", "image": os.path.join(images[0], "00002.png")}]
    e, x = pooled_with_norm_input(embedder, items)  # (B, D), (B, D)
    direction = e / e.norm(dim=1, keepdim=True)  # (B, D)
    predicted = math.sqrt(dim) / (direction / (1 + w)).norm(dim=1) / (1 + eps / x.pow(2).mean(dim=1)).sqrt()  # (B,)
    torch.testing.assert_close(e.norm(dim=1), predicted, rtol=2e-6, atol=0)
    norms = e.norm(dim=1)
    assert norms.std() / norms.mean() > 1e-3  # the norms vary across items, as a release's do

    # the default, uniform final norm: every embedding has norm sqrt(D) (up to eps)
    uniform = Embedder.from_pretrained(tiny_checkpoint).eval()  # conftest's: seed 0, the default final norm
    assert torch.count_nonzero(uniform.model.language_model.norm.weight) == 0
    e, x = pooled_with_norm_input(uniform, items)
    expected = math.sqrt(dim) / (1 + eps / x.pow(2).mean(dim=1)).sqrt()
    torch.testing.assert_close(e.norm(dim=1), expected, rtol=2e-6, atol=0)


@slow
def test_final_norm_std_changes_that_weight_alone(spread_checkpoint, tiny_checkpoint):
    uniform = load_file(os.path.join(tiny_checkpoint, "model.safetensors"))  # seed 0 too, the default final norm
    spread = load_file(os.path.join(spread_checkpoint, "model.safetensors"))
    key = "model.language_model.norm.weight"
    assert uniform.keys() == spread.keys() and torch.count_nonzero(uniform[key]) == 0
    assert spread[key].std().item() == pytest.approx(FINAL_NORM_STD, rel=0.3)
    assert all(torch.equal(uniform[k], spread[k]) for k in uniform if k != key)


@slow
def test_pretraining_reads_training_scenes_only(toy, tmp_path):
    examples = pretrain.captioning_examples(toy["train"])
    assert len(examples) == 50 and all(image.startswith("train/") for _, image, _ in examples)
    kinds = {os.path.dirname(image): (prompt, target) for prompt, image, target in examples}
    assert set(kinds) == {f"train/{task}" for task in prepare.TASKS}
    assert kinds["train/T2I"][0].endswith(prepare.IMAGE_TO_TEXT) and kinds["train/T2I"][1].startswith("a ")
    assert kinds["train/GRD"][0].endswith("cropped image of the object.") and len(kinds["train/GRD"][1].split()) == 2
    assert not any(pretrain.names_unseen(prompt + target) for prompt, _, target in examples)
    assert pretrain.names_unseen("a small red circle at the top left") and not pretrain.names_unseen("red square")

    with open(toy["train"]) as f:
        row = json.loads(f.readline())
    for bad, message in [({"pos_text": "red circle"}, "held out of training"),
                         ({"neg_text": ["green square"]}, "held out of training"),
                         ({"qry_image_path": "Shapes-CLS-OOD/00000.png"}, "outside images/train/")]:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps({**row, **bad}) + "\n")
        with pytest.raises(UserError, match=message):
            pretrain.captioning_examples(str(path))


@slow
def test_pretraining_is_deterministic_and_learns(toy, spread_checkpoint, tmp_path):
    """A very short pretraining: the same seed gives byte-identical weights, another seed others; the loss falls;
    the folder keeps the release layout and loads as an Embedder."""
    def run(name, seed, steps=4):
        folder = make_tiny_checkpoint(str(tmp_path / name), seed=0, final_norm_std=FINAL_NORM_STD)
        summary = pretrain.pretrain(folder, toy["train"], toy["images"], steps=steps, batch_size=4, seed=seed,
                                    log_every=2)
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            return folder, summary, f.read()
    first, summary, weights = run("a", 0)
    again, _, same = run("b", 0)
    _, _, other = run("c", 1)
    assert weights == same and weights != other
    assert summary["recipe"]["steps"] == 4 and len(summary["losses"]) == 4 and summary["recipe"]["held_out"] == 2
    assert summary["losses"][-1] < summary["losses"][0]
    assert math.isfinite(summary["held_out_loss"]) and math.isfinite(summary["held_out_loss_another_picture"])
    with open(os.path.join(first, pretrain.RECORD)) as f:
        assert json.load(f)["losses"] == summary["losses"]
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "video_preprocessor_config.json"]:
        assert os.path.isfile(os.path.join(first, name)), name
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))
    random = load_file(os.path.join(spread_checkpoint, "model.safetensors"))  # what run() pretrained from
    trained = load_file(os.path.join(first, "model.safetensors"))
    changed = ("model.language_model.norm.weight", "model.visual.blocks.0.mlp.linear_fc1.weight")  # the tower trains
    assert all(not torch.equal(random[key], trained[key]) for key in changed)
    embedder = Embedder.from_pretrained(first)
    assert embedder.encode([{"text": "a red square", "image": None}]).shape == (1, 64)


@slow
def test_prepare_command_line_pretrains_unless_told_not_to(tmp_path, capsys):
    small = ["--num_train=50", "--num_eval=9", "--num_candidates=5", "--num_media=36"]
    prepare.main([f"--out_dir={tmp_path / 'random'}", "--pretrain=False", *small])
    random = os.path.join(tmp_path, "random", "tiny-qwen3.5")
    assert not os.path.exists(os.path.join(random, pretrain.RECORD))
    assert load_file(os.path.join(random, "model.safetensors"))["model.language_model.norm.weight"].std() > 0.1
    prepare.main([f"--out_dir={tmp_path / 'pretrained'}", *small])
    with open(os.path.join(tmp_path, "pretrained", "tiny-qwen3.5", pretrain.RECORD)) as f:
        assert json.load(f)["recipe"]["steps"] == 8  # the default: 5 epochs of the 48 training examples, batch 32
    assert "pretraining step 8/8" in capsys.readouterr().out
    prepare.main([f"--out_dir={tmp_path / 'pretrained'}", "--pretrain=False", *small])  # random again: no stale record
    assert not os.path.exists(os.path.join(tmp_path, "pretrained", "tiny-qwen3.5", pretrain.RECORD))
    with pytest.raises(UserError) as error:  # pretraining a folder with no model names the command that writes one
        pretrain.load(str(tmp_path / "nothing"))
    command = str(error.value).split("write one with ")[1].split()
    assert command[:3] == ["python", "-m", "shapes.prepare"]
    prepare.main([f"--out_dir={tmp_path / 'told'}", *small, *command[3:]])  # its flags are prepare's own
    assert not os.path.exists(os.path.join(tmp_path, "told", "tiny-qwen3.5", pretrain.RECORD))


@slow
def test_prepare_run_twice_rewrites_nothing_unless_something_changed_or_forced(tmp_path, capsys):
    # the main job run again: the toy, the tiny model and its pretraining are there and identical, so nothing is
    # rewritten (eval.py's kept results check the files' times); a changed file or --force=True writes it all again
    small = [f"--out_dir={tmp_path / 'toy'}", "--num_train=50", "--num_eval=9", "--num_candidates=5", "--num_media=36",
             "--pretrain=False"]
    image = os.path.join(tmp_path, "toy", "images", "Shapes-CLS", "00000.png")
    prepare.main(small)
    first = os.path.getmtime(image), os.path.getmtime(os.path.join(tmp_path, "toy", "tiny-qwen3.5", "model.safetensors"))
    capsys.readouterr()
    prepare.main(small)
    assert "already holds this toy" in capsys.readouterr().out
    assert (os.path.getmtime(image), os.path.getmtime(os.path.join(tmp_path, "toy", "tiny-qwen3.5",
                                                                    "model.safetensors"))) == first
    prepare.main(small + ["--seed=1"])  # other settings: written again
    assert "already holds" not in capsys.readouterr().out and os.path.getmtime(image) > first[0]
    prepare.main(small)
    with open(image, "ab") as f:  # a file changed since: written again
        f.write(b"x")
    capsys.readouterr()
    prepare.main(small)
    assert "already holds" not in capsys.readouterr().out
    prepare.main(small + ["--force"])
    assert "already holds" not in capsys.readouterr().out


# -----------------------------------------------------------------------------
# the video and document families (shapes/media_tasks.py)

CAPTIONS = {media_tasks.caption(c, s, m): (c, s, m) for c in prepare.COLOURS for s in prepare.SHAPES
            for m in media_tasks.MOTIONS}
ANSWERS = {answer: motion for motion, (_, _, answer) in media_tasks.MOTIONS.items()}


def shown(path):
    """An image file -> (the colour names of its shapes, the centroid (x, y) of its shapes' pixels): every pixel
    neither page white, nor background grey, nor the type's grey levels counts, and must be one of the colours."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)  # (H, W, 3)
    palette = {name: np.array(rgb) for name, rgb in prepare.COLOURS.items()}
    coloured = pixels.max(-1) - pixels.min(-1) > 40  # (H, W): neither white, grey nor black (the text)
    names = {name for name, rgb in palette.items() if (np.abs(pixels - rgb).sum(-1) == 0).any()}
    assert (np.abs(pixels[coloured][:, None] - np.stack(list(palette.values()))).sum(-1).min(-1) == 0).all(), path
    ys, xs = np.nonzero(coloured)
    return names, (xs.mean(), ys.mean())


def motion_of(frames):
    """A toy video's frame files -> (its object's colour, which way it moves), read from the pixels."""
    assert len(frames) == media_tasks.FRAMES
    (colour,), (x0, y0) = shown(frames[0])
    _, (x1, y1) = shown(frames[-1])
    dx, dy = x1 - x0, y1 - y0
    if max(abs(dx), abs(dy)) < 2:
        return colour, "still"
    assert min(abs(dx), abs(dy)) < 2 and max(abs(dx), abs(dy)) > media_tasks.TRAVEL - 3, (frames, dx, dy)
    return colour, ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("down" if dy > 0 else "up")


def asked(text):
    """A toy question or caption's colour-shape pairs, in order."""
    return re.findall(rf"\b({'|'.join(prepare.COLOURS)}) ({'|'.join(prepare.SHAPES)})\b", text)


def test_training_rows_of_videos_and_pages_show_what_they_say_as_the_conversion_reads_them(media, tmp_path):
    path = prepared_table([media["train_video"], media["train_docs"]], media["images"], str(tmp_path / "tables"))
    table = TrainTable(path)
    kinds = {"retrieval": 0, "qa": 0, "pages": 0}
    for i in range(len(table)):
        row = table.row(i)
        query, (positive, *negatives) = row["query"], row["candidates"]
        assert len(negatives) >= 4 and "judge" in row
        if "video" in positive:  # video retrieval: the caption -> the video that moves so, 5 other videos
            kinds["retrieval"] += 1
            colour, _, motion = CAPTIONS[query["text"].removeprefix(media_tasks.RETRIEVAL_INSTRUCTION + " ")]
            assert motion_of(video_of(positive["video"])) == (colour, motion) and query.get("video") is None
            assert all(n["text"] == positive["text"] == "<|video_1|> Understand the content of the provided video."
                       for n in negatives) and len({tuple(video_of(n["video"])) for n in negatives}) == len(negatives)
        elif "video" in query:  # video QA: the video and its question -> the answer, the other four options
            kinds["qa"] += 1
            (colour, _), = asked(query["text"])
            assert query["text"].startswith("<|video_1|> Given a video and a question")
            assert motion_of(video_of(query["video"])) == (colour, ANSWERS[positive["text"]])
            assert {positive["text"], *(n["text"] for n in negatives)} == set(ANSWERS)
            assert all(f") {option}\n" in query["text"] + "\n" for option in ANSWERS)  # lettered, as NExTQA's
        else:  # a question -> the page whose figure shows both objects it names
            kinds["pages"] += 1
            assert query["text"].startswith("Find a document image that matches the given query: Where is the")
            colours = {c for c, _ in asked(query["text"])}
            assert len(colours) == 2 and colours <= shown(positive["image"])[0]
            assert positive["image"] not in {n["image"] for n in negatives}
    assert kinds == {"retrieval": 12, "qa": 12, "pages": 12}


def test_evaluation_tasks_in_mmeb_v2_layouts_read_by_its_parsers_and_golds_show_what_queries_say(media):
    v2_dir = media["v2"]
    assert own_tasks(v2_dir).keys() == media_tasks.TASKS.keys()
    assert select_v2_tasks(v2_dir, [], log=lambda *a: None) == list(media_tasks.TASKS)  # [] = every task found
    retrieval = read_v2_task(v2_dir, "Shapes-VID-RET")  # MSR-VTT's parser, over the whole pool
    assert retrieval["local"] is None and len(retrieval["queries"]) == len(retrieval["candidate_names"]) == 12
    captions = set()
    for query, (gold,) in zip(retrieval["queries"], retrieval["labels"]):
        caption = query["text"].removeprefix(media_tasks.RETRIEVAL_INSTRUCTION + " ")
        colour, _, motion = CAPTIONS[caption]
        video = retrieval["candidates"][retrieval["candidate_names"].index(gold)]["video"]
        assert motion_of(video) == (colour, motion)
        captions.add(caption)
    assert len(captions) == 12  # distinct: one gold a caption
    qa = read_v2_task(v2_dir, "Shapes-VID-QA")  # NExTQA's parser: each row's five options
    assert len(qa["queries"]) == 12 and all(sorted(names) == sorted(ANSWERS) for names in qa["local"])
    for query, (gold,) in zip(qa["queries"], qa["labels"]):
        (colour, _), = asked(query["text"])
        assert motion_of(query["video"]) == (colour, ANSWERS[gold])
    pages = read_v2_task(v2_dir, "Shapes-DOC-RET")  # ViDoRe's parser: BEIR qrels, pages from the files
    assert pages["report"]["pages"] == {"files": 12, "bytes": 0} and len(pages["candidate_names"]) == 12
    assert len({q["text"] for q in pages["queries"]}) == 12 and all(grades == [1.0] for grades in pages["rel_scores"])
    for query, (gold,) in zip(pages["queries"], pages["labels"]):
        colours = {c for c, _ in asked(query["text"])}
        page = pages["candidates"][pages["candidate_names"].index(gold)]["image"]
        assert len(colours) == 2 and colours == shown(page)[0]


def test_own_tasks_take_an_mmeb_v2_layout_by_name_and_refuse_what_they_cannot(media, tmp_path):
    assert own_tasks(str(tmp_path)) == {}  # an MMEB-V2 download: no own tasks
    with open(os.path.join(media["v2"], OWN_TASKS)) as f:
        assert json.load(f) == {"Shapes-VID-RET": "MSR-VTT", "Shapes-VID-QA": "NExTQA",
                                "Shapes-DOC-RET": "ViDoRe_arxivqa"}
    task = own_tasks(media["v2"])["Shapes-DOC-RET"]
    assert (task.parser, task.roots, task.extra["like"]) == ("vidore", ("visdoc-tasks/Shapes-DOC-RET",),
                                                             "ViDoRe_arxivqa")
    assert select_v2_tasks(media["v2"], ["Shapes-VID-QA"]) == ["Shapes-VID-QA"]
    for declared, message in (({"Mine": "Nothing"}, "not an MMEB-V2 video or visdoc task"),
                              ({"Mine": "UCF101"}, "globally scored classification"),
                              ({"MSR-VTT": "MSR-VTT"}, "one of MMEB-V2's own tasks"),
                              ({"../up": "MSR-VTT"}, "not a folder name")):
        (tmp_path / OWN_TASKS).write_text(json.dumps(declared))
        with pytest.raises(UserError, match=message):
            own_tasks(str(tmp_path))


def test_the_main_jobs_configs_train_on_the_video_and_page_rows_and_score_their_tasks():
    stage1, stage2, scores = (file_values(os.path.join(prepare.ROOT, "config", name)) for name in
                              ("shapes_stage1.py", "shapes_stage2.py", "shapes_eval.py"))
    toy = os.path.relpath(prepare.DATA_DIR, prepare.ROOT)
    for config in (stage1, stage2):
        assert config["train_data"] == [os.path.join(toy, name) for name in
                                        ("train.jsonl", *media_tasks.TRAIN_FILES.values())]
        assert config["video_frames"] == media_tasks.FRAMES  # every frame kept, at its own size
        assert config["video_max_pixels"] == media_tasks.FRAMES * media_tasks.FRAME_SIZE ** 2
        assert config["max_pixels"] == scores["max_pixels"] == media_tasks.PAGE_WIDTH * media_tasks.PAGE_HEIGHT
    assert scores["v2_dir"] == os.path.join(toy, media_tasks.V2_DIR) and scores["mmeb_dir"] == os.path.join(toy, "eval")


@slow
def test_the_evaluation_scores_the_video_and_page_tasks_by_mmeb_v2_metrics_apart(toy, tiny_checkpoint, tmp_path,
                                                                                capsys):
    args = ["config/shapes_eval.py", f"--init_from={tiny_checkpoint}", f"--mmeb_dir={toy['eval']}",
            f"--image_dir={toy['images']}", f"--v2_dir={toy['v2']}", "--datasets=['Shapes-CLS']", "--num_workers=0",
            "--geometry=False", f"--out={tmp_path / 'eval.json'}"]
    output = evaluation.main(args)
    own = output["own_v2"]
    assert list(own) == list(media_tasks.TASKS) and "mmeb_v2" not in output  # in no MMEB-V2 mean
    assert [(own[n]["layout"], own[n]["metric"], own[n]["eval_type"]) for n in own] == [
        ("MSR-VTT", "hit@1", "global"), ("NExTQA", "hit@1", "local"), ("ViDoRe_arxivqa", "ndcg_linear@5", "global")]
    assert all(0 <= r[r["metric"]] <= 1 and r["num_queries"] == 9 for r in own.values())
    assert [own[n]["candidates"] for n in own] == [9, 5, 9] and list(output["datasets"]) == ["Shapes-CLS"]
    table = capsys.readouterr().out
    assert re.search(r"Shapes-DOC-RET +ViDoRe_arxivqa +\d+\.\d +ndcg_linear@5 +9\n", table)
    with open(tmp_path / "eval.json") as f:
        assert json.load(f)["own_v2"]["Shapes-VID-QA"]["hit@1"] == own["Shapes-VID-QA"]["hit@1"]
