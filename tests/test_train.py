"""End-to-end tests of train.py on the toy benchmark with a tiny Qwen3.5 (CPU). Each check is an equivalence:
resumed vs straight, GradCache vs plain, 2 gloo ranks vs 1 process, step folder vs exported folder."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data", "shapes"))


@pytest.fixture(scope="module")
def toy(tmp_path_factory, tiny_checkpoint):
    from prepare import prepare
    out = str(tmp_path_factory.mktemp("shapes"))
    paths = prepare(out, seed=0, num_train=120, num_eval=12)
    return {"checkpoint": tiny_checkpoint, **paths, "root": out}


def run_train(toy, out_dir, *args, nproc=1, expect_returncode=0):
    """Run train.py on the toy config in a subprocess; -> the log.jsonl records."""
    common = [os.path.join(ROOT, "config", "shapes_stage1.py"), f"--init_from={toy['checkpoint']}",
              f"--train_data={[toy['train']]!r}", f"--image_dir={toy['images']}", f"--out_dir={out_dir}",
              "--batch_size=8", "--num_hard_negatives=2", "--log_interval=1", "--num_workers=0", "--max_pixels=4096",
              "--micro_batch=5"]  # several forward calls per side, a different count on 1 and 2 ranks
    if nproc == 1:
        command = [sys.executable, os.path.join(ROOT, "train.py")]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   f"--master_port={port}", os.path.join(ROOT, "train.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    result = subprocess.run(command + common + list(args), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == expect_returncode, result.stdout[-3000:] + result.stderr[-3000:]
    if expect_returncode:
        return result.stdout
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_same_run(reference, other):
    """Same losses step by step, and the same gradient norm at step 1 (the gradient before any update);
    later norms get a looser bound: Adam's first steps amplify float-rounding differences."""
    assert [r["step"] for r in other] == [r["step"] for r in reference]
    for a, b in zip(reference, other):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5 if a["step"] == 1 else 1e-3)


def losses(records):
    return {r["step"]: r["loss"] for r in records}


@pytest.fixture(scope="module")
def straight(toy, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("straight"))
    return out, run_train(toy, out, "--max_iters=4", "--checkpoint_interval=2")


def test_resume_reproduces_the_straight_run(toy, straight, tmp_path):
    out, records = straight
    assert sorted(os.listdir(out)) == ["config.json", "export", "log.jsonl", "step_000002", "step_000004"]
    resumed = str(tmp_path / "resumed")
    shutil.copytree(out, resumed)
    shutil.rmtree(os.path.join(resumed, "step_000004"))
    os.remove(os.path.join(resumed, "log.jsonl"))
    # a half-written newer checkpoint must be ignored
    os.makedirs(os.path.join(resumed, "step_000003.tmp"))
    again = run_train(toy, resumed, "--max_iters=4", "--checkpoint_interval=2", "--resume=True", "--num_workers=1")
    assert [r["step"] for r in again] == [3, 4]
    for step in (3, 4):
        assert losses(again)[step] == pytest.approx(losses(records)[step], rel=1e-6, abs=1e-7)
    assert losses(records)[4] != pytest.approx(losses(records)[2], rel=1e-6)  # the model did move


def test_grad_cache_gives_the_plain_gradients(toy, straight, tmp_path):
    _, plain = straight
    # under FSDP2 on two ranks: chunked re-forward, gradient sync on the last chunk only
    # (with activation checkpointing too: recomputing each decoder layer changes no number)
    cached = run_train(toy, str(tmp_path / "gc"), "--max_iters=4", "--checkpoint_interval=100", "--grad_cache_chunk=3",
                       "--activation_checkpointing=True", nproc=2)
    assert_same_run(plain, cached)


def test_two_gloo_ranks_equal_one_process(toy, straight, tmp_path):
    _, one = straight
    two = run_train(toy, str(tmp_path / "ddp"), "--max_iters=4", "--checkpoint_interval=2", nproc=2)
    assert_same_run(one, two)
    # the sharded checkpoint written by two ranks loads in one process to the same weights
    from model import load_embedder
    single, _ = load_embedder(os.path.join(straight[0], "step_000002"))
    sharded, info = load_embedder(str(tmp_path / "ddp" / "step_000002"))
    assert info["world_size"] == 2
    for (name, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=5e-5, msg=name)  # Adam amplifies float noise


def test_stage_two_from_stage_one_and_export(toy, straight, tmp_path):
    from transformers import AutoModelForImageTextToText
    from lora import merge_lora
    from model import Embedder, load_embedder
    stage1_step = os.path.join(straight[0], "step_000002")
    out = str(tmp_path / "stage2")
    records = run_train(toy, out, f"--init_from={stage1_step}", "--max_iters=2", "--checkpoint_interval=2",
                        "--lora_rank=0", "--similarity='dot'", "--temperature=6.4", "--learning_rate=1e-3")
    assert len(records) == 2 and all(r["loss"] > 0 for r in records)
    stage2, info = load_embedder(os.path.join(out, "step_000002"))
    assert info["lora_rank"] == 0 and info["similarity"] == "dot" and info["backbone"] == toy["checkpoint"]
    exported = Embedder.from_pretrained(os.path.join(out, "export"))
    items = [{"text": "a red circle", "image": None},
             {"text": "<|image_1|> what shape?", "image": os.path.join(toy["images"], sorted_image(toy))}]
    torch.testing.assert_close(exported.encode(items), stage2.encode(items), atol=1e-5, rtol=0)
    # plain transformers loads the export with the same weights and no missing keys
    full = AutoModelForImageTextToText.from_pretrained(os.path.join(out, "export"))
    for name, value in exported.model.state_dict().items():
        torch.testing.assert_close(full.model.state_dict()[name], value, msg=name)
    # Stage II trained the language model: it differs from the Stage I weights, the vision tower does not
    stage1, _ = load_embedder(stage1_step)
    merge_lora(stage1)
    assert not torch.equal(stage1.model.language_model.layers[0].mlp.up_proj.weight,
                           stage2.model.language_model.layers[0].mlp.up_proj.weight)
    for (name, a), (_, b) in zip(stage1.model.visual.state_dict().items(), stage2.model.visual.state_dict().items()):
        assert torch.equal(a, b), name


def sorted_image(toy):
    for folder, _, files in sorted(os.walk(toy["images"])):
        for name in sorted(files):
            return os.path.relpath(os.path.join(folder, name), toy["images"])


def test_non_finite_steps_are_skipped_then_stop_the_run(toy, tmp_path):
    # lr 1e30 makes the weights infinite after the first update: every later loss is non-finite
    out = str(tmp_path / "nan")
    stdout = run_train(toy, out, "--max_iters=8", "--checkpoint_interval=1", "--max_bad_steps=2",
                       "--learning_rate=1e30", "--warmup_ratio=0.0", "--grad_clip=0.0", expect_returncode=1)
    assert "update skipped (1 in a row, 1 in all)" in stdout and "stopping: 2 non-finite steps in a row" in stdout
    assert "step_000001" in stdout.splitlines()[-1]  # the message names the last good checkpoint
    with open(os.path.join(out, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert records[0]["bad_steps"] == 0 and records[-1]["bad_steps"] == 2
    assert not os.path.exists(os.path.join(out, "export"))
