"""
runs/outdir.py: an out_dir and the one training run in it, as a shared cluster needs them: one run at a time (a
lock), a clean stop on a signal (preemption, a wall-time notice, Ctrl-C), what a resume may change, the history of
the config a run went through, the step folders kept and pruned, and the log. train.py calls these;
runs/checkpoint.py holds what the folders hold.

    lock = take_lock(out_dir)                    # refuses a second launch on the same out_dir, naming the first
    stop = StopSignals(("SIGTERM", "SIGUSR1", "SIGINT"))   # a signal sets stop.received; nothing is cut short
    changed = resume_changes(checkpoint_config, config, allow_config_change)   # refuses what redefines the run
    release_lock(lock)

On a stop signal every rank finishes the step it is in; the ranks decide together (train.py folds stop.received
into the all-reduce every step makes anyway) to write one checkpoint at that step, and the run exits with
EXIT_RESUME: a scheduler (cluster/pace.sbatch) requeues it, and --resume=True continues exactly. Another signal
during the save changes nothing: the checkpoint is written under a .tmp name and renamed when whole, so a kill
leaves the previous checkpoint the newest intact one. A second Ctrl-C stops at once (KeyboardInterrupt).
"""
import glob
import json
import os
import signal
import socket
import sys
import time
import uuid

import common
from common import UserError, duration, write_json, write_text
from model import EmbeddingSpec
from runs.checkpoint import NOT_COMPARED, complete, defining, read_info, remove, verify

EXIT_RESUME = 75  # EX_TEMPFAIL ("try again later"): stopped on a signal with a checkpoint written; resume me
LOCK = "run.lock"


# -----------------------------------------------------------------------------
# one run at a time

def take_lock(out_dir):
    """Hold out_dir's lock for this run: out_dir/run.lock (common.take_lock), holding host, pid, start time and
    command. A lock of a live run is refused naming it; one whose process no longer runs on this host is taken
    over with a note; one from another host is refused with the way to clear it. -> the lock's path"""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, LOCK)
    holder = common.take_lock(path, started=time.strftime("%Y-%m-%d %H:%M:%S"), command=" ".join(sys.argv))
    if holder is None:
        return path
    if not holder:
        raise UserError(f"{path}: another launch is taking this out_dir at the same moment; use another --out_dir")
    if holder.get("host") != socket.gethostname():
        raise UserError(f"{out_dir} is locked by a run on host {holder.get('host')} (pid {holder.get('pid')}, "
                        f"started {holder.get('started')}); if that run is gone, delete {path} and start again")
    raise UserError(f"{out_dir} is in use by a running run: pid {holder['pid']} on this host, started "
                    f"{holder.get('started')} ({holder.get('command')}); wait for it, stop it, or use another --out_dir")


def release_lock(path):
    """Give the lock back, if it is still this process's."""
    if path and (common.read_lock(path) or {}).get("pid") == os.getpid():
        os.remove(path)


# -----------------------------------------------------------------------------
# stopping on a signal

class StopSignals:
    """Handlers for the stop signals (names such as "SIGTERM", "SIGUSR1", "SIGINT"): the first sets `received` to
    its name and says what happens next; later ones are noted and change nothing, except a second SIGINT (Ctrl-C
    pressed twice), which stops at once. Install in the main process only: DataLoader workers ignore the signals
    (ignore_signals), so that a signal sent to the whole process group does not kill them mid-step."""

    def __init__(self, names):
        self.names, self.received = tuple(names), None
        for name in self.names:
            if not hasattr(signal, name):
                raise UserError(f"stop_signals: {name!r} is not a signal name (e.g. 'SIGTERM', 'SIGUSR1')")
            if name == "SIGHUP" and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
                continue  # started under nohup: the user asked the run to outlive the terminal
            signal.signal(getattr(signal, name), self.handle)

    def handle(self, number, frame):
        name = signal.Signals(number).name
        if self.received is None:
            self.received = name
            print(f"{name}: finishing this step, then writing a checkpoint and stopping"
                  + (" (Ctrl-C again stops at once)" if name == "SIGINT" else ""), flush=True)
        elif name == "SIGINT" and self.received == "SIGINT":
            raise KeyboardInterrupt
        else:
            print(f"{name} again: still finishing the step and the checkpoint", flush=True)


def ignore_signals(names, worker_id=None):
    """A DataLoader worker_init_fn (with functools.partial): the stop signals are the main process's business. A
    scheduler or torchrun signals a rank's whole process group, workers included; a worker that died of it would
    interrupt the step in progress (torch's DataLoader raises in the main process when a worker dies). Workers that
    ignore SIGTERM no longer end when multiprocessing terminates them at exit: kill_workers_at_exit does."""
    for name in names:
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def kill_workers_at_exit():
    """At the main process's exit (on every path: the end, a stop, an error), SIGKILL its live child processes
    (DataLoader workers, which ignore SIGTERM), before multiprocessing's own exit handler joins them: registered
    after that handler, it runs first."""
    import atexit
    import multiprocessing
    import multiprocessing.util  # noqa: F401 - its exit handler registered first, so ours runs before it
    def kill():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise at each child's death
        for child in multiprocessing.active_children():
            child.kill()
    atexit.register(kill)


# -----------------------------------------------------------------------------
# what a resume may change, and the config's history

def resume_changes(before, after, allow_config_change):
    """The config keys whose values differ between a checkpoint's config and this run's -> {key: [before, after]}.
    A change of what defines the run (defining) is a UserError naming the keys, unless allow_config_change; what
    only steers the rest (max_iters, the learning rate and its schedule, logging, checkpointing, workers) is
    allowed. Keys the checkpoint does not have (an older run's) count as unchanged."""
    changed = {key: [before[key], value] for key, value in after.items()
               if key in before and key not in NOT_COMPARED and as_stored(before[key]) != as_stored(value)}
    refused = [key for key in changed if key in defining(after)]
    if refused and not allow_config_change:
        raise UserError("resuming would change what defines the run: " + ", ".join(
            f"{key} {changed[key][0]!r} -> {changed[key][1]!r}" for key in refused) + "; keep them, write elsewhere "
            "with --out_dir=..., or --allow_config_change=True to continue anyway (config.json records it)")
    return changed


def as_stored(value):
    """A value as config.json stores it (tuples as lists), so a round trip through JSON is no change."""
    return json.loads(json.dumps(value))


def write_config(path, config, step, changed):
    """out_dir/config.json: {"config": this run's, "history": [{"from_step", "changed"}]}, one history entry per
    start (a fresh run's with no changes), so it says which steps ran under which values."""
    history = []
    if step and os.path.isfile(path):  # a resume: the history so far, up to the step it resumes from
        with open(path) as f:
            earlier = json.load(f)
        history = [h for h in earlier.get("history", []) if h["from_step"] < step] if isinstance(earlier, dict) else []
    history.append({"from_step": step, "changed": changed})
    write_json(path, {"config": config, "history": history})


def is_finished(info, max_iters, export_info):
    """True when the newest checkpoint (its pace.json `info`) is the last step of a run of max_iters and export/
    (its pace.json) holds that step: a resume then has nothing to do."""
    return bool(info) and info.get("step") == max_iters and (export_info or {}).get("step") == max_iters

# -----------------------------------------------------------------------------
# the step folders of an out_dir

def refuse_mixing(out_dir, fresh, overwrite):
    """A fresh run where an earlier run's checkpoints are is refused, naming them, unless overwrite. -> what the
    earlier run left that a fresh run must not mix with (its step folders and export/, to delete with overwrite),
    [] for a resume"""
    export = os.path.join(out_dir, "export")
    earlier = complete(out_dir) + ([export] if os.path.isdir(export) else []) if fresh else []
    if earlier and not overwrite:
        raise UserError(f"{out_dir} holds an earlier run ({', '.join(map(os.path.basename, earlier))}): continue it "
                        "with --resume=True, write elsewhere with --out_dir=..., or start over with --overwrite=True "
                        "(deletes them)")
    return earlier


def clear(out_dir, earlier):
    """Rank 0, before anything is written: remove what a run that stopped while writing left, and for overwrite=True
    what refuse_mixing found of an earlier run (`earlier`), with its log.jsonl, saying so."""
    os.makedirs(out_dir, exist_ok=True)
    for path in remove_unfinished(out_dir):
        print(f"removed {path}, left unfinished by a run that stopped while writing it")
    for path in earlier + ([os.path.join(out_dir, "log.jsonl")] if earlier else []):
        remove(path)
    if earlier:
        print(f"overwrite=True: deleted the earlier run's {', '.join(os.path.basename(p) for p in earlier)}")


def remove_unfinished(out_dir):
    """Delete what a run that stopped while writing left in out_dir (step_NNNNNN.tmp, export.tmp, *.tmp files):
    a full disk stays full otherwise. -> the paths removed."""
    stale = glob.glob(os.path.join(glob.escape(out_dir), "*.tmp"))
    for path in stale:
        remove(path)
    return stale


def newest_intact(out_dir):
    """The newest complete step folder of out_dir that verifies; broken ones are named and passed over. -> path
    or None."""
    for path in reversed(complete(out_dir)):
        try:
            verify(path)
            return path
        except (OSError, ValueError) as error:
            print(f"{error}; trying the checkpoint before it", flush=True)
    return None


def prune(out_dir, keep_last, keep_steps):
    """Delete all but the newest keep_last complete step folders, except the steps of keep_steps."""
    folders = complete(out_dir)
    for path in folders[:-keep_last] if keep_last > 0 else folders:
        if read_info(path)["step"] not in keep_steps:
            remove(path)


def set_aside(out_dir, from_step):
    """Rename the step folders from from_step on to step_NNNNNN.suspect (a stopped run's weights that went wrong):
    kept for a look, but no longer what --resume takes. -> the folders moved."""
    moved = [path for path in complete(out_dir) if read_info(path)["step"] >= from_step]
    for path in moved:
        remove(path + ".suspect")  # a rerun that went wrong at the same step: its copy of the same weights
        os.replace(path, path + ".suspect")
    return moved


# -----------------------------------------------------------------------------
# the runs' logs, one after another

def read_log(path):
    """A log.jsonl's records; a line cut short (a run still writing, or killed mid-line) is dropped."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().endswith("}")]


class StepLog:
    """train.py's log: on log steps a line and, from rank 0, a record of out_dir/log.jsonl (and W&B) with the step's
    statistics and the throughput since the last line. A resumed run's log keeps its steps up to its checkpoint."""

    def __init__(self, path, step, max_iters, world_size, gpu_peak, write, wandb=None):
        self.path, self.max_iters, self.world_size, self.gpu_peak, self.write = path, max_iters, world_size, gpu_peak, write
        self.wandb, self.start = wandb, time.time()
        if write:
            records = read_log(path) if step and os.path.exists(path) else []
            write_text(path, "".join(json.dumps(r) + "\n" for r in records if r["step"] <= step))
        self.restart(step, self.start)

    def restart(self, step, now):  # what a line counts: the steps since the last
        self.window = dict(tokens=0, real=0, flops=0.0, skipped=[], skipped_count=0, start=now, step=step)

    def add(self, chunks, skipped, skipped_count, flops):
        """One step's collated chunks, the rows it passed over (this rank's messages, every rank's count), its FLOPs."""
        self.window["real"] += sum(int(chunk["attention_mask"].sum()) for chunk in chunks)
        self.window["tokens"] += sum(chunk["attention_mask"].numel() for chunk in chunks)  # padding included
        self.window["flops"] += flops
        self.window["skipped"] += skipped
        self.window["skipped_count"] += skipped_count

    def line(self, step, stats, lr, grad_norm, totals):
        """The log line and record of a step: stats (loss.statistics), the run's totals {"bad_steps", "skipped_rows"}."""
        import torch
        now, window = time.time(), self.window
        interval = now - window["start"]
        record = {"step": step, "time": now, "elapsed": now - self.start, "loss": stats["loss"], "lr": lr,
                  "grad_norm": grad_norm, "tokens_per_s": window["tokens"] * self.world_size / interval,
                  "padding": 1 - window["real"] / max(window["tokens"], 1), **totals,
                  **{k: v for k, v in stats.items() if k != "loss"}}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            record["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        if self.gpu_peak:
            record["mfu"] = window["flops"] / interval / self.gpu_peak  # this rank's useful FLOP/s against its peak
        left = (self.max_iters - step) * interval / max(step - window["step"], 1)
        if self.write:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if self.wandb:
                self.wandb.log(record, step=step)
        print(f"step {step}/{self.max_iters} | loss {stats['loss']:.4f} | lr {lr:.2e} | grad {grad_norm:.3f} | pos_prob "
              f"{stats['pos_prob']:.3f}" + (f" | q_norm {stats['query_norm']:.2f}" if "query_norm" in stats else "")
              + f" | {record['tokens_per_s']:,.0f} tok/s"
              + (f" | mfu {record['mfu']:.1%}" if self.gpu_peak else "")
              + f" | {duration(now - self.start)} elapsed, ~{duration(left)} left", flush=True)
        if window["skipped_count"]:  # every rank's count; rank 0's own rows for the example
            example = f", e.g. {window['skipped'][0]}" if window["skipped"] else ""
            print(f"  skipped {window['skipped_count']} rows that do not decode ({totals['skipped_rows']} in all){example}")
        self.restart(step, now)


# -----------------------------------------------------------------------------
# Weights & Biases

def wandb_run_id(out_dir, resuming):
    """The Weights & Biases run id of out_dir's run: when resuming, the one out_dir/wandb_run_id keeps; else a new
    one, kept there. So a resumed run logs into the same W&B run, and a fresh one starts its own."""
    path = os.path.join(out_dir, "wandb_run_id")
    if resuming and os.path.isfile(path):
        with open(path) as f:
            return f.read().strip()
    run_id = uuid.uuid4().hex[:16]
    write_text(path, run_id + "\n")
    return run_id


def start_wandb(out_dir, resuming, project, name, config):
    """Start, or when resuming continue, out_dir's W&B run. -> the wandb module. Imported only when asked for."""
    try:
        import wandb
    except ImportError:
        raise UserError("wandb_log=True needs the wandb package: pip install wandb (then wandb login)") from None
    wandb.init(project=project, name=name, id=wandb_run_id(out_dir, resuming), resume="allow", config=config)
    return wandb


# -----------------------------------------------------------------------------
# output that never stops a run

class SturdyStream:
    """sys.stdout or sys.stderr whose writes never raise: after the first that fails (a pipe whose reader is gone,
    as tee is after Ctrl-C; a log file on a full disk; a terminal that closed) the stream's file descriptor points at
    /dev/null, so the rest of the output, and the flush at exit, go nowhere and the run goes on: a stop signal
    still ends in its checkpoint and exit code."""

    def __init__(self, stream):
        self.stream, self.broken = stream, False

    def write(self, text):
        if not self.broken:
            try:
                return self.stream.write(text)
            except (OSError, ValueError):
                self.lost()
        return len(text)

    def flush(self):
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.lost()

    def lost(self):
        self.broken = True
        try:  # what the stream still buffers then goes nowhere too, so no later flush of it can fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


def sturdy_output():
    """Make sys.stdout and sys.stderr SturdyStreams (train.py: nothing printed may stop a run)."""
    sys.stdout, sys.stderr = (s if isinstance(s, SturdyStream) else SturdyStream(s) for s in (sys.stdout, sys.stderr))
