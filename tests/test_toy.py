"""The toy's backbone: the embedding norm as a function of the direction (Qwen3.5's zero-centred final RMSNorm),
the non-uniform final norm of make_tiny_checkpoint, and shapes/pretrain.py's data, determinism and command line.

    python -m pytest -q tests/test_toy.py
"""
import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from common import UserError
from readers.mmeb import IMAGE_CANDIDATE
from model import Embedder
from shapes import prepare, pretrain
from shapes.tiny_model import FINAL_NORM_STD, make_tiny_checkpoint

pytestmark = pytest.mark.slow  # the toy's pretraining


@pytest.fixture(scope="module")
def spread_checkpoint(tmp_path_factory):
    """A tiny Qwen3.5 whose final norm weight is not uniform."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_spread")), seed=0, final_norm_std=FINAL_NORM_STD)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy benchmark at its smallest: 50 training rows, 9 queries a dataset."""
    return prepare.prepare(str(tmp_path_factory.mktemp("shapes")), num_train=50, num_eval=9, num_candidates=5)


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


def test_final_norm_std_changes_that_weight_alone(spread_checkpoint, tiny_checkpoint):
    uniform = load_file(os.path.join(tiny_checkpoint, "model.safetensors"))  # seed 0 too, the default final norm
    spread = load_file(os.path.join(spread_checkpoint, "model.safetensors"))
    key = "model.language_model.norm.weight"
    assert uniform.keys() == spread.keys() and torch.count_nonzero(uniform[key]) == 0
    assert spread[key].std().item() == pytest.approx(FINAL_NORM_STD, rel=0.3)
    assert all(torch.equal(uniform[k], spread[k]) for k in uniform if k != key)


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


def test_prepare_command_line_pretrains_unless_told_not_to(tmp_path, capsys):
    small = ["--num_train=50", "--num_eval=9", "--num_candidates=5"]
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


def test_prepare_run_twice_rewrites_nothing_unless_something_changed_or_forced(tmp_path, capsys):
    # the main job run again: the toy, the tiny model and its pretraining are there and identical, so nothing is
    # rewritten (eval.py's kept results check the files' times); a changed file or --force=True writes it all again
    small = [f"--out_dir={tmp_path / 'toy'}", "--num_train=50", "--num_eval=9", "--num_candidates=5", "--pretrain=False"]
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
