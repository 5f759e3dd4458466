"""
The forks of docs/forks.md end to end, each through train.py, the export and every loader: a second backbone family
(Qwen3-VL) trains both stages, evaluates and exports; a second pooling (mean) gives the same vectors in encode(), the
step folder, the export and the card's code; the learnable temperature, applied exactly as docs/forks.md writes it,
trains on two gloo ranks under FSDP2 with lora_rank=0 and ends where one process ends.

    python -m pytest -q tests/test_forks.py
"""
import json
import math
import os
import re
import shutil
import sys

import pytest
import torch

import eval as evaluation
from model import POOLINGS, Embedder
from runs.export import load_embedder
from tests.toyrun import ROOT, rank_env, run_process, run_train, torchrun_command

slow = pytest.mark.slow
ITEMS = [{"text": "a red circle", "image": None}, {"text": "<|image_1|> what shape?", "image": None}]


def items_with_image(toy):
    image = sorted(os.listdir(os.path.join(toy["images"], "Shapes-T2I")))[0]
    return [ITEMS[0], dict(ITEMS[1], image=os.path.join(toy["images"], "Shapes-T2I", image))]


def card_vectors(export, texts):
    """The model card's plain-transformers code, run as a reader runs it, on texts -> (n, D)."""
    card = open(os.path.join(export, "README.md")).read()
    namespace = {}
    exec(card.split("```python\n")[2].split("```")[0], namespace)  # noqa: S102 - the card's own code
    return torch.stack([namespace["embed"](text) for text in texts])


@slow
def test_qwen3_vl_trains_both_stages_evaluates_and_exports(toy, tiny_checkpoints, tmp_path):
    stage1, stage2 = str(tmp_path / "stage1"), str(tmp_path / "stage2")
    run_train(toy, stage1, f"--init_from={tiny_checkpoints['qwen3_vl']}", "--max_iters=2", "--checkpoint_interval=2")
    records = run_train(toy, stage2, f"--init_from={stage1}/step_000002", "--max_iters=2", "--checkpoint_interval=2",
                        "--lora_rank=0", "--similarity='dot'", "--temperature=6.4", "--learning_rate=1e-3")
    assert len(records) == 2 and all(math.isfinite(r["loss"]) for r in records)
    exported, (stepped, info) = Embedder.from_pretrained(f"{stage2}/export"), load_embedder(f"{stage2}/step_000002")
    assert exported.family.name == stepped.family.name == "Qwen3-VL" and info["lora_rank"] == 0
    items = items_with_image(toy)
    torch.testing.assert_close(exported.encode(items), stepped.encode(items), atol=1e-5, rtol=0)
    assert "from transformers import Qwen3VLModel" in open(f"{stage2}/export/README.md").read()
    torch.testing.assert_close(card_vectors(f"{stage2}/export", [ITEMS[0]["text"]]), exported.encode(ITEMS[:1]),
                               atol=1e-4, rtol=1e-4)
    out = str(tmp_path / "eval.json")
    result = evaluation.main(["config/shapes_eval.py", f"--init_from={stage2}/export", f"--mmeb_dir={toy['eval']}",
                              f"--image_dir={toy['images']}", f"--out={out}", "--num_workers=0", "--max_pixels=4096",
                              "--geometry=False", "--v2_dir="])
    assert len(result["datasets"]) == 10 and all(0 <= r["precision_at_1"] <= 100 for r in result["datasets"].values())


@slow
def test_mean_pooling_is_the_same_vector_everywhere(toy, tmp_path):
    out = str(tmp_path / "mean")
    run_train(toy, out, "--max_iters=2", "--checkpoint_interval=2", "--pooling='mean'")
    stepped, _ = load_embedder(f"{out}/step_000002")
    exported = Embedder.from_pretrained(f"{out}/export")
    assert stepped.spec.pooling == exported.spec.pooling == "mean"
    items = items_with_image(toy)
    vectors = exported.encode(items)
    torch.testing.assert_close(stepped.encode(items), vectors, atol=1e-5, rtol=0)
    with torch.no_grad():  # by hand: the mean of the final hidden states over the whole prompt
        feature = exported.preprocessor(ITEMS[0]["text"])
        hidden = exported.model(input_ids=feature["input_ids"][None], position_ids=feature["position_ids"][:, None],
                                use_cache=False).last_hidden_state[0]
    torch.testing.assert_close(vectors[0], hidden.mean(dim=0), atol=1e-5, rtol=0)
    assert json.load(open(f"{out}/export/1_Pooling/config.json"))["pooling_mode"] == "mean"
    card = open(f"{out}/export/README.md").read()
    assert POOLINGS["mean"].words in card.replace("\n", " ") and "hidden.mean(dim=0)" in card
    torch.testing.assert_close(card_vectors(f"{out}/export", [ITEMS[0]["text"]]), vectors[:1], atol=1e-4, rtol=1e-4)


def fork_edits():
    """docs/forks.md's learnable temperature as (file, anchor, text, where): its four edits, in its own words."""
    page = open(os.path.join(ROOT, "docs", "forks.md")).read().split("## A learnable temperature")[1]
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    module, attach, shard, call = blocks
    return [("model.py", None, "\n\n" + module, "end"), ("model.py", "import dataclasses\n", "import math\n", "before"),
            ("train.py", "from model import EmbeddingSpec\n", "from model import EmbeddingSpec, Temperature\n", "replace"),
            ("train.py", "embedder, init_info = load_embedder(", attach, "after line"),
            ("train_step.py", "    fully_shard(embedder, mp_policy=policy)\n", shard, "before"),
            ("train_step.py", "terms = loss.pace_loss(q, c, targets, **loss_args)", call, "before each line")]


def forked_copy(folder):
    """The repository's code copied to folder with docs/forks.md's learnable temperature applied. -> folder"""
    for name in os.listdir(ROOT):
        if name.endswith(".py") or name in ("config", "readers", "runs"):
            copy = shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copyfile
            copy(os.path.join(ROOT, name), os.path.join(folder, name))
    for file, anchor, text, where in fork_edits():
        path = os.path.join(folder, file)
        source = open(path).read()
        assert where == "end" or anchor in source, (file, anchor)  # the page names code that is there
        if where == "end":
            source += text
        elif where in ("before", "replace"):
            source = source.replace(anchor, text + (anchor if where == "before" else ""), 1)
        else:  # a line after (or before each) line holding the anchor, at its indentation
            lines = source.splitlines(keepends=True)
            marks = [k for k, line in enumerate(lines) if anchor in line]
            for k in reversed(marks if where == "before each line" else marks[:1]):
                indent = re.match(r"\s*", lines[k]).group()
                lines.insert(k if where == "before each line" else k + 1, indent + text.strip() + "\n")
            source = "".join(lines)
        open(path, "w").write(source)
    return folder


def learned_temperature(step_folder):
    """log tau as a step folder holds it, read with torch.distributed.checkpoint in one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(step_folder, step_folder + ".pt")
    return torch.load(step_folder + ".pt", weights_only=False)["model"]["temperature.log_tau"].item()


@slow
def test_the_learnable_temperature_fork_trains_on_two_ranks_under_fsdp2_as_on_one(toy, tmp_path):
    (tmp_path / "fork").mkdir()
    fork = forked_copy(str(tmp_path / "fork"))
    assert len(fork_edits()) == 6 and "Temperature(temperature)" in open(os.path.join(fork, "train.py")).read()
    args = ["--max_iters=2", "--checkpoint_interval=2", "--lora_rank=0", "--similarity='dot'", "--temperature=6.4",
            "--learning_rate=1e-2", "--grad_cache_chunk=4"]
    learned = {}
    for nproc in (1, 2):
        out = str(tmp_path / f"ranks{nproc}")
        command = ([sys.executable] if nproc == 1 else torchrun_command(nproc)) + [os.path.join(fork, "train.py")]
        toy_args = [os.path.join(ROOT, "config", "shapes_stage1.py"), f"--init_from={toy['checkpoint']}",  # as launch()
                    f"--train_data={[toy['train']]!r}", f"--image_dir={toy['images']}", f"--out_dir={out}",
                    f"--table_dir={os.path.join(toy['root'], 'tables')}", "--batch_size=8", "--num_hard_negatives=2",
                    "--log_interval=1", "--num_workers=0", "--max_pixels=4096", "--skip_bad_rows=True"]
        returncode, output = run_process(command + toy_args + args, env=rank_env(), cwd=fork)
        assert returncode == 0, output[-4000:]
        learned[nproc] = learned_temperature(os.path.join(out, "step_000002"))
    assert learned[1] != pytest.approx(math.log(6.4), abs=1e-4)  # tau trained, under lora_rank=0 too
    assert learned[2] == pytest.approx(learned[1], rel=1e-4, abs=1e-6)  # FSDP2 on two ranks: the same step
