"""
configurator.py: what every script needs around its work: config globals, overridden by config files and
--key=value flags; the process and its device (compute_init, the kernels, the GPU's peak); progress lines;
one-line errors; Weights & Biases.

A script defines its defaults as plain globals, one comment each, then resolves them:

    learning_rate = 2e-5  # AdamW peak learning rate (Table 3)
    ...
    config = configure(globals(), sys.argv[1:])  # updates the globals in place, returns the dict

and is run as

    python train.py config/stage1.py --learning_rate=1e-5 --out_dir=out/run1

Arguments apply left to right, so later ones win. Which globals are config keys: every name that does
not start with '_' and whose value is None or an int, float, bool, str, list, tuple or dict, at the
moment configure() is called. Modules, functions and classes are never keys; give a plain-valued
helper a leading '_' if it must sit above the call. Unlike nanoGPT's configurator, a file or flag that
names an unknown key fails, and `--learning_rate=1` is accepted for a float default.

Progress(total, label).update(n) prints done, rate and time left at most every few seconds, so long work is
never silent. install_error_hook() makes an error this project raises on purpose (a bad key, a missing file, a
bad row) end the run with one line, `error: ...`, not a traceback; PACE_TRACEBACK=1 shows tracebacks again.
"""
import ast
import datetime
import difflib
import importlib
import json
import logging
import math
import os
import re
import sys
import time
import traceback
import types
import uuid

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))  # this repository: where errors "on purpose" are raised

CONFIG_TYPES = (type(None), bool, int, float, str, list, tuple, dict)


def config_keys(namespace):
    """The config part of a namespace, in definition order: public names holding plain values."""
    return {key: value for key, value in namespace.items()
            if not key.startswith('_') and isinstance(value, CONFIG_TYPES)}


def unknown_key_message(key, keys, source):
    close = difflib.get_close_matches(key, keys, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{source}: unknown config key {key!r}{hint}"


def checked(key, value, default, source):
    """value, converted to the default's type where that is lossless; TypeError on a mismatch."""
    if default is None:  # no type to check against
        return value
    if isinstance(default, bool) or isinstance(value, bool):  # bool is an int subclass: never mix them
        ok = isinstance(default, bool) and isinstance(value, bool)
    elif isinstance(default, float) and isinstance(value, int):  # `--learning_rate=1` means 1.0
        return float(value)
    elif isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)  # `(1, 2)` and `[1, 2]` both mean a sequence
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise TypeError(f"{source}: {key} expects {type(default).__name__} (default {default!r}), "
                        f"got {type(value).__name__} {value!r}")
    return value


def parse_flag(arg, config):
    """'--key=value' -> (key, value). A str key keeps the raw text unless it parses to a str literal."""
    if '=' not in arg:
        raise ValueError(f"{arg}: expected --key=value")
    key, text = arg[2:].split('=', 1)  # only the first '=' splits: --out_dir=a=b gives 'a=b'
    if key not in config:
        raise ValueError(unknown_key_message(key, config, arg))
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if not isinstance(config[key], (str, type(None))):
            raise ValueError(f"{arg}: {text!r} is not a Python literal") from None
        return key, text  # --out_dir=out/run1
    if isinstance(config[key], str) and not isinstance(value, str):
        return key, text  # --run_name=2024 is the string '2024'
    return key, value


def read_config_file(path, config):
    """The names a config file assigns. It runs in a fresh namespace: it may import and compute."""
    with open(path) as f:
        namespace = {'__file__': path}
        exec(compile(f.read(), path, 'exec'), namespace)
    overrides = {key: value for key, value in namespace.items()
                 if not key.startswith('_') and not callable(value) and not isinstance(value, types.ModuleType)}
    for key in overrides:
        if key not in config:
            raise ValueError(unknown_key_message(key, config, path))
    return overrides


def configure(namespace, args):
    """Apply config files and --key=value flags (in order) to namespace; return the config dict."""
    config = config_keys(namespace)
    for arg in args:
        if arg.startswith('--'):
            key, value = parse_flag(arg, config)
            config[key] = checked(key, value, config[key], arg)
        else:
            for key, value in read_config_file(arg, config).items():
                config[key] = checked(key, value, config[key], arg)
    namespace.update(config)
    return config


def print_config(config):
    width = max(map(len, config), default=0)
    for key, value in config.items():
        print(f"{key:<{width}} = {value!r}")


def save_config(config, path):
    """Write config as JSON (tuples become lists), atomically: a crash never leaves half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, 'w') as f:
        json.dump(config, f, indent=2)
        f.write('\n')
    os.replace(tmp, path)


# -----------------------------------------------------------------------------
# the process and its device

def compute_init(device, timeout_minutes=10.0):
    """-> (rank, local_rank, world_size, torch.device). Under torchrun (RANK set) it joins the process group: NCCL
    on GPU, gloo on CPU, with a timeout, so a collective that waits on a stopped or dead rank ends the run with an
    error instead of hanging (on gloo install_error_hook then names the rank that does not answer; NCCL's watchdog
    names the rank and the operation that timed out). Without torchrun, one process on `device`. On a CPU it keeps transformers from binding
    flash-linear-attention's GPU kernels, which fail there. train.py, eval.py and bench."""
    import torch.distributed as dist
    if not device.startswith("cuda"):  # fla's Triton kernels need a GPU, yet transformers binds them if fla imports
        for package in ("fla", "causal_conv1d"):
            sys.modules.setdefault(package, None)  # so "import fla" fails and the PyTorch reference is bound
    if "RANK" not in os.environ:
        return 0, 0, 1, torch.device(device)
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    global MONITOR, MONITOR_WAIT
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo", timeout=timeout)
    MONITOR = dist.new_group(backend="gloo", timeout=timeout)  # idle until a collective times out: then it asks who
    MONITOR_WAIT = min(timeout, datetime.timedelta(seconds=30))
    return rank, local_rank, world, torch.device("cuda", local_rank) if device.startswith("cuda") else torch.device("cpu")


MONITOR = None  # compute_init's spare gloo group: after a timeout the main group is broken, this one can still ask
MONITOR_WAIT = None  # how long it waits for an answer


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


# dense bf16 peak FLOP/s per GPU, matched against torch.cuda.get_device_name() in order (the first match wins)
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
                   ("H20", 148e12), ("A100", 312e12), ("A800", 312e12), ("B200", 2250e12), ("L40S", 362e12))


def peak_flops(device):
    """The dense bf16 peak of this device, for MFU; None on a CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for gpu, flops in PEAK_BF16_FLOPS if gpu in name), None)


def step_flops(embedder, chunks, full_finetune):
    """Useful FLOPs of one training step over these collated chunks (real tokens only, no recomputation):
    the language model's matmuls at 2N a token forward and 4N (full) or 2N (LoRA: activation gradients
    only) backward, N without the token embedding (a lookup); the causal attention scores of the
    full-attention layers (2 T^2 d forward, twice that backward); the frozen vision tower's forward.
    Gated DeltaNet's state updates (a few % at these sizes) are not counted. For the MFU figure."""
    text, vision = embedder.model.config.text_config, embedder.model.config.vision_config
    language = sum(p.numel() for n, p in embedder.model.language_model.named_parameters()
                   if p.dim() >= 2 and "embed_tokens" not in n)
    tower = {n: p.numel() for n, p in embedder.model.visual.named_parameters() if p.dim() >= 2 and "pos_embed" not in n}
    per_patch = sum(v for n, v in tower.items() if "merger" not in n)
    per_patch += sum(v for n, v in tower.items() if "merger" in n) / vision.spatial_merge_size ** 2
    attention_width = text.num_attention_heads * text.head_dim
    full_layers = sum(kind == "full_attention" for kind in text.layer_types)
    flops = 0.0
    for chunk in chunks:
        lengths = chunk["attention_mask"].sum(dim=1).double()  # (B,)
        flops += (6 if full_finetune else 4) * language * lengths.sum().item()
        flops += 6 * full_layers * attention_width * (lengths ** 2).sum().item()
        if chunk["image_grid_thw"] is not None:
            patches = chunk["image_grid_thw"].prod(dim=1).double()  # (images,)
            flops += 2 * per_patch * patches.sum().item() + 4 * vision.depth * vision.hidden_size * (patches ** 2).sum().item()
    return flops


class HideKernelFallbackWarning(logging.Filter):
    """Drops transformers' 'falling back to its reference PyTorch implementation' lines (two per process, at the
    first forward): kernel_report says it once, in its own words."""

    def filter(self, record):
        return "falling back to its reference PyTorch implementation" not in record.getMessage()


def kernel_report(device):
    """One line: which Gated DeltaNet and causal-conv1d code transformers' qwen3_5 runs. It binds them once, when
    its modeling file is imported: the function from flash-linear-attention (fla) and causal_conv1d if those import,
    else its reference PyTorch code; the same import look-up here gives the same answer. On a CPU the reference code
    is the only one there is; on a GPU it is right but slow: pip install -r requirements-gpu.txt."""
    from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: F401 - binds the kernels on import
    logging.getLogger("transformers.integrations.hub_kernels").addFilter(HideKernelFallbackWarning())

    def bound(module, names):
        try:
            module = importlib.import_module(module)
            return all(getattr(module, name, None) is not None for name in names)
        except Exception:  # noqa: BLE001 - transformers treats every import failure as "not installed"
            return False
    fla = bound("fla.ops.gated_delta_rule", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
    conv = bound("causal_conv1d", ["causal_conv1d_fn", "causal_conv1d_update"])
    where = "as expected on a CPU" if device.type == "cpu" else "slow on a GPU: pip install -r requirements-gpu.txt"
    return (f"kernels: Gated DeltaNet {'flash-linear-attention' if fla else 'PyTorch reference'}, causal conv1d "
            f"{'causal_conv1d' if conv else 'PyTorch reference (F.conv1d)'}"
            + ("" if fla and conv else f" ({where})"))


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
    """An uncaught ValueError, TypeError, OSError or ImportError raised by this repository's own code (its raising frame is one
    of our files, or, re-raised from a DataLoader worker, the worker's was) prints `error: message` and nothing
    else; every other error keeps its traceback. PACE_TRACEBACK=1 keeps them all."""
    previous = sys.excepthook

    def hook(kind, error, tb):
        message = purposeful_message(error, tb)
        if message is None or os.environ.get("PACE_TRACEBACK"):
            return previous(kind, error, tb)
        print(f"error: {message}", file=sys.stderr, flush=True)

    sys.excepthook = hook


def purposeful_message(error, tb):
    """The message of an error this project raised on purpose (or a collective's timeout), else None."""
    if isinstance(error, RuntimeError) and MONITOR is not None and "Timed out waiting" in str(error):
        return (f"rank {os.environ.get('RANK')}: a collective waited longer than timeout_minutes for another rank; "
                f"{stuck_ranks()}")
    if not isinstance(error, (ValueError, TypeError, OSError, ImportError)):
        return None
    ours = lambda path: os.path.abspath(path).startswith(ROOT + os.sep) and "site-packages" not in path  # noqa: E731
    text = str(error)
    if "Original Traceback" in text:  # re-raised from a DataLoader worker, its traceback inside the message
        files = re.findall(r'File "([^"]+)"', text)
        return text.strip().splitlines()[-1].split(": ", 1)[-1] if files and ours(files[-1]) else None
    frames = traceback.extract_tb(tb)
    return text if frames and ours(frames[-1].filename) else None


def wandb_run_id(out_dir, resuming):
    """The Weights & Biases run id of out_dir's run: when resuming, the one out_dir/wandb_run_id keeps; else a new
    one, kept there. So a resumed run logs into the same W&B run, and a fresh one starts its own."""
    path = os.path.join(out_dir, "wandb_run_id")
    if resuming and os.path.isfile(path):
        with open(path) as f:
            return f.read().strip()
    run_id = uuid.uuid4().hex[:16]
    with open(path + ".tmp", "w") as f:
        f.write(run_id + "\n")
    os.replace(path + ".tmp", path)
    return run_id


def start_wandb(out_dir, resuming, project, name, config):
    """Start, or when resuming continue, out_dir's W&B run. -> the wandb module. Imported only when asked for."""
    try:
        import wandb
    except ImportError:
        raise ImportError("wandb_log=True needs the wandb package: pip install wandb (then wandb login)") from None
    wandb.init(project=project, name=name, id=wandb_run_id(out_dir, resuming), resume="allow", config=config)
    return wandb
