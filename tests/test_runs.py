"""
Runs that survive a cluster (runs.py, train.py, eval.py, checkpoint.py, cluster/pace.sbatch): a stop signal to a
2-rank torchrun or Ctrl-C to one process saves at the step in progress and the resume equals the straight run,
time-based checkpoints, one run per out_dir, what a resume may change, a finished run left alone, an export whose
config states the dtype its weights are in, an evaluation that resumes after a kill, and the SLURM script.

    python -m pytest -q tests/test_runs.py
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import torch

import checkpoint
import runs
from tests.toyrun import ROOT, assert_same_run, launch, run_train, script_defaults


def lines_until(process, pattern, output, timeout=120):
    """Read the process's merged output into `output` until a line matches pattern. -> that line"""
    start = time.time()
    for line in process.stdout:
        output.append(line)
        if re.search(pattern, line):
            return line
        if time.time() - start > timeout:
            break
    raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(output)[-4000:])


def finish(process, output):
    output += process.stdout.readlines()
    process.wait(timeout=120)
    return "".join(output)


def test_sigterm_to_torchrun_saves_the_step_in_progress_and_the_resume_is_the_straight_run(toy, straight, tmp_path):
    out, output = str(tmp_path / "preempted"), []
    run = launch(toy, out, "--max_iters=4", "--checkpoint_interval=100", "--checkpoint_minutes=0", "--num_workers=1",
                 nproc=2, popen=True)
    lines_until(run, r"step 1/4 \|", output)
    run.send_signal(signal.SIGTERM)  # torchrun forwards it to both ranks' process groups, DataLoader workers too
    text = finish(run, output)
    stopped = int(re.search(r"stopped at step (\d) on SIGTERM", text).group(1))
    assert run.returncode != 0 and stopped < 4, text[-3000:]  # torchrun reports its workers' exit code 75
    assert f"continue with --resume=True (exit code {runs.EXIT_RESUME})" in text
    saved = checkpoint.complete(out)
    assert [os.path.basename(p) for p in saved] == [f"step_{stopped:06d}"] and checkpoint.verify(saved[0])
    assert not os.path.exists(os.path.join(out, "export")) and not os.path.exists(os.path.join(out, runs.LOCK))
    resumed = run_train(toy, out, "--max_iters=4", "--checkpoint_interval=100", "--checkpoint_minutes=0", "--resume=True",
                        "--num_workers=1", nproc=2)
    assert_same_run(straight[1], resumed)  # the same losses, step by step, as the uninterrupted run


def test_ctrl_c_saves_even_under_more_signals_and_time_based_checkpoints_are_written(toy, straight, tmp_path):
    out, output = str(tmp_path / "interrupted"), []
    run = launch(toy, out, "--max_iters=4", "--checkpoint_interval=100", "--checkpoint_minutes=0.0001",
                 "--keep_last=10", "--num_workers=1", popen=True)
    lines_until(run, r"step 2/4 \|", output)
    run.send_signal(signal.SIGINT)
    lines_until(run, r"saving .*step_00000\d", output)
    for _ in range(3):  # more signals while the checkpoint is written: noted, nothing cut short
        run.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    text = finish(run, output)
    assert run.returncode == runs.EXIT_RESUME, text[-3000:]
    assert "SIGINT: finishing this step, then writing a checkpoint and stopping (Ctrl-C again stops at once)" in text
    assert "SIGTERM again: still finishing the step and the checkpoint" in text and "Traceback" not in text
    stopped = int(re.search(r"stopped at step (\d) on SIGINT", text).group(1))
    steps = [int(p[-6:]) for p in checkpoint.complete(out)]
    assert steps == list(range(1, stopped + 1))  # checkpoint_minutes elapsed after every step: each one saved
    assert all(checkpoint.verify(p) for p in checkpoint.complete(out))
    resumed = run_train(toy, out, "--max_iters=4", "--checkpoint_interval=100", "--resume=True", "--num_workers=1")
    assert_same_run(straight[1], resumed)


def test_one_run_per_out_dir(toy, tmp_path):
    out, output = str(tmp_path / "busy"), []
    first = launch(toy, out, "--max_iters=1000", "--checkpoint_interval=1000", popen=True)
    try:
        lines_until(first, r"step 1/1000 \|", output)
        code, text = launch(toy, out, "--max_iters=1", "--overwrite=True")
        assert code == 1 and f"error: {out} is in use by a running train.py: pid {first.pid} on this host" in text
        assert "Traceback" not in text and os.path.isfile(os.path.join(out, runs.LOCK))
    finally:
        first.kill()  # SIGKILL: no chance to give the lock back
        first.wait()
    code, text = launch(toy, out, "--max_iters=1", "--overwrite=True")
    assert code == 0 and f"took over {out}/{runs.LOCK}, left by pid {first.pid}" in text, text[-3000:]
    with open(os.path.join(out, runs.LOCK), "w") as f:
        json.dump({"host": "elsewhere", "pid": 1, "started": "2026-12-01 10:00:00", "command": "train.py"}, f)
    code, text = launch(toy, out, "--max_iters=1", "--overwrite=True")
    assert code == 1 and f"is locked by a run on host elsewhere (pid 1, started 2026-12-01 10:00:00); if that run " \
                          f"is gone, delete {out}/{runs.LOCK}" in text
    assert socket.gethostname() != "elsewhere"


def test_a_resume_lists_what_changed_and_refuses_what_redefines_the_run(toy, straight, tmp_path):
    out = str(tmp_path / "changed")
    shutil.copytree(straight[0], out)
    shutil.rmtree(os.path.join(out, "step_000004"))
    shutil.rmtree(os.path.join(out, "export"))
    code, text = launch(toy, out, "--max_iters=4", "--resume=True", "--similarity='dot'", "--focal_gamma=0.0")
    assert code == 1 and "error: resuming would change what defines the run: similarity 'cos' -> 'dot', " \
                          "focal_gamma 2.0 -> 0.0" in text and "Traceback" not in text
    records = run_train(toy, out, "--max_iters=4", "--resume=True", "--learning_rate=0.001", "--focal_gamma=0.0",
                        "--allow_config_change=True", "--checkpoint_interval=2")
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[2]["lr"] < straight[1][2]["lr"]
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    assert written["config"]["focal_gamma"] == 0.0 and written["history"] == [
        {"from_step": 0, "changed": {}},  # which steps ran under which values
        {"from_step": 2, "changed": {"learning_rate": [0.003, 0.001], "focal_gamma": [2.0, 0.0]}}]


def test_a_resume_of_a_finished_run_changes_nothing(toy, straight, tmp_path):
    out = str(tmp_path / "finished")
    shutil.copytree(straight[0], out)
    card = os.path.join(out, "export", "README.md")
    with open(card, "a") as f:
        f.write("\nthe evaluation table eval.py wrote\n")
    before = {name: os.path.getmtime(os.path.join(out, name)) for name in ("curves.png", "export", "log.jsonl")}
    code, text = launch(toy, out, "--max_iters=4", "--resume=True")
    assert code == 0 and f"{out} finished at step 4 and is exported: nothing to do" in text
    assert open(card).read().endswith("the evaluation table eval.py wrote\n")
    assert before == {name: os.path.getmtime(os.path.join(out, name)) for name in before}


def test_the_export_says_its_dtype_and_its_cards_snippet_agrees_with_encode(toy, tmp_path):
    from safetensors.torch import load_file, save_file
    from checkpoint import load_embedder
    backbone = tmp_path / "bf16_release"  # a release as shipped: bf16 weights, config.json saying so
    shutil.copytree(toy["checkpoint"], backbone)
    weights = load_file(backbone / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, backbone / "model.safetensors", {"format": "pt"})
    config = json.loads((backbone / "config.json").read_text())
    (backbone / "config.json").write_text(json.dumps(dict(config, dtype="bfloat16")))
    out = str(tmp_path / "run")
    run_train(toy, out, f"--init_from={backbone}", "--max_iters=1", "--lora_rank=0", "--learning_rate=1e-3")
    export = os.path.join(out, "export")
    assert json.loads(open(os.path.join(export, "config.json")).read())["dtype"] == "float32"  # what it holds
    assert {v.dtype for v in load_file(os.path.join(export, "model.safetensors")).values()} == {torch.float32}
    card = open(os.path.join(export, "README.md")).read()
    namespace = {}
    exec(card.split("```python\n")[1].split("```")[0], namespace)  # noqa: S102 - as a reader runs it
    embedder, _ = load_embedder(export)
    expected = embedder.encode([{"text": "Find the caption that best describes this picture: a red circle",
                                 "image": None}])[0]
    assert float((namespace["query"] - expected).norm() / expected.norm()) < 1e-4
    step, _ = load_embedder(os.path.join(out, "step_000001"))  # the export is the last step's weights, exactly
    torch.testing.assert_close(step.encode([{"text": "a red circle", "image": None}]),
                               embedder.encode([{"text": "a red circle", "image": None}]), atol=1e-6, rtol=0)


def test_a_killed_evaluation_resumes_and_ends_with_the_uninterrupted_json(toy, tmp_path):
    import eval as evaluation
    args = ["config/shapes_eval.py", f"--init_from={toy['checkpoint']}", f"--mmeb_dir={toy['eval']}",
            f"--image_dir={toy['images']}", "--num_workers=0", "--geometry_samples=40",
            "--datasets=['Shapes-CLS', 'Shapes-VQA', 'Shapes-T2I']"]
    straight = evaluation.main(args + [f"--out={tmp_path / 'straight.json'}"])
    out, output = str(tmp_path / "killed.json"), []
    run = subprocess.Popen([sys.executable, "eval.py", *args, f"--out={out}"], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines_until(run, r"^Shapes-CLS: P@1", output)
    run.kill()
    run.wait()
    again = subprocess.run([sys.executable, "eval.py", *args, f"--out={out}"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"^Shapes-CLS: P@1 [\d.]+, kept from an earlier run with the same checkpoint", again.stdout, re.M)
    assert not re.search(r"^Shapes-CLS: \d+/\d+ items", again.stdout, re.M)  # not encoded again
    assert re.search(r"^Shapes-VQA: \d+/\d+ items", again.stdout, re.M)  # the rest were
    resumed = json.loads(open(out).read())
    timing = ("seconds", "items_per_second")
    strip = lambda d: {k: {kk: vv for kk, vv in v.items() if kk not in timing} for k, v in d.items()}  # noqa: E731
    assert strip(resumed["datasets"]) == strip(straight["datasets"])
    for key in ("overall", "IND", "OOD", "meta_tasks"):
        assert resumed[key] == straight[key]
    for key in ("norm_cos_pearson_r", "random_pair_mean_cos", "norm_from_direction_r2"):
        assert resumed["geometry"][key] == straight["geometry"][key]


def test_the_slurm_script_asks_for_the_signal_train_py_handles_and_requeues(tmp_path):
    script = os.path.join(ROOT, "cluster", "pace.sbatch")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    text = open(script).read()
    warned = re.search(r"^#SBATCH --signal=B:(\w+)@(\d+)$", text, re.M)
    stop_signals = script_defaults("train.py")["stop_signals"]  # as train.py --help says them
    assert f"SIG{warned.group(1)}" in stop_signals and "SIGTERM" in stop_signals  # the warning and preemption
    env = {**os.environ, "PACE_DRY_RUN": "1", "PACE_HEAD_NODE": "node01", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_ID": "77"}
    dry = subprocess.run(["bash", script, "config/stage1.py", "--init_from=/models/Qwen3.5-0.8B-Base"], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    assert dry.returncode == 0
    assert ("srun --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=77 --rdzv_backend=c10d "
            "--rdzv_endpoint=node01:29500 train.py config/stage1.py --init_from=/models/Qwen3.5-0.8B-Base "
            "--resume=True") in dry.stdout
    handled = re.search(r"PET_SIGNALS_TO_HANDLE=(\S+) PET_SHUTDOWN_TIMEOUT=(\d+)", dry.stdout)
    assert f"SIG{warned.group(1)}" in handled.group(1).split(",")  # torchrun passes the warning on to train.py
    assert int(handled.group(2)) < int(warned.group(2))  # train.py's save gets its time before the limit
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/bash\necho \"$@\" > {tmp_path / 'scontrol.args'}\n")
    (fake / "scontrol").chmod(0o755)
    job = subprocess.Popen(["bash", script, "config/stage1.py"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           env={**env, "PACE_FAKE_STATUS": "1", "PATH": f"{fake}:{os.environ['PATH']}"})
    time.sleep(1)
    job.send_signal(signal.SIGUSR1)  # the time-limit warning, as SLURM sends it to the batch script
    stdout, _ = job.communicate(timeout=30)
    assert "SIGUSR1: the time limit is near" in stdout and "requeueing job 77" in stdout
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "77"]


def test_a_checkpoints_fingerprint_follows_its_weights_not_its_place(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    copy, trained = tmp_path / "copy", tmp_path / "trained"
    shutil.copytree(tiny_checkpoint, copy)
    shutil.copytree(tiny_checkpoint, trained)
    weights = load_file(trained / "model.safetensors")  # the same shape, one tensor trained: the same size on disk
    name = sorted(weights)[len(weights) // 2]
    save_file(dict(weights, **{name: weights[name] + 0.01}), trained / "model.safetensors", {"format": "pt"})
    assert (trained / "model.safetensors").stat().st_size == (copy / "model.safetensors").stat().st_size
    assert checkpoint.fingerprint(tiny_checkpoint) == checkpoint.fingerprint(str(copy))
    assert checkpoint.fingerprint(str(trained)) != checkpoint.fingerprint(str(copy))
