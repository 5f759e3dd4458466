"""
common.py: the process around every script's work (nanochat's common.py in spirit): the process group and the
device, progress lines, one-line errors for the mistakes a user must fix, lock files, atomic writes, rows computed
in shares over the ranks and gathered (shared_rows). It imports no other module of this project, so every module
may import it.

    rank, local_rank, world_size, device = compute_init("cuda")     # joins torchrun's process group, if any
    progress = Progress(len(items), "encoding"); progress.update(16)  # 'encoding: 16/1,000 items, ...'
    raise UserError("train_data: no such file data/x.jsonl")         # printed as one line: 'error: ...'
    write_json("out/eval.json", result)                              # never half a file, even with two writers
    holder = take_lock("out/stage1/run.lock")                        # None: this process holds it now

UserError is the one exception class for a mistake the user must fix (a bad key or value, a missing file, a bad
row, a refused out_dir): install_error_hook() prints it as `error: message` and nothing else. Every other error
(a bug, a library's failure) keeps its whole traceback. PACE_TRACEBACK=1 keeps the traceback of UserError too.
"""
import contextlib
import datetime
import json
import math
import os
import re
import socket
import sys
import time
import uuid

import torch


class UserError(ValueError):
    """A mistake the user must fix: a bad config key or value, a missing file, a bad row, a refused out_dir.
    A ValueError, so code that catches bad values catches it too."""


def refusals(*checks):
    """Each (check, *args) run -> the messages of the UserErrors they raise: what --check_data reports of the checks
    a run makes before its first step, the very functions the run calls."""
    found = []
    for check, *args in checks:
        try:
            check(*args)
        except UserError as error:
            found.append(str(error))
    return found


# -----------------------------------------------------------------------------
# the process and its device

MONITOR = None  # compute_init's spare gloo group: after a timeout the main group is broken, this one can still ask
MONITOR_WAIT = None  # how long it waits for an answer


def compute_init(device, timeout_minutes=10.0):
    """-> (rank, local_rank, world_size, torch.device). Under torchrun (RANK set) it joins the process group: NCCL
    on GPU, gloo on CPU, with a timeout, so a collective that waits on a stopped or dead rank ends the run with an
    error instead of hanging (on gloo the error hook then names the rank that does not answer; NCCL's watchdog
    names the rank and the operation that timed out). Without torchrun, one process on `device`. On a CPU it keeps
    transformers from binding flash-linear-attention's GPU kernels, which fail there."""
    import torch.distributed as dist
    global MONITOR, MONITOR_WAIT
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UserError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cpu":  # fla's Triton kernels need a GPU, yet transformers binds them if fla imports
        for package in ("fla", "causal_conv1d"):
            sys.modules.setdefault(package, None)  # so "import fla" fails and the PyTorch reference is bound
    elif not torch.cuda.is_available():
        raise UserError("device='cuda' but torch sees no GPU here: pass --device=cpu (and --dtype=float32)")
    if "RANK" not in os.environ:
        return 0, 0, 1, torch.device(device)
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo", timeout=timeout)
    MONITOR = dist.new_group(backend="gloo", timeout=timeout)  # idle until a collective times out: then it asks who
    MONITOR_WAIT = min(timeout, datetime.timedelta(seconds=30))
    return rank, local_rank, world, torch.device("cuda", local_rank) if device.startswith("cuda") else torch.device("cpu")


def stuck_ranks():
    """After a collective timed out: which ranks do not answer, asked over the spare group with gloo's
    monitored_barrier (rank 0 is the one that can tell). -> a few words."""
    import torch.distributed as dist
    try:
        dist.monitored_barrier(group=MONITOR, timeout=MONITOR_WAIT, wait_all_ranks=True)
        return "every rank answers now: one was far behind"
    except RuntimeError as error:
        ranks = re.search(r"Ranks? ([\d, ]+) failed to pass", str(error))
        return f"rank {ranks.group(1).strip()} does not answer: stopped, dead or stuck" if ranks else \
            "rank 0's message names the rank that does not answer"


def on_rank_zero(function, rank, world_size):
    """function() on rank 0 of the process group (or the one process); its result, or the UserError it raised, on
    every rank alike, so that all ranks go on or stop together."""
    import torch.distributed as dist
    result = [None, None]
    if rank == 0:
        try:
            result[0] = function()
        except UserError as error:
            result[1] = str(error)
    if world_size > 1:
        dist.broadcast_object_list(result, src=0)
    if result[1]:
        raise UserError(result[1])
    return result[0]


def worker_count(wanted):
    """DataLoader workers: `wanted`, but never more than this process's share of the cores (os.sched_getaffinity,
    divided among torchrun's local ranks), since more only wait on each other and torch warns about them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(wanted, share))


def barrier():
    """Every rank of the process group waits here for the others; one process goes straight on."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# -----------------------------------------------------------------------------
# lock files, as a shared cluster needs them: one run of an out_dir (runs/outdir.py), one writer of a prepared table
# (readers/training.py). A lock holds its process's host, pid and start time, so a lock left by a process that died,
# or whose pid the system gave to another process, is told apart from a live one.

def take_lock(path, **fields):
    """Create the lock file at path exclusively, holding lock_record(**fields). -> None when this process took it,
    else the record of its live holder: a process running on this host, or one on another host (not this host's
    to judge; {} while a holder is still writing it). A lock whose process no longer runs here (it died, or its pid
    is another process's now), or one left empty for seconds, is taken over, with a note."""
    for _ in range(3):
        try:
            with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "w") as f:
                json.dump(lock_record(**fields), f)
            return None
        except FileExistsError:
            holder = read_lock(path)
            try:
                young = time.time() - os.path.getmtime(path) < 5
            except FileNotFoundError:  # its holder let it go just now
                continue
            if holder is None and young:
                return {}
            if holder is not None and (holder.get("host") != socket.gethostname() or alive_here(holder)):
                return holder
            print(f"note: took over {path}, " + ("left empty" if holder is None else
                                                 f"left by pid {holder.get('pid')}, which no longer runs here"),
                  flush=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    raise UserError(f"{path}: could not take the lock (other processes are taking it at the same moment)")


def lock_record(**fields):
    """What a lock file holds of the process taking it: its host, pid and start time (process_start), and fields."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()), **fields}


def read_lock(path):
    """A lock file's record (lock_record), or None when there is none or it is empty (being written, or cut short)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def process_start(pid):
    """When process pid started (clock ticks since boot, /proc/<pid>/stat), so a pid the system reused for another
    process is told apart; None when there is no such process. Without /proc: True while the pid exists."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command in parentheses
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(int(pid), 0)
            return True
        except OSError:
            return None


def alive_here(record):
    """True when a lock's process runs on this host: its pid exists and started when the lock says."""
    if record.get("host") != socket.gethostname():
        return False
    try:
        started = process_start(record["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    return started is not None and started == record.get("process_start", started)


# -----------------------------------------------------------------------------
# progress and errors

def duration(seconds):
    """Seconds -> '1:02:03' or '2:03'."""
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Prints 'label: done/total unit, rate/s, elapsed, ~left' every `every` seconds and when done, so long
    work is never silent. total=None: counts without a percentage or time left."""

    def __init__(self, total, label, unit="items", every=10.0):
        self.total, self.label, self.unit, self.every = total, label, unit, every
        self.done, self.start, self.last = 0, time.time(), time.time()

    def update(self, count=1):
        self.done += count
        now = time.time()
        if now - self.last < self.every and self.done != self.total:
            return
        self.last, elapsed = now, now - self.start
        rate = self.done / max(elapsed, 1e-9)
        if self.total is None:
            print(f"{self.label}: {self.done:,} {self.unit}, {rate:,.1f}/s, {duration(elapsed)} elapsed", flush=True)
            return
        left = (self.total - self.done) / rate if rate else math.inf
        print(f"{self.label}: {self.done:,}/{self.total:,} {self.unit}, {rate:,.1f}/s, {duration(elapsed)} elapsed"
              + (f", ~{duration(left)} left" if self.done < self.total else ""), flush=True)


def library_help(doc, args):
    """What a library module says when run as a script (python -m folder.module --help): its docstring, which says
    what it is and what runs it; exit 0 for --help, 2 for anything else."""
    print(doc.strip())
    sys.exit(0 if set(args) <= {"--help", "-h"} else 2)


def install_error_hook():
    """Make an uncaught UserError (also one re-raised from a DataLoader worker) end the run with `error: message`
    and nothing else; every other error keeps its traceback. PACE_TRACEBACK=1 keeps them all."""
    previous = sys.excepthook

    def hook(kind, error, tb):
        message = one_line_message(error)
        if message is None or os.environ.get("PACE_TRACEBACK"):
            return previous(kind, error, tb)
        print(f"error: {message}", file=sys.stderr, flush=True)

    sys.excepthook = hook


def one_line_message(error):
    """The message of a UserError (or of a collective's timeout, which names the rank that does not answer), else
    None: that error keeps its traceback."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted by Ctrl-C: what was written before is intact (train.py: continue with --resume=True)"
    if isinstance(error, RuntimeError) and MONITOR is not None and "Timed out waiting" in str(error):
        return (f"rank {os.environ.get('RANK')}: a collective waited longer than timeout_minutes for another rank; "
                f"{stuck_ranks()}")
    if not isinstance(error, UserError):
        return None
    text = str(error)
    if "Original Traceback" in text:  # re-raised from a DataLoader worker, its traceback inside the message
        return text.strip().splitlines()[-1].split(": ", 1)[-1]
    return text


# -----------------------------------------------------------------------------
# atomic writes

@contextlib.contextmanager
def replaced_atomically(path, since=None):
    """Yields a temporary path beside `path`, unique to this writer; when the block ends without an error, it is
    renamed onto `path` (else deleted). Readers never see half a file, and two writers of one output cannot
    interleave: the later rename wins whole. since: this writer's start time; a file at `path` written after it
    (by another writer) is named as replaced."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        yield tmp
        shareable(tmp)
        if since is not None and os.path.exists(path) and os.path.getmtime(path) > since:
            print(f"note: replaced {path}, which another writer wrote after this one started", flush=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


ROOT = os.path.dirname(os.path.abspath(__file__))  # the project's root, where its default paths point from


def relative_hint(path):
    """What an error of a missing relative path adds: where relative paths are read from, and that it is not the
    project's root when it is not ('' for an absolute path)."""
    if os.path.isabs(os.fspath(path)):
        return ""
    cwd = os.getcwd()
    return f" (relative paths are read from the working directory, {cwd}" + (
        "" if os.path.samefile(cwd, ROOT) else f", not the project's root {ROOT}") + ")"


def shareable(path):
    """Give a written file the mode the user's umask gives any new file (0644 under 022, 0664 under 002): some
    writers (safetensors' save_file) leave 0600, which the rest of a cluster's group cannot read."""
    umask = os.umask(0)  # the only portable way to read it: set, then restored at once
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_text(path, text, since=None):
    """Write a text file atomically (replaced_atomically)."""
    with replaced_atomically(path, since) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def write_json(path, value, since=None):
    """Write JSON atomically, indented (tuples become lists)."""
    write_text(path, json.dumps(value, indent=2) + "\n", since)


def shared_rows(compute, n, rank, world_size):
    """compute(row indices) -> a tuple of tensors (one row per index), run by rank r on rows r::world_size and
    gathered, so that every rank ends with all n rows (eval.py's and tools/mine.py's embeddings and pools)."""
    parts = compute(list(range(rank, n, world_size)))
    if world_size == 1:
        return parts
    import torch.distributed as dist
    shares = [None] * world_size
    dist.all_gather_object(shares, parts)  # CPU tensors, pickled: no padding to equal sizes needed
    whole = [torch.empty((n,) + part.shape[1:], dtype=part.dtype) for part in parts]
    for r, share in enumerate(shares):
        for tensor, part in zip(whole, share):
            tensor[r::world_size] = part
    return tuple(whole)
