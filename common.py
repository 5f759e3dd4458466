"""
common.py: what every script needs around its work (nanochat's common.py in spirit): the process and its device,
progress lines, one-line errors for the mistakes a user must fix, atomic writes, lock files, Weights & Biases, image
files read as a viewer shows them, a video's frames sized, timed and cut as Qwen3-VL's video processor does it
(VideoProcessor: that class needs torchvision), and the conventions of the data every layer shares (IMAGE_MARKER,
VIDEO_MARKER, the frames a video keeps). It imports no other module of this project, so every module may import it.

    rank, local_rank, world_size, device = compute_init("cuda")     # joins torchrun's process group, if any
    progress = Progress(len(items), "encoding"); progress.update(16)  # 'encoding: 16/1,000 items, ...'
    raise UserError("train_data: no such file data/x.jsonl")         # printed as one line: 'error: ...'
    write_json("out/eval.json", result)                              # never half a file, even with two writers

UserError is the one exception class for a mistake the user must fix (a bad key or value, a missing file, a bad
row, a refused out_dir): install_error_hook() prints it as `error: message` and nothing else. Every other error
(a bug, a library's failure) keeps its whole traceback. PACE_TRACEBACK=1 keeps the traceback of UserError too.
"""
import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import socket
import sys
import time
import uuid

import numpy as np
import torch
from PIL import Image, ImageOps

IMAGE_MARKER = "<|image_1|>"  # in an item's text (MMEB's and mmE5's rows): where the item's image goes
VIDEO_MARKER = "<|video_1|>"  # in an item's text: where the item's video (a list of frames) goes


class UserError(ValueError):
    """A mistake the user must fix: a bad config key or value, a missing file, a bad row, a refused out_dir.
    A ValueError, so code that catches bad values catches it too."""


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


def on_rank_zero(function):
    """function() on rank 0 of the process group (or the one process); its result, or the UserError it raised, on
    every rank alike, so that all ranks go on or stop together."""
    import torch.distributed as dist
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    result = [None, None]
    if not distributed or dist.get_rank() == 0:
        try:
            result[0] = function()
        except UserError as error:
            result[1] = str(error)
    if distributed:
        dist.broadcast_object_list(result, src=0)
    if result[1]:
        raise UserError(result[1])
    return result[0]


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


@contextlib.contextmanager
def torch_threads(count):
    """torch's CPU threads set to `count` inside the block, and what they were restored after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def worker_count(wanted):
    """DataLoader workers: `wanted`, but never more than this process's share of the cores (os.sched_getaffinity,
    divided among torchrun's local ranks), since more only wait on each other and torch warns about them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(wanted, share))


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


# -----------------------------------------------------------------------------
# lock files: one run of an out_dir (runs/outdir.py), one writer of a prepared table (readers/training.py)

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
# image files, read as a viewer shows them (model.Preprocessor's input)

def load_image(image):
    """A path or PIL image -> an RGB PIL image as a viewer shows it: EXIF orientation applied, 16-bit and
    floating-point pixels scaled to 8 bits, transparent pixels laid on white (not black)."""
    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as opened:
                opened.load()
                image = ImageOps.exif_transpose(opened)  # a copy, rotated as the camera was held
        except Exception as error:  # missing, unreadable, truncated, not an image, over Pillow's pixel limit
            raise UserError(f"cannot read image {os.fspath(image)!r}: {error}") from None
    elif isinstance(image, Image.Image) and image.getexif().get(0x0112, 1) != 1:  # 0x0112: EXIF orientation
        image = ImageOps.exif_transpose(image)
    if not isinstance(image, Image.Image):
        raise UserError(f"an image must be a file path or a PIL image, got {type(image).__name__}")
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        image = Image.fromarray(eight_bit(np.asarray(image)))
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def eight_bit(pixels):
    """(H, W) greyscale of more than 8 bits -> uint8: integers span 0..65535 (16-bit PNG, TIFF), floats 0..1
    when all lie within it (else they are read as 0..255, as Pillow would)."""
    values = np.nan_to_num(pixels.astype(np.float64))
    if np.issubdtype(pixels.dtype, np.integer):
        values = values * (255 / 65535)
    elif values.size and values.min() >= 0 and values.max() <= 1:
        values = values * 255
    return np.clip(np.round(values), 0, 255).astype(np.uint8)


def image_size(image):
    """(width, height) of a PIL image or an image file, reading only the file's header."""
    if isinstance(image, Image.Image):
        return image.size
    try:
        with Image.open(image) as opened:
            width, height = opened.size
            if opened.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # shown turned by 90 degrees
                width, height = height, width
            return width, height
    except Exception as error:
        raise UserError(f"cannot read image {os.fspath(image)!r}: {error}") from None


def image_name(image):
    """How an error names an image: its path, quoted, or '(in memory)'."""
    return repr(os.fspath(image)) if isinstance(image, (str, os.PathLike)) else "(in memory)"


# -----------------------------------------------------------------------------
# videos: an item's "video" is a list of frames (file paths or PIL images), in order; model.Preprocessor sizes, times
# and cuts them as transformers' Qwen3-VL video processor does, with VideoProcessor (that class needs torchvision)

def largest(fits, low, high):
    """The largest integer in [low, high] for which fits holds, by bisection: fits(low) holds, and fits holds up to
    some value and not past it (a pixel budget whose resized grid still fits its room)."""
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def frame_choice(count, budget):
    """Indices of the frames a video of `count` frames keeps under a budget of `budget`: all of them when they are
    no more (never padded), else `budget` spread evenly from the first to the last, truncated to integers as
    VLM2Vec's process_video_frames picks them (np.linspace(..., dtype=int)): 64 frames, 8 kept -> 0, 9, 18, ..., 63."""
    if count <= budget:
        return list(range(count))
    return np.linspace(0, count - 1, budget, dtype=int).tolist()


def check_video(video):
    """A video as an item holds it -> the list of its frames; a UserError when it is not a non-empty list of frame
    paths or PIL images."""
    if not isinstance(video, (list, tuple)) or not video:
        kind = "an empty list" if isinstance(video, (list, tuple)) else type(video).__name__
        raise UserError(f"a video must be a non-empty list of frames (file paths or PIL images), got {kind}")
    for frame in video:
        if not isinstance(frame, (str, os.PathLike, Image.Image)):
            raise UserError(f"a video's frames must be file paths or PIL images, got {type(frame).__name__}")
    return list(video)


def video_name(frames):
    """How an error names a video: its first frame (image_name) and how many frames it has."""
    return f"{image_name(frames[0])} (the first of {len(frames)} frames)"


def video_smart_resize(num_frames, height, width, temporal, factor, min_pixels, max_pixels):
    """The frame size Qwen3-VL's video processor resizes a video to: sides multiples of `factor` (patch * merge),
    aspect ratio kept, and the pixels of all its frames (num_frames rounded to the temporal patch, times h * w) within
    [min_pixels, max_pixels]: the budget is the whole video's, not a frame's. A side under `factor` is first scaled up
    to it. transformers refuses fewer frames than the temporal patch; one frame is sized here as the pair it pads to."""
    num_frames = max(num_frames, temporal)
    if min(height, width) < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"frame aspect ratio {height}x{width} is more than 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(num_frames / temporal) * temporal
    if t * h * w > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


@dataclasses.dataclass(frozen=True)
class VideoProcessor:
    """A checkpoint's video processor settings (Qwen3VLVideoProcessor's defaults for what its JSON leaves out) and
    what that processor does with a video's frames: their size (grid), the timestamps, the uint8 patches and the
    pixel values of each byte. size: the pixel budget of a whole video, t * h * w."""
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    size: dict = dataclasses.field(default_factory=lambda: {"shortest_edge": 128 * 1024, "longest_edge": 768 * 1024})
    resample: int = 3  # PIL's BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)

    @classmethod
    def from_pretrained(cls, path):
        """The settings in a local folder, found where transformers looks: processor_config.json's "video_processor",
        else video_preprocessor_config.json, else preprocessor_config.json (the image processor's); none: defaults."""
        for name in ("processor_config.json", "video_preprocessor_config.json", "preprocessor_config.json"):
            file = os.path.join(path, name)
            try:
                with open(file) as f:
                    settings = json.load(f)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as error:
                raise UserError(f"{file}: not a processor config ({error})") from None
            settings = settings.get("video_processor") if name == "processor_config.json" else settings
            if settings is None:
                continue
            size = settings.get("size", cls().size)
            if settings.get("do_resize") is False or settings.get("cap_pixels_per_frame"):
                raise UserError(f"{file}: a video processor with do_resize false or cap_pixels_per_frame true is not "
                                "supported (model.Preprocessor resizes as Qwen3VLVideoProcessor does by default)")
            if not isinstance(size, dict) or not {"shortest_edge", "longest_edge"} <= set(size):
                raise UserError(f"{file}: a video processor's size names shortest_edge and longest_edge, not {size!r}")
            known = {field.name for field in dataclasses.fields(cls)} - {"size"}
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k in known},
                       size={"shortest_edge": size["shortest_edge"], "longest_edge": size["longest_edge"]})
        return cls()

    def grid(self, num_frames, height, width, most=None):
        """(grid_t, grid_h, grid_w) in patches of num_frames frames of this size after resizing (video_smart_resize
        within size's budget); grid_t counts temporal patches, the frames padded to whole ones. most: when a temporal
        patch would take more merged patches than that (tokens), the largest size that takes no more: smart_resize
        under the largest budget, without a minimum, that gives it (one merged patch a frame at the least)."""
        factor, temporal = self.patch_size * self.merge_size, self.temporal_patch_size

        def sized(low, high):  # (h, w) in pixels
            return video_smart_resize(num_frames, height, width, temporal, factor, low, high)
        h, w = sized(self.size["shortest_edge"], self.size["longest_edge"])
        if most is not None and (h // factor) * (w // factor) > most > 0:  # h, w grow with the budget
            fits = lambda budget: math.prod(x // factor for x in sized(0, budget)) <= most  # noqa: E731
            h, w = sized(0, largest(fits, 1, 4 * most * (num_frames + temporal) * factor**2))  # fits(1): 1 a frame
        return -(-num_frames // temporal), h // self.patch_size, w // self.patch_size

    def timestamps(self, num_frames, fps):
        """The text before each temporal patch of num_frames frames taken at fps ("<0.2 seconds>"), timed as
        transformers' Qwen3-VL processor times them: the frame indices 0..num_frames-1 padded to the temporal patch by
        repeating the last, each patch at the mean of its first and last frame's seconds. 8 frames, 2 fps: 0.25, 1.25,
        2.25 and 3.25 seconds, written "<0.2 seconds>", "<1.2 seconds>", ... (Python rounds halves to even)."""
        temporal = self.temporal_patch_size
        indices = list(range(num_frames)) + [num_frames - 1] * (-num_frames % temporal)
        seconds = [(indices[k] / fps + indices[k + temporal - 1] / fps) / 2 for k in range(0, len(indices), temporal)]
        return [f"<{s:.1f} seconds>" for s in seconds]

    def patches(self, frames, grid):
        """RGB PIL frames -> (grid_t * grid_h * grid_w, 3 * temporal * patch * patch) uint8 patches. Each frame is
        resized to the grid's size with PIL and the configured resampling, where transformers resizes with torchvision
        (antialiased, on tensors, its own rounding), which the core may not import: a resized frame's bytes differ a
        little from its (tests/test_peers.py measures how much); a frame already at that size is kept as it is, as
        there. The frames are padded to a whole temporal patch by repeating the last, then cut in its order: temporal
        patch, merge group, merged patch, then (channel, frame, row, column) within a patch."""
        temporal, patch, merge = self.temporal_patch_size, self.patch_size, self.merge_size
        grid_t, grid_h, grid_w = grid
        size = (grid_w * patch, grid_h * patch)
        frames = [f if f.size == size else f.resize(size, resample=self.resample) for f in frames]
        frames += frames[-1:] * (grid_t * temporal - len(frames))  # an odd count: the last frame twice
        x = torch.from_numpy(np.stack([np.asarray(f) for f in frames])).permute(0, 3, 1, 2)  # (T, 3, h, w) uint8
        x = x.reshape(grid_t, temporal, 3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (grid_t, grid_h/m, grid_w/m, m, m, 3, temporal, patch, patch)
        return x.reshape(grid_t * grid_h * grid_w, 3 * temporal * patch * patch)

    def pixel_table(self):
        """(3, 256) float32: each channel's byte value as the video processor rescales and normalises it on tensors,
        both fused into one (x - mean / rescale) / (std / rescale) in float32, so a lookup gives its pixel values."""
        values = torch.arange(256, dtype=torch.float32).expand(3, -1)  # (3, 256)
        mean, std = (torch.tensor(v, dtype=torch.float32)[:, None] for v in (self.image_mean, self.image_std))
        if self.do_rescale and self.do_normalize:
            return (values - mean * (1.0 / self.rescale_factor)) / (std * (1.0 / self.rescale_factor))
        if self.do_normalize:
            return (values - mean) / std
        return values * self.rescale_factor if self.do_rescale else values.clone()
