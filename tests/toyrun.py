"""
Runs of train.py on the toy benchmark for the tests (tests/test_train.py, tests/test_runs.py): launch it in a
subprocess (one process or a 2-rank torchrun; torchrun() for any script), read its log, compare two runs step by step. The toy data and the
straight run they compare against are conftest.py's session fixtures `toy` and `straight`.
"""
import ast
import copy
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_defaults(script):
    """A script's config keys and defaults, as its own --help prints them (`key = repr  # comment`), read back: a
    copy of what one --help a test run printed, the caller's to change."""
    return copy.deepcopy(help_defaults(script))


@functools.lru_cache(maxsize=None)
def help_defaults(script):
    run = subprocess.run([sys.executable, script, '--help'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    defaults = {}
    for line in run.stdout.split('usage:', 1)[1].splitlines()[2:]:
        key, value = re.match(r'(\w+) += (.*?)(?:  # .*)?$', line).groups()
        defaults[key] = ast.literal_eval(value)
    return defaults


def launch(toy, out_dir, *args, nproc=1, popen=False, output=subprocess.PIPE):
    """Run train.py on the toy config in a subprocess. -> (return code, its stdout and stderr), or with popen the
    running process, its output merged into one pipe (or into the file object `output`)."""
    common = [os.path.join(ROOT, "config", "shapes_stage1.py"), f"--init_from={os.path.relpath(toy['checkpoint'], ROOT)}",
              f"--train_data={[toy['train']]!r}", f"--image_dir={toy['images']}", f"--out_dir={out_dir}",
              f"--table_dir={os.path.join(toy['root'], 'tables')}",
              "--batch_size=8", "--num_hard_negatives=2", "--log_interval=1", "--num_workers=0", "--max_pixels=4096",
              "--micro_batch=5", "--skip_bad_rows=True"]  # several forward calls per side, a different count on 1 and 2 ranks
    train = os.path.join(ROOT, "train.py")
    command = [sys.executable, train] if nproc == 1 else torchrun_command(nproc, train)
    env = dict(rank_env(), PYTHONUNBUFFERED="1")
    if popen:
        # SIGHUP as a terminal's run has it, also when the tests themselves run under nohup (which ignores it)
        return subprocess.Popen(command + common + list(args), cwd=ROOT, env=env, text=True, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    return run_process(command + common + list(args), env=env)


def run_process(command, timeout=300, **kwargs):
    """Run a command (train.py, torchrun, a rank script) in a session of its own, stdout and stderr merged. ->
    (return code, its output). A run that hangs past timeout is killed with every process it started (torchrun's
    ranks, their DataLoader workers) and fails the test with its own last lines, not a bare timeout."""
    process = subprocess.Popen(command, cwd=kwargs.pop("cwd", ROOT), text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(map(str, command[:4]))} ... hung for {timeout} s; its last output:\n{output[-6000:]}")
    return process.returncode, output


def torchrun_command(nproc, *args):
    """torchrun of nproc ranks on this host, on a free port: `python -m torch.distributed.run ... *args`."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
            *args]


def rank_env():
    """The environment of a test's ranks: one thread each (2 cores), gloo on the loopback unless told otherwise."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}


def torchrun(nproc, *args, timeout=300):
    """run_process of torchrun_command(nproc, *args) under rank_env(). -> (return code, its output)"""
    return run_process(torchrun_command(nproc, *args), timeout=timeout, env=rank_env())


def kill_group(process):
    """Kill a process started in a session of its own, with every process it started, if it still runs."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_train(toy, out_dir, *args, nproc=1, expect_returncode=0):
    """launch(), asserting its return code, and for a run of several ranks that its log is warning-free; -> the
    log.jsonl records, or on an expected failure the output."""
    returncode, output = launch(toy, out_dir, *args, nproc=nproc)
    assert returncode == expect_returncode, output[-6000:]
    warned = [line for line in output.splitlines() if "Warning" in line]
    assert nproc == 1 or expect_returncode or not warned, warned[:3]  # e.g. FSDP2's of a module returning a view
    return output if expect_returncode else read_log(out_dir)


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_same_run(reference, other):
    """Same losses step by step, and the same gradient norm at step 1 (the gradient before any update); later
    norms get a looser bound: Adam's first steps amplify float-rounding differences."""
    assert [r["step"] for r in other] == [r["step"] for r in reference]
    for a, b in zip(reference, other):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5 if a["step"] == 1 else 1e-3)


def losses(records):
    return {r["step"]: r["loss"] for r in records}
