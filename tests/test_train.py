"""End-to-end tests of train.py on the toy benchmark with a tiny Qwen3.5 (CPU), each through the real script:
resumed vs straight (past a broken checkpoint and undecodable images), GradCache vs plain, 2 gloo ranks vs 1
process, step folder vs exported folder (and its model card's snippet), and the runs that must stop or refuse."""
import json
import math
import os
import re
import shutil
import signal
import time

import pytest
import torch
from PIL import Image

from common import UserError
from tests.toyrun import assert_same_run, launch, losses, read_log, run_train


def test_the_straight_run_writes_checkpoints_export_curves_and_passes_over_bad_images(straight, toy):
    import plot
    out, records = straight
    assert sorted(os.listdir(out)) == ["config.json", "curves.png", "export", "log.jsonl", "step_000002",
                                       "step_000004"]
    assert records[0]["skipped_rows"] == len(toy["broken"]) >= 1  # found in the first batch, counted, passed over
    assert all(r["time"] > 0 and r["elapsed"] >= 0 for r in records)
    with Image.open(os.path.join(out, "curves.png")) as curves:  # seven panels, four a row
        assert curves.size == plot.grid_size(len(plot.CURVES), 4, (360, 240), "x")
    info = json.load(open(os.path.join(out, "step_000004", "pace.json")))
    assert os.path.isabs(info["backbone"])  # given relative, stored absolute: the folder loads from anywhere
    assert set(info["files"]) == set(os.listdir(os.path.join(out, "step_000004"))) - {"pace.json"}


def test_resume_reproduces_the_straight_run_past_a_broken_checkpoint(toy, straight, tmp_path):
    out, records = straight
    resumed = str(tmp_path / "resumed")
    shutil.copytree(out, resumed)
    shard = os.path.join(resumed, "step_000004", "__0_0.distcp")
    with open(shard, "r+b") as f:  # one byte changed, the size kept: only the checksum can tell
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.makedirs(os.path.join(resumed, "step_000003.tmp"))  # a checkpoint a crash left half-written
    returncode, output = launch(toy, resumed, "--max_iters=4", "--checkpoint_interval=2", "--resume=True",
                                "--num_workers=1")
    assert returncode == 0, output[-6000:]
    assert f"removed {resumed}/step_000003.tmp, left unfinished" in output
    assert re.search(r"step_000004: broken checkpoint, __0_0\.distcp has changed since it was written \(CRC-32\); "
                     r"trying the checkpoint before it", output)
    assert f"resumed from {resumed}/step_000002 at step 2" in output
    again = read_log(resumed)
    assert [r["step"] for r in again] == [1, 2, 3, 4]  # the log keeps steps 1-2, then the resumed 3-4
    for step in (3, 4):
        assert losses(again)[step] == pytest.approx(losses(records)[step], rel=1e-6, abs=1e-7)
        assert again[step - 1]["skipped_rows"] == records[step - 1]["skipped_rows"]  # the same rows passed over
    assert losses(records)[4] != pytest.approx(losses(records)[2], rel=1e-6)  # the model did move


def test_broken_step_folders_are_named_wherever_they_are_loaded(straight, tmp_path):
    from checkpoint import load_embedder
    import checkpoint
    cases = {"truncated shard": ("__0_0.distcp", lambda f: f.truncate(100), "__0_0.distcp is 100 bytes"),
             "empty RNG file": ("rng_rank0.pt", lambda f: f.truncate(0), "rng_rank0.pt is 0 bytes"),
             "half a pace.json": ("pace.json", lambda f: f.truncate(40), "cannot read pace.json")}
    for name, (file, damage, message) in cases.items():
        folder = str(tmp_path / name.replace(" ", "_"))
        shutil.copytree(os.path.join(straight[0], "step_000004"), folder)
        with open(os.path.join(folder, file), "r+b") as f:
            damage(f)
        with pytest.raises(UserError, match=re.escape(folder) + ": broken checkpoint, " + message):
            load_embedder(folder)  # --init_from of Stage II and eval.py
    hostile = tmp_path / "rng_rank0.pt"
    torch.save({"cpu": torch.get_rng_state(), "cuda": Exploit(tmp_path / "pwned")}, hostile)  # runs code on load
    with pytest.raises(UserError, match="cannot read the RNG states"):
        checkpoint.load_rng(str(hostile))
    assert not (tmp_path / "pwned").exists()


def test_a_hostile_step_folder_is_refused_not_run(straight, tiny_embedder, tmp_path):
    import pickle
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    import torch.distributed.checkpoint as dcp
    import checkpoint
    from checkpoint import load_embedder
    folder = tmp_path / "hostile"
    shutil.copytree(os.path.join(straight[0], "step_000002"), folder)
    with open(folder / ".metadata", "wb") as f:  # a .metadata whose pickle calls os.system
        pickle.dump(Exploit(tmp_path / "pwned_metadata"), f)
    info = json.load(open(folder / "pace.json"))  # its sender can record the new file's checksum too
    info["files"][".metadata"] = checkpoint.file_record(str(folder / ".metadata"))
    json.dump(info, open(folder / "pace.json", "w"))
    with pytest.raises(UserError, match=r"hostile: refusing its \.metadata: it asks for posix\.system"):
        load_embedder(str(folder))
    assert not (tmp_path / "pwned_metadata").exists()
    # a genuine .metadata, but a non-tensor entry (where the optimizer keeps lr, betas, ...) that runs code
    entries = str(tmp_path / "entries")
    dcp.save({"model": get_model_state_dict(tiny_embedder), "lr": Exploit(tmp_path / "pwned_entry")}, checkpoint_id=entries)
    with pytest.raises(UserError, match="entries: refusing its entry lr"):
        checkpoint.load_state({"model": get_model_state_dict(tiny_embedder), "lr": 0.1}, entries)
    assert not (tmp_path / "pwned_entry").exists()
    checkpoint.load_state({"model": get_model_state_dict(tiny_embedder)}, entries)  # the tensors alone load


class Exploit:
    """Unpickled, it creates a file: what a hostile checkpoint could do instead."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_fresh_run_over_an_earlier_runs_checkpoints_is_refused(toy, straight, tmp_path):
    earlier = str(tmp_path / "earlier")
    shutil.copytree(straight[0], earlier)
    os.makedirs(os.path.join(earlier, "step_000009.tmp"))
    output = run_train(toy, earlier, "--max_iters=2", expect_returncode=1)
    assert re.search(r"error: .*earlier holds an earlier run \(step_000002, step_000004, export\): continue it with "
                     r"--resume=True, write elsewhere with --out_dir=\.\.\., or start over with --overwrite=True", output)
    assert "Traceback" not in output  # a mistake to fix: one line, no traceback
    assert sorted(os.listdir(earlier))[-3:] == ["step_000002", "step_000004", "step_000009.tmp"]  # nothing touched
    run_train(toy, earlier, "--max_iters=1", "--overwrite=True", "--checkpoint_interval=1")
    assert sorted(p for p in os.listdir(earlier) if p.startswith("step_")) == ["step_000001"]
    assert [r["step"] for r in read_log(earlier)] == [1]  # a new log, not the old one continued


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
    assert two[0]["skipped_rows"] == one[0]["skipped_rows"]  # counted over both ranks
    # the sharded checkpoint written by two ranks loads in one process to the same weights
    from checkpoint import load_embedder
    single, _ = load_embedder(os.path.join(straight[0], "step_000002"))
    sharded, info = load_embedder(str(tmp_path / "ddp" / "step_000002"))
    assert info["world_size"] == 2 and len([f for f in info["files"] if f.endswith(".distcp")]) == 2
    for (name, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=5e-5, msg=name)  # Adam amplifies float noise


def test_stage_two_from_stage_one_and_its_export(toy, straight, tmp_path, monkeypatch):
    from transformers import AutoModelForImageTextToText
    from lora import merge_lora
    from checkpoint import load_embedder
    from model import Embedder
    stage1_step = os.path.join(straight[0], "step_000002")
    out = str(tmp_path / "stage2")
    records = run_train(toy, out, f"--init_from={stage1_step}", "--max_iters=2", "--checkpoint_interval=2",
                        "--lora_rank=0", "--similarity='dot'", "--temperature=6.4", "--learning_rate=1e-3")
    assert len(records) == 2 and all(r["loss"] > 0 for r in records)
    monkeypatch.chdir(tmp_path)  # step folders load from anywhere
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
    # the model card names the similarity, and its plain-transformers snippet gives Embedder's embeddings
    card = open(os.path.join(out, "export", "README.md")).read()
    assert "## Similarity: dot product" in card and "query @ candidate" in card
    snippet = card.split("```python\n")[1].split("```")[0]
    namespace = {}
    exec(snippet, namespace)  # noqa: S102 - the card's own code, run as a reader would
    expected = exported.encode([{"text": "Find the caption that best describes this picture: a red circle",
                                 "image": None}, {"text": "a red circle", "image": None}])
    torch.testing.assert_close(namespace["query"], expected[0], atol=1e-4, rtol=1e-4)
    assert namespace["score"].item() == pytest.approx((expected[0] @ expected[1]).item(), rel=1e-4)
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
            if os.path.join(folder, name) not in toy["broken"]:
                return os.path.relpath(os.path.join(folder, name), toy["images"])


def test_a_checkpoint_whose_weights_break_the_next_step_is_not_called_good(toy, straight, tmp_path):
    # from step 2's good weights, dot logits at lr 1e30: step 3's update leaves weights that are finite but give NaN
    # embeddings at step 4. The run stops, step 3's checkpoint moves aside, and the stop names step 2, counting
    # steps as the log lines do
    out = str(tmp_path / "nan")
    shutil.copytree(straight[0], out)
    shutil.rmtree(os.path.join(out, "step_000004"))
    output = run_train(toy, out, "--max_iters=8", "--checkpoint_interval=1", "--max_bad_steps=2", "--resume=True",
                       "--learning_rate=1e30", "--warmup_ratio=0.0", "--grad_clip=0.0", "--similarity='dot'",
                       "--temperature=6.4", "--allow_config_change=True", expect_returncode=1)
    assert "step 4/8: a non-finite loss or gradient" in output and "update skipped (1 in a row, 1 in all)" in output
    assert "step 4: no checkpoint written: a non-finite loss or gradient" in output
    assert f"moved {out}/step_000003 aside to {out}/step_000003.suspect: its weights led to step 4" in output
    assert f"stopping: 2 bad steps in a row from step 4; the last good checkpoint is {out}/step_000002" in output
    records = read_log(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and records[-1]["bad_steps"] == 2
    assert sorted(p for p in os.listdir(out) if p.startswith("step_")) == ["step_000002", "step_000003.suspect"]


def test_collapsed_embeddings_stop_the_run_and_their_checkpoint_moves_aside(toy, tmp_path):
    # cosine logits at lr 1e3: within a few steps every embedding falls onto one vector (every logit of a query
    # alike: loss = ln of the candidate count, gradient about 0); training on would save and export a dead model
    out = str(tmp_path / "collapse")
    output = run_train(toy, out, "--max_iters=8", "--checkpoint_interval=1", "--max_bad_steps=2",
                       "--learning_rate=1e3", "--warmup_ratio=0.0", "--grad_clip=0.0", expect_returncode=1)
    first = int(re.search(r"step (\d)/8: collapsed embeddings \(every logit of a query alike\)", output).group(1))
    assert first >= 2 and math.log(24) == pytest.approx(read_log(out)[-1]["loss"], rel=1e-4)  # 8 positives + 16 negatives
    suspect = f"{out}/step_{first - 1:06d}"  # saved after the update that collapsed the model
    assert f"moved {suspect} aside to {suspect}.suspect: its weights led to step {first}" in output
    good = f"{out}/step_{first - 2:06d}" if first > 2 else "none"
    assert f"stopping: 2 bad steps in a row from step {first}; the last good checkpoint is {good}" in output
    assert not os.path.exists(os.path.join(out, "export"))


@pytest.mark.parametrize("weighting", ["random", "query_negative"])
def test_figure_6b_weightings_train_and_kept_checkpoints_survive_pruning(toy, tmp_path, weighting):
    out = str(tmp_path / weighting)
    returncode, output = launch(toy, out, "--max_iters=4", f"--weighting='{weighting}'", "--checkpoint_interval=1",
                                "--keep_last=1", "--keep_checkpoints=[1, 2]")
    assert returncode == 0, output[-6000:]
    records = read_log(out)
    assert len(records) == 4 and all(math.isfinite(r["loss"]) for r in records)
    assert records[0]["weight_min"] < records[0]["weight_max"]  # the weights differ between queries
    # Figure 6(a)'s transition checkpoints: kept through pruning, as config/stage1.py keeps 2,000, 4,000 and 7,847
    assert sorted(p for p in os.listdir(out) if p.startswith("step_")) == ["step_000001", "step_000002", "step_000004"]
    assert "instructions='paper': 120 not of an MMEB dataset (kept)" in output  # the toy is no MMEB dataset
    assert json.load(open(os.path.join(out, "export", "pace.json")))["config"]["weighting"] == weighting


def test_adamw_is_fused_only_where_it_is_safe():
    from train_step import adamw_options
    assert adamw_options("2.11.0+cu130", "cuda", True) == {"foreach": True}  # FSDP2 DTensors: fused leaks there
    assert adamw_options("2.10.1", "cuda", True) == {"foreach": True}
    assert adamw_options("2.11.0", "cuda", False) == {"fused": True}  # one GPU, plain tensors
    assert adamw_options("2.12.0", "cuda", True) == {"fused": True} == adamw_options("2.13.1+cu128", "cuda", True)
    assert adamw_options("2.13.0+cpu", "cpu", False) == {"foreach": True} == adamw_options("2.9.1", "cpu", True)
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **adamw_options(torch.__version__, "cpu", False))


def test_only_finite_weights_count_as_checkpointable():
    from train_step import parameters_finite
    weights = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    assert parameters_finite(weights)
    with torch.no_grad():
        weights[1][0, 1] = math.inf
    assert not parameters_finite(weights)
    with torch.no_grad():
        weights[1][0, 1] = math.nan
    assert not parameters_finite(weights)


def rank_process(out_dir, local_rank):
    """The pid of the train.py process of this local rank writing to out_dir (read from /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            environment = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"train.py") for part in command) and f"--out_dir={out_dir}".encode() in command \
                and f"LOCAL_RANK={local_rank}".encode() in environment:
            return int(pid)
    raise AssertionError(f"no rank {local_rank} process for {out_dir}")


def test_a_stopped_rank_ends_the_run_with_a_message_naming_it(toy, tmp_path):
    out = str(tmp_path / "stuck")
    run = launch(toy, out, "--max_iters=1000", "--checkpoint_interval=1000", "--timeout_minutes=0.1", nproc=2, popen=True)
    output, stopped, started = [], None, time.time()
    try:
        for line in run.stdout:
            output.append(line)
            if line.startswith("step 2/1000 |") and stopped is None:
                stopped = rank_process(out, 1)
                os.kill(stopped, signal.SIGSTOP)  # as a frozen GPU or a swapped-out node would
            if "error: rank 0" in line:  # torchrun may prefix a rank's lines with "[rank0]: "
                break
    finally:
        if stopped:
            os.kill(stopped, signal.SIGKILL)
        run.wait(timeout=120)
    text = "".join(output)
    assert stopped and run.returncode != 0, text[-4000:]
    assert "error: rank 0: a collective waited longer than timeout_minutes for another rank; rank 1 does not answer" \
        in text, text[-4000:]
    assert time.time() - started < 120  # 6 s of timeout and 6 s of asking, not torch's default 30 minutes


def test_resume_reproduces_a_run_that_draws_random_numbers(toy, tmp_path):
    # weighting='random' draws every step's query weights from torch's RNG: the resumed run must draw what the
    # straight run drew (the DataLoader has its own generator, so starting it takes nothing from that RNG)
    out = str(tmp_path / "random")
    straight = run_train(toy, out, "--max_iters=4", "--checkpoint_interval=2", "--weighting='random'")
    shutil.rmtree(os.path.join(out, "step_000004"))
    shutil.rmtree(os.path.join(out, "export"))
    again = run_train(toy, out, "--max_iters=4", "--checkpoint_interval=2", "--weighting='random'", "--resume=True")
    for step in (3, 4):
        assert losses(again)[step] == pytest.approx(losses(straight)[step], rel=1e-6, abs=1e-7)
        assert again[step - 1]["weight_max"] == pytest.approx(straight[step - 1]["weight_max"], rel=1e-6)
