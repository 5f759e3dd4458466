"""
train.py as only whole runs show it, on the toy benchmark with a tiny Qwen3.5 (CPU), each through the real script:
the straight run (checkpoints, export, undecodable images passed over), 2 gloo ranks with GradCache preempted by
SIGTERM and resumed vs one plain process, Ctrl-C under more signals with time-based checkpoints, then a resume past
a broken checkpoint vs the straight run (the RNG restored), Stage II from a Stage I step folder and its export's
model card, a run whose weights break, a finished run left alone. What a function shows (the lock, the refusals,
the resume check, the loaders) is tests/test_runs.py's; the step's equivalences are tested in process here too.

    python -m pytest -q tests/test_train.py
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.toyrun import ROOT, assert_same_run, kill_group, launch, losses, read_log, run_train
from runs import checkpoint, outdir

slow = pytest.mark.slow


def lines_until(process, pattern, output, timeout=120):
    """Read the process's merged output into `output` until a line matches pattern. -> that line. A run that
    prints no such line within timeout (or ends first) is killed with every process it started, and the test fails
    with its output."""
    watchdog = threading.Timer(timeout, kill_group, [process])  # a run silent for ever cannot block the read
    watchdog.start()
    try:
        for line in process.stdout:
            output.append(line)
            if re.search(pattern, line):
                return line
    finally:
        watchdog.cancel()
    kill_group(process)
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n" + "".join(output)[-4000:])


def finish(process, output, timeout=120):
    """The rest of the process's output, once it ends (killed, and the test failed, if not within timeout)."""
    watchdog = threading.Timer(timeout, kill_group, [process])
    watchdog.start()
    try:
        output += process.stdout.readlines()
        process.wait()
    finally:
        watchdog.cancel()
    return "".join(output)


@slow
def test_the_straight_run_writes_checkpoints_export_and_passes_over_bad_images(straight, toy):
    out, records = straight
    assert sorted(os.listdir(out)) == ["config.json", "export", "log.jsonl", "step_000002", "step_000004"]
    assert records[0]["skipped_rows"] == len(toy["broken"]) >= 1  # found in the first batch, counted, passed over
    assert all(r["time"] > 0 and r["elapsed"] >= 0 for r in records)
    step = os.path.join(out, "step_000004")
    info = json.load(open(os.path.join(step, "pace.json")))
    assert set(info["files"]) == set(os.listdir(step)) - {"pace.json"}  # the spec too is checksummed
    assert os.path.isfile(info["table"]) and info["table"].startswith(os.path.join(toy["root"], "tables"))
    spec = json.load(open(os.path.join(step, "embedding_spec.json")))
    assert os.path.isabs(spec["backbone"])  # given relative, stored absolute: the folder loads from anywhere
    assert spec == json.load(open(os.path.join(out, "export", "embedding_spec.json")))  # the export means the same
    assert (spec["similarity"], spec["max_pixels"], spec["max_length"]) == ("cos", 4096, 512)


@slow
def test_two_ranks_with_grad_cache_preempted_then_resumed_on_one_equal_one_plain_process(toy, straight, tmp_path):
    # one torchrun launch shows three equivalences: FSDP2 on two gloo ranks against one process; GradCache (chunked
    # re-forward, gradient sync on the last chunk only, with activation checkpointing) against the plain step; and
    # a SIGTERM to torchrun (as a scheduler preempts) saving the step in progress. The resume runs in one process:
    # a run may resume on another number of ranks (its global batches do not depend on it), and the checkpoint two
    # ranks wrote loads in one
    out, output = str(tmp_path / "preempted"), []
    args = ["--max_iters=4", "--checkpoint_interval=100", "--checkpoint_minutes=0", "--num_workers=1",
            "--grad_cache_chunk=3", "--activation_checkpointing=True"]
    run = launch(toy, out, *args, nproc=2, popen=True)
    lines_until(run, r"step 1/4 \|", output)
    run.send_signal(signal.SIGTERM)  # torchrun forwards it to both ranks' process groups, DataLoader workers too
    text = finish(run, output)
    stopped = int(re.search(r"stopped at step (\d) on SIGTERM", text).group(1))
    assert run.returncode != 0 and stopped < 4, text[-3000:]  # torchrun reports its workers' exit code 75
    assert f"(exit code {outdir.EXIT_RESUME})" in text and "--resume=True" in text
    saved = checkpoint.complete(out)
    assert [os.path.basename(p) for p in saved] == [f"step_{stopped:06d}"] and checkpoint.verify(saved[0])
    info = checkpoint.read_info(saved[0])
    assert info["world_size"] == 2 and len([f for f in info["files"] if f.endswith(".distcp")]) == 2
    assert not os.path.exists(os.path.join(out, "export")) and not os.path.exists(os.path.join(out, outdir.LOCK))
    resumed = run_train(toy, out, *args, "--resume=True")
    assert_same_run(straight[1], resumed)  # the same losses, step by step, as the uninterrupted plain run
    assert resumed[0]["skipped_rows"] == straight[1][0]["skipped_rows"]  # counted over both ranks
    from runs.export import load_embedder  # the export: the straight run's weights (Adam amplifies float noise)
    for (name, a), (other, b) in zip(load_embedder(os.path.join(straight[0], "export"))[0].state_dict().items(),
                                     load_embedder(os.path.join(out, "export"))[0].state_dict().items(), strict=True):
        assert name == other
        torch.testing.assert_close(a, b, rtol=1e-3, atol=5e-5, msg=name)


@slow
def test_ctrl_c_saves_and_the_resume_past_a_broken_checkpoint_is_the_straight_run(toy, straight_random, tmp_path):
    # Ctrl-C and more signals during the save, time-based checkpoints, then a resume past a checkpoint whose shard
    # has one byte changed and a .tmp a crash left. weighting='random' draws every step's query weights from torch's
    # RNG: the resumed run must draw what the straight run drew (the DataLoader has its own generator, so starting
    # it takes nothing from that RNG)
    out, output = str(tmp_path / "interrupted"), []
    run = launch(toy, out, "--max_iters=4", "--checkpoint_interval=100", "--checkpoint_minutes=0.0001",
                 "--keep_last=10", "--num_workers=1", "--weighting='random'", popen=True)
    lines_until(run, r"step 2/4 \|", output)
    run.send_signal(signal.SIGINT)
    lines_until(run, r"saving .*step_00000\d", output)
    for _ in range(3):  # more signals while the checkpoint is written: noted, nothing cut short
        run.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    text = finish(run, output)
    assert run.returncode == outdir.EXIT_RESUME, text[-3000:]
    assert "SIGINT: finishing this step" in text and "Ctrl-C again stops at once" in text
    assert "SIGTERM again" in text and "Traceback" not in text
    stopped = int(re.search(r"stopped at step (\d) on SIGINT", text).group(1))
    steps = [int(p[-6:]) for p in checkpoint.complete(out)]
    assert steps == list(range(1, stopped + 1))  # checkpoint_minutes elapsed after every step: each one saved
    assert all(checkpoint.verify(p) for p in checkpoint.complete(out))
    shard = os.path.join(checkpoint.step_path(out, stopped), "__0_0.distcp")
    with open(shard, "r+b") as f:  # one byte changed, the size kept: only the checksum can tell
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.makedirs(checkpoint.step_path(out, 9) + ".tmp")  # a checkpoint a crash left half-written
    code, text = launch(toy, out, "--max_iters=4", "--checkpoint_interval=100", "--resume=True", "--num_workers=1",
                        "--weighting='random'")
    assert code == 0, text[-6000:]
    assert f"removed {checkpoint.step_path(out, 9)}.tmp" in text
    assert re.search(rf"step_{stopped:06d}: .*__0_0\.distcp.*CRC-32.*trying the checkpoint before it", text)
    assert f"resumed from {checkpoint.step_path(out, stopped - 1)} at step {stopped - 1}" in text
    resumed = read_log(out)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the log keeps the steps before, then the resumed ones
    assert_same_run(straight_random[1], resumed)
    for a, b in zip(straight_random[1], resumed):  # the random weights drawn, the rows passed over: the same
        assert b["weight_max"] == pytest.approx(a["weight_max"], rel=1e-6)
        assert b["skipped_rows"] == a["skipped_rows"]
    assert losses(resumed)[4] != pytest.approx(losses(resumed)[2], rel=1e-6)  # the model did move


def sorted_image(toy):
    for folder, _, files in sorted(os.walk(toy["images"])):
        for name in sorted(files):
            if os.path.join(folder, name) not in toy["broken"]:
                return os.path.relpath(os.path.join(folder, name), toy["images"])


@slow
def test_stage_two_from_stage_one_and_its_export(toy, straight, tmp_path, monkeypatch):
    from transformers import AutoModelForImageTextToText
    from lora import merge_lora
    from model import Embedder
    from runs.export import load_embedder
    stage1_step = os.path.join(straight[0], "step_000002")
    out = str(tmp_path / "stage2")
    records = run_train(toy, out, f"--init_from={stage1_step}", "--max_iters=2", "--checkpoint_interval=2",
                        "--lora_rank=0", "--similarity='dot'", "--temperature=6.4", "--learning_rate=1e-3")
    assert len(records) == 2 and all(r["loss"] > 0 for r in records)
    monkeypatch.chdir(tmp_path)  # step folders load from anywhere
    stage2, info = load_embedder(os.path.join(out, "step_000002"))
    assert info["lora_rank"] == 0 and stage2.spec.similarity == "dot" and stage2.spec.backbone == toy["checkpoint"]
    exported = Embedder.from_pretrained(os.path.join(out, "export"))
    assert exported.spec == stage2.spec  # the export holds the spec: dot, the budgets, the backbone
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
    snippet = card.split("```python\n")[2].split("```")[0]
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
    for (name, a), (other, b) in zip(stage1.model.visual.state_dict().items(), stage2.model.visual.state_dict().items(),
                                     strict=True):
        assert name == other and torch.equal(a, b), name


@slow
def test_stage_two_keeps_stage_ones_spec_where_its_config_is_silent_and_says_what_changed(toy, tmp_path):
    code, said = launch(toy, str(tmp_path / "stage1"), "--pooling='mean'", "--matryoshka_dims=16", "--max_iters=1",
                        "--checkpoint_interval=1")  # a mean-pooled Stage I, given to Stage I alone
    assert code == 0, said[-3000:]
    step = str(tmp_path / "stage1" / "step_000001")
    code, said = launch(toy, str(tmp_path / "stage2"), f"--init_from={step}", "--similarity='dot'", "--max_iters=1",
                        "--lora_rank=0")  # Stage II given only its similarity: it trains and exports mean pooling
    assert code == 0, said[-3000:]
    exported = json.load(open(tmp_path / "stage2" / "export" / "embedding_spec.json"))
    assert (exported["pooling"], exported["matryoshka_dims"], exported["similarity"]) == ("mean", [16], "dot")
    assert (f"spec against {step}'s: pooling 'mean' kept (the config's default is 'last_token'), similarity 'cos' "
            "-> 'dot', matryoshka_dims (16,) kept (the config's default is ())\n") in said, said[-3000:]
    assert re.search(r"^pooling += 'mean'", said, re.M) and re.search(r"^similarity += 'dot'", said, re.M)
    code, said = launch(toy, str(tmp_path / "stage2b"), f"--init_from={step}", "--pooling='last_token'",
                        "--check_data=True")  # a choice the config makes, even the default, is the config's
    assert code == 0 and "pooling 'mean' -> 'last_token'" in said and re.search(r"^pooling += 'last_token'", said,
                                                                               re.M), said[-3000:]


@slow
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
    assert re.search(rf"2 bad steps in a row from step 4; the last good checkpoint is {out}/step_000002", output)
    records = read_log(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and records[-1]["bad_steps"] == 2
    assert sorted(p for p in os.listdir(out) if p.startswith("step_")) == ["step_000002", "step_000003.suspect"]


@slow
def test_a_resume_of_a_finished_run_changes_nothing(toy, straight, tmp_path):
    out = str(tmp_path / "finished")
    shutil.copytree(straight[0], out)
    card = os.path.join(out, "export", "README.md")
    with open(card, "a") as f:
        f.write("\nthe evaluation table eval.py wrote\n")
    before = {name: os.path.getmtime(os.path.join(out, name)) for name in ("export", "log.jsonl", "config.json")}
    code, text = launch(toy, out, "--max_iters=4", "--resume=True")
    assert code == 0 and f"{out} finished at step 4 and is exported: nothing to do" in text
    assert open(card).read().endswith("the evaluation table eval.py wrote\n")
    assert before == {name: os.path.getmtime(os.path.join(out, name)) for name in before}


@slow
def test_check_data_refuses_what_the_run_refuses_before_its_first_step_in_the_same_words(toy, straight, tmp_path):
    earlier = str(tmp_path / "earlier")
    shutil.copytree(straight[0], earlier)
    failures = [  # (out_dir, arguments, the refusal both must print)
        (str(tmp_path / "groups"), ["--homogeneous_batch=3"],
         "homogeneous_batch=3 does not divide a rank's 8 queries (batch_size=8 over 1 ranks): use one of 1, 2, 4, 8"),
        (str(tmp_path / "missing"), ["--init_from=no/such/backbone"], "'no/such/backbone' does not exist"),
        (earlier, [], f"{earlier} holds an earlier run (step_000002, step_000004, export)")]
    for out, args, refusal in failures:
        code, check = launch(toy, out, *args, "--check_data=True")
        assert code == 1 and "the run would NOT start" in check and refusal in check, check[-3000:]
        assert check.index("check_data:") > check.index("init_from"), "the resolved config comes before the verdict"
        code, run = launch(toy, out, *args, "--max_iters=1")
        assert code != 0 and refusal in run and "step 1" not in run, run[-3000:]
    code, check = launch(toy, str(tmp_path / "fine"), "--homogeneous_batch=4", "--check_data=True")
    assert code == 0 and "on 1 rank(s); the run would start" in check, check[-3000:]
    assert check.index("mixture: 1 sources") < check.index("init_from") < check.index("check_data:")
    code, run = launch(toy, str(tmp_path / "fine"), "--homogeneous_batch=4", "--max_iters=1")
    assert code == 0 and run.index("mixture: 1 sources, same-source groups of 4") < run.index("step 1"), run[-3000:]


# -----------------------------------------------------------------------------
# the step, in this process

def toy_batch(toy, preprocessor, num_rows=6, max_items=3, tmp_path=None):
    """A collated batch of the toy's first rows, as train.py's DataLoader gives it (two negatives a row)."""
    import data
    from tests.rows import train_dataset
    dataset = train_dataset(tmp_path, preprocessor, toy["train"], toy["images"], 2, seed=0, skip_bad_rows=True)
    return data.collate_train(preprocessor, max_items)([dataset[i] for i in range(num_rows)])


@pytest.mark.parametrize("similarity,temperature,family", [("cos", 0.1, "qwen3_5"), ("dot", 6.4, "qwen3_5"),
                                                            ("dot", 6.4, "qwen3_vl")])
def test_grad_cache_gives_the_plain_gradients(toy, tiny_checkpoints, tmp_path, similarity, temperature, family):
    import lora
    import train_step
    from model import Embedder
    embedder = Embedder.from_pretrained(tiny_checkpoints[family], max_pixels=4096, max_length=512)
    torch.manual_seed(0)
    lora.inject_lora(embedder.model, 4, 8, dropout=0.1)  # dropout: the re-forward must replay the same masks
    for module in embedder.modules():
        if isinstance(module, lora.LoRALinear):
            torch.nn.init.normal_(module.lora_B, std=0.1)
    embedder.train()
    loss_args = dict(similarity=similarity, temperature=temperature, focal_gamma=2.0, focal_temperature=0.1,
                     weighting="focal")
    trainable = train_step.trainable_parameters(embedder)
    gradients = {}
    batch = toy_batch(toy, embedder.preprocessor, max_items=3, tmp_path=tmp_path)  # the same chunks both ways
    for chunk in (0, 3):
        torch.manual_seed(1)
        terms = train_step.forward_backward(embedder, batch, loss_args, grad_cache_chunk=chunk)
        gradients[chunk] = ([p.grad.clone() for p in trainable], terms.loss.item())
        embedder.zero_grad(set_to_none=True)
    (plain, plain_loss), (cached, cached_loss) = gradients[0], gradients[3]
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert sum(g.abs().sum() for g in plain) > 0  # there is a gradient to compare
    for a, b in zip(plain, cached):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_adamw_is_fused_only_where_it_is_safe():
    from train_step import adamw_options
    assert adamw_options("2.11.0+cu130", "cuda", True) == {"foreach": True}  # FSDP2 DTensors: fused leaks there
    assert adamw_options("2.10.1", "cuda", True) == {"foreach": True}
    assert adamw_options("2.11.0", "cuda", False) == {"fused": True}  # one GPU, plain tensors
    assert adamw_options("2.12.0", "cuda", True) == {"fused": True} == adamw_options("2.13.1+cu128", "cuda", True)
    assert adamw_options("2.13.0+cpu", "cpu", False) == {"foreach": True} == adamw_options("2.9.1", "cpu", True)
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **adamw_options(torch.__version__, "cpu", False))


def test_only_finite_weights_count_as_checkpointable():
    import math
    from train_step import parameters_finite
    weights = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    assert parameters_finite(weights)
    with torch.no_grad():
        weights[1][0, 1] = math.inf
    assert not parameters_finite(weights)
    with torch.no_grad():
        weights[1][0, 1] = math.nan
    assert not parameters_finite(weights)


@slow
def test_a_collective_that_waits_on_a_stopped_rank_ends_naming_it(tmp_path):
    # two processes of tests/dist_timeout_check.py: rank 1 stops answering, rank 0's all-reduce times out after 3 s
    # and the error hook names the rank, in one line (not torch's default 30-minute hang)
    from tests.toyrun import free_port
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.dist_timeout_check"], cwd=ROOT, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r in range(2)]
    try:
        _, stderr = ranks[0].communicate(timeout=60)
    except subprocess.TimeoutExpired:
        ranks[0].kill()
        pytest.fail(f"rank 0 did not end on its 3 s timeout within 60 s:\n{ranks[0].communicate()[1][-4000:]}")
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert ranks[0].returncode != 0
    last = stderr.strip().splitlines()[-1]  # torch prefixes a rank's lines with "[rank0]: "
    assert last.endswith("rank 0: a collective waited longer than timeout_minutes for another rank; rank 1 does not "
                         "answer: stopped, dead or stuck") and "error: " in last
    assert "rank 1 does not answer" in stderr and "Traceback" not in stderr


@slow
def test_a_backbone_saved_by_transformers_5_trains_resumes_and_exports(toy, straight, tmp_path):
    # transformers 5 saves the processor settings as one processor_config.json (image and video processor nested),
    # not preprocessor_config.json: the run, its resume and its export must read and write that layout, and the
    # export carry the spec's pixel budget in it, as the straight run's carries it in preprocessor_config.json
    from model import Embedder
    from runs.export import load_embedder
    from shapes.tiny_model import make_tiny_checkpoint
    backbone = make_tiny_checkpoint(str(tmp_path / "tiny-consolidated"), seed=0, consolidated=True)
    assert not os.path.exists(os.path.join(backbone, "preprocessor_config.json"))
    out = str(tmp_path / "consolidated")
    run_train(toy, out, "--max_iters=4", "--checkpoint_interval=2", f"--init_from={backbone}")
    shutil.rmtree(os.path.join(out, "step_000004"))  # as if stopped after step 2: the resume trains steps 3 and 4
    shutil.rmtree(os.path.join(out, "export"))
    code, text = launch(toy, out, "--max_iters=4", "--checkpoint_interval=2", f"--init_from={backbone}", "--resume=True")
    assert code == 0 and "resumed from" in text, text[-4000:]
    assert_same_run(straight[1], read_log(out))  # the same weights in the other layout: the same run
    export = os.path.join(out, "export")
    with open(os.path.join(export, "processor_config.json")) as f:
        assert json.load(f)["image_processor"]["size"] == {"shortest_edge": 1024, "longest_edge": 4096}
    with open(os.path.join(straight[0], "export", "preprocessor_config.json")) as f:
        assert json.load(f)["size"] == {"shortest_edge": 1024, "longest_edge": 4096}
    exported = Embedder.from_pretrained(export)
    assert exported.preprocessor.vision["image"].size["longest_edge"] == 4096 == exported.spec.max_pixels
    image = next(os.path.join(d, f) for d, _, fs in sorted(os.walk(toy["images"])) for f in sorted(fs)
                 if os.path.join(d, f) not in toy["broken"])
    items = [{"text": "a red circle", "image": None}, {"text": "<|image_1|> what shape?", "image": image}]
    step, _ = load_embedder(os.path.join(out, "step_000004"))
    torch.testing.assert_close(exported.encode(items), step.encode(items), atol=1e-5, rtol=0)


def wait_for_step(out, step, process, timeout=120):
    """Wait until the run's log.jsonl holds `step` (its output may go nowhere); kill it and fail if it ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(os.path.join(out, "log.jsonl")) and len(read_log(out)) >= step:
            return
        time.sleep(0.2)
    kill_group(process)
    raise AssertionError(f"the run ended (code {process.returncode}) or stalled before step {step}")


@slow
def test_a_stop_signal_saves_and_exits_75_whatever_became_of_the_output(toy, tmp_path):
    # `python train.py ... | tee log`: Ctrl-C ends tee as well, so the stop's own lines meet a pipe with no reader.
    # And output to a full disk (/dev/full), with SIGHUP, the signal of a terminal that went away
    out, output = str(tmp_path / "piped"), []
    run = launch(toy, out, "--max_iters=40", "--checkpoint_interval=100", popen=True)
    lines_until(run, r"step 2/40 \|", output)
    run.stdout.close()  # tee is gone
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=120) == outdir.EXIT_RESUME
    assert checkpoint.complete(out) and all(checkpoint.verify(p) for p in checkpoint.complete(out))
    out = str(tmp_path / "full_disk")
    with open("/dev/full", "w") as full:
        run = launch(toy, out, "--max_iters=40", "--checkpoint_interval=100", popen=True, output=full)
    wait_for_step(out, 2, run)
    run.send_signal(signal.SIGHUP)
    assert run.wait(timeout=120) == outdir.EXIT_RESUME
    saved = checkpoint.complete(out)
    assert saved and int(saved[-1][-6:]) == len(read_log(out)) and checkpoint.verify(saved[-1])
