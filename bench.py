"""
bench.py: PACE's speed against the floor. One script, one table (in the spirit of nanoGPT's bench.py).

    python bench.py                                   # CPU: tiny Qwen3.5 + toy data, about a minute
    python bench.py --shape=qwen3.5-0.8b              # GPU: random weights in the real shapes, the paper's batch
    python bench.py --shape=qwen3.5-2b --out=bench/out/2b.json --compare=bench/out/2b_before.json
    bash bench/gpu.sh                                 # both shapes on a GPU machine, tables to $OUT

Each figure is a ratio of timings taken side by side in this run: round-robin, and the median over `iters`
rounds (after `warmup`) of the ratio within a round, so the machine's speed and its drift cancel out.
1. step: the whole PACE training step (embed queries and candidates, loss eqs. (3)-(7), backward, gradient
   clipping, AdamW) over its floor, the bare backbone (embedder.model) forward + backward of the very same
   chunks (in one graph, as the plain step's loss couples them; per chunk under GradCache), same trainable
   set (LoRA or the full language model), the same pooled positions summed as the loss. Stage I (LoRA, cos)
   and Stage II (full, dot), with and without GradCache. Goal <= 1.10. GradCache re-runs every forward by
   design, so its own floor adds one no-grad forward of all chunks; the goal applies to that ratio.
2. padding: the share of computed positions that are padding, under data.collate_train's chunking, length-
   sorted versus the batch's own order, on the toy data and on a synthetic length mix shaped like MMEB.
   Goal <= 10 %. Sorting acts within a batch only: which rows meet in a batch stays the sampler's random draw.
3. LoRA: forward + backward of the adapted model over the merged one (both backpropagate to the input
   embeddings; the merged model's weights are frozen, so the difference is the adapters).
4. data: items per second per DataLoader worker (JPEG decode, resize to the pixel budget, patchify,
   tokenise, collate), and on GPU the headroom of `num_workers` workers over the measured Stage I step.
5. eval: items per second of Embedder.encode and, on the toy set, the dedup factor (references / distinct
   items encoded) as eval.py counts it.
On a real shape the step rows add tokens/s, MFU (useful model FLOPs against the GPU's dense bf16 peak) and peak
memory, and the header says which Gated DeltaNet kernels ran: flash-linear-attention's or transformers' fallback.

The step is re-created from the same building blocks as train.py (Embedder, pace_loss, lora, AdamW); no file
imports train.py. forward_backward below mirrors train.py's line for line: keep the two in step.
"""
import copy
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

import torch
from PIL import Image

import data
import lora
from configurator import configure
from loss import pace_loss
from model import Embedder, Preprocessor, make_tiny_checkpoint, smart_resize

# -----------------------------------------------------------------------------
# config (--key=value, as train.py)
shape = "tiny"  # 'tiny' (model.make_tiny_checkpoint + the toy data) or 'qwen3.5-0.8b', 'qwen3.5-2b' (random weights)
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # autocast dtype; weights float32, as train.py on 1 GPU
batch_size = 0  # queries per step; 0 = 32 on a real shape (the paper's, per GPU), 8 on tiny
num_hard_negatives = 5  # per query (paper)
grad_cache_chunk = 8  # items per GradCache chunk
grad_cache_batch = 0  # queries per GradCache step; 0 = 128 on a real shape (a GPU's share of 1,024 on 8), else batch
micro_batch = 32  # without GradCache: items per forward call, cut from length-sorted items (train.py's micro_batch)
max_tokens = 16384  # the padding figure also shows data.collate_train's token budget (train.py does not use it)
activation_checkpointing = None  # recompute each decoder layer in backward (train.py's flag); None = on for real shapes
lora_rank = 32  # Stage I LoRA rank (alpha = 2 * rank)
max_pixels = 1605632  # image pixel budget (paper)
num_workers = 4 if torch.cuda.is_available() else 0  # DataLoader workers per GPU: data headroom, eval, building items
threads = 1  # torch threads on a CPU run: one keeps timings steady; OpenMP barriers stall when cores are shared
eval_items = 512  # items Embedder.encode is timed on (a seeded sample; the dedup factor counts them all)
iters = 10  # timed rounds per figure (median)
warmup = 2  # untimed rounds first
sections = "step,padding,lora,data,eval"  # which figures to measure, comma-separated
seed = 0  # seeds the synthetic data
out = ""  # also write the results as JSON here (rewritten after every row: a run cut short keeps what it did)
compare = ""  # a previous --out JSON: ratios more than 10 % worse than there are flagged REGRESSION
config = configure(globals(), sys.argv[1:]) if __name__ == "__main__" else {}
# -----------------------------------------------------------------------------

# Qwen3.5-0.8B-Base and Qwen3.5-2B-Base as released (model type qwen3_5), read off public copies of the release
# config.json files (third-party code and model cards; at least two agree on each value), not the files themselves.
SHAPES = {
    "qwen3.5-0.8b": dict(
        text=dict(hidden_size=1024, intermediate_size=3584),
        vision=dict(depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=1024)),
    "qwen3.5-2b": dict(
        text=dict(hidden_size=2048, intermediate_size=6144),
        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048)),
}
SHARED_TEXT = dict(  # both sizes: 24 layers, 3 Gated DeltaNet : 1 full attention, tied 248,320-token embedding
    vocab_size=248320, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
    max_position_embeddings=262144, tie_word_embeddings=True,
    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[11, 11, 10],
                         mrope_interleaved=True))
SHARED_VISION = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304)
MIN_PIXELS = 65536  # the Qwen3-VL / Qwen3.5 release image processors' shortest_edge
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}  # dense, per GPU

# A synthetic length mix shaped like MMEB-train (PACE.md): per task family its share of rows, and for the query
# and for every candidate (positive and hard negatives alike) a text length range in tokens and an image kind.
# 'full' images have log-uniform areas from 224^2 to max_pixels (photos, charts, documents); 'crop' images
# (grounding candidates) from 56^2 to 224^2, which the resize raises to MIN_PIXELS.
MMEB_MIX = [  # (task family, share, (query tokens, query image), (candidate tokens, candidate image))
    ("classification", 0.25, ((10, 30), "full"), ((1, 6), None)),  # ImageNet-1K, N24News, VOC2007, SUN397 ...
    ("vqa", 0.25, ((15, 50), "full"), ((1, 10), None)),  # OK-VQA, DocVQA, ChartQA, InfographicsVQA ...
    ("text to image", 0.15, ((15, 45), None), ((5, 8), "full")),  # MSCOCO_t2i, VisualNews_t2i, CIRR ...
    ("image to text", 0.15, ((10, 15), "full"), ((10, 60), None)),  # MSCOCO_i2t, VisualNews_i2t
    ("documents", 0.10, ((10, 40), None), ((150, 1500), None)),  # WebQA, VisDial-like long texts
    ("grounding", 0.10, ((10, 20), "full"), ((8, 12), "crop")),  # MSCOCO grounding
]
TEMPLATE_TOKENS = 20  # the embedding prompt around the content (model.py), in Qwen's tokenizer
WORDS = "the a red green blue small large image shows photo of on in at left right question answer caption".split()


# -----------------------------------------------------------------------------
# timing

def synchronize():
    if device_.type == "cuda":
        torch.cuda.synchronize()


def side_by_side(functions, rounds=None, warm=None):
    """{name: function} -> {name: [seconds in each timed round]}: round-robin, so each round times the functions
    back to back and drift in the machine's speed hits all of them alike."""
    rounds, warm = iters if rounds is None else rounds, warmup if warm is None else warm
    times = {name: [] for name in functions}
    for i in range(warm + rounds):
        for name, function in functions.items():
            synchronize()
            start = time.perf_counter()
            function()
            synchronize()
            if i >= warm:
                times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(numerators, denominators):
    """The median over rounds of numerator / denominator, each pair timed back to back."""
    return statistics.median(a / b for a, b in zip(numerators, denominators))


class Phases:
    """Wall time of a step's phases: mark(name) closes the phase begun at the previous mark (or start)."""

    def __init__(self):
        self.seconds, self.last = {}, None

    def start(self):
        synchronize()
        self.last = time.perf_counter()

    def mark(self, name):
        synchronize()
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now

    def shares(self):
        total = sum(self.seconds.values()) or 1.0
        return {name: seconds / total for name, seconds in self.seconds.items()}


# -----------------------------------------------------------------------------
# the training step, as train.py takes it on one process, and its floor

def encode(embedder, chunk):
    chunk = {k: v.to(device_, non_blocking=True) if v is not None else None for k, v in chunk.items()}
    with autocast:
        return embedder(**chunk)


def forward_backward(embedder, batch, loss_args, grad_cache, mark):
    """Mirrors train.py's forward_backward (keep the two in step); `mark` only reads the clock between phases."""
    def step_loss(q, c, targets):
        return pace_loss(q, c, targets.to(device_), **loss_args)

    if not grad_cache:
        q = torch.cat([encode(embedder, chunk) for chunk in batch["query"]])  # (n, D)
        c = torch.cat([encode(embedder, chunk) for chunk in batch["candidate"]])  # (n * (1 + K), D)
        mark("forward")
        loss, stats = step_loss(q, c, batch["targets"])
        mark("loss")
        loss.backward()
        mark("backward")
        return stats
    chunks = batch["query"] + batch["candidate"]
    rng_states, reps = [], []
    with torch.no_grad():
        for chunk in chunks:
            rng_states.append((torch.get_rng_state(), torch.cuda.get_rng_state() if device_.type == "cuda" else None))
            reps.append(encode(embedder, chunk))
    mark("no-grad forward")
    reps = [r.detach().requires_grad_(True) for r in reps]
    num_query_chunks = len(batch["query"])
    loss, stats = step_loss(torch.cat(reps[:num_query_chunks]), torch.cat(reps[num_query_chunks:]), batch["targets"])
    loss.backward()
    mark("loss")
    for chunk, rep, (cpu_rng, cuda_rng) in zip(chunks, reps, rng_states):
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng)
        encode(embedder, chunk).backward(rep.grad)
    mark("forward + backward")
    return stats


def make_optimizer(trainable, learning_rate):
    """AdamW as train.py builds it (weight decay 0, its default)."""
    decay, no_decay = [p for p in trainable if p.dim() >= 2], [p for p in trainable if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=learning_rate, betas=(0.9, 0.999), fused=device_.type == "cuda")


def train_step(embedder, optimizer, trainable, batch, loss_args, grad_cache, phases):
    """One optimizer step as train.py's loop takes it: forward_backward, clip to 1.0, AdamW, zero_grad."""
    phases.start()
    stats = forward_backward(embedder, batch, loss_args, grad_cache, phases.mark)
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, 1.0).item()
    if math.isfinite(stats["loss"]) and math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    phases.mark("clip + AdamW")


def floor_step(embedder, batch, trainable, one_graph):
    """The floor: the bare backbone's forward and backward of the same chunks, the pooled hidden states summed
    as the loss, gradients dropped after (as zero_grad does). With one_graph, one backward over all chunks, as
    the plain step must (its loss couples them); else one per chunk, as GradCache's second pass."""
    total = 0.0
    for chunk in batch["query"] + batch["candidate"]:
        chunk = {k: v.to(device_, non_blocking=True) if v is not None else None for k, v in chunk.items()}
        with autocast:
            hidden = embedder.model(**chunk, use_cache=False).last_hidden_state  # (B, L, D)
        last = chunk["attention_mask"].sum(dim=1) - 1  # (B,)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float().sum()
        if one_graph:
            total = total + pooled
        else:
            pooled.backward()
    if one_graph:
        total.backward()
    for p in trainable:
        p.grad = None


def no_grad_forward(embedder, batch):
    """GradCache's first pass, which its own floor adds: every chunk embedded without a graph."""
    with torch.no_grad():
        for chunk in batch["query"] + batch["candidate"]:
            encode(embedder, chunk)


# -----------------------------------------------------------------------------
# model FLOPs and the kernels, for the GPU rows

def step_flops(embedder, batch, full_finetune):
    """Useful FLOPs of one step on `batch` (no recomputation, no padding): the language model's matmuls at 2N per
    token forward and 4N (full) or 2N (LoRA: activation gradients only) backward, N without the token embedding
    (a lookup); causal attention scores of the full-attention layers (forward 2 T^2 d, backward twice that); the
    frozen vision tower's forward (patch matmuls, the merger per merged token, per-image attention). The Gated
    DeltaNet state updates (a few % at these sizes) are not counted."""
    text, vision = embedder.model.config.text_config, embedder.model.config.vision_config
    language = sum(p.numel() for n, p in embedder.model.language_model.named_parameters()
                   if p.dim() >= 2 and "embed_tokens" not in n)
    tower = {n: p.numel() for n, p in embedder.model.visual.named_parameters() if p.dim() >= 2 and "pos_embed" not in n}
    per_patch = sum(v for n, v in tower.items() if "merger" not in n)
    per_patch += sum(v for n, v in tower.items() if "merger" in n) / vision.spatial_merge_size ** 2
    attention_width = text.num_attention_heads * text.head_dim
    full_layers = sum(kind == "full_attention" for kind in text.layer_types)
    flops = 0.0
    for chunk in batch["query"] + batch["candidate"]:
        lengths = chunk["attention_mask"].sum(dim=1).double()  # (B,)
        flops += (6 if full_finetune else 4) * language * lengths.sum().item()
        flops += 6 * full_layers * attention_width * (lengths ** 2).sum().item()
        if chunk["image_grid_thw"] is not None:
            patches = chunk["image_grid_thw"].prod(dim=1).double()  # (images,)
            flops += 2 * per_patch * patches.sum().item()
            flops += 4 * vision.depth * vision.hidden_size * (patches ** 2).sum().item()
    return flops


def gpu_peak():
    if device_.type != "cuda":
        return None
    return next((peak for key, peak in PEAK_BF16.items() if key in torch.cuda.get_device_name()), None)


def linear_attention_path():
    """Which kernels transformers bound for the Gated DeltaNet layers when it was imported: flash-linear-
    attention's or its reference PyTorch fallback; likewise for the causal conv1d."""
    import importlib.util
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen
    paths = {}
    for function, package in (("torch_chunk_gated_delta_rule", "fla"), ("causal_conv1d_fn", "causal_conv1d")):
        fn = getattr(qwen, function, None)
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()))) if fn else {}
        if "is_new_implementation" in cells:  # transformers' use_kernel_func_from_hub_with_fallback wrapper
            impl = cells["implementation"]
            paths[function] = (f"{impl.__module__}.{impl.__name__}" if cells["is_new_implementation"]
                               else "reference PyTorch (fallback)")
        else:  # another transformers: say whether the package imports at all
            paths[function] = f"{package} {'importable' if importlib.util.find_spec(package) else 'not installed'}"
    return paths


# -----------------------------------------------------------------------------
# data: the synthetic MMEB-shaped mix, JPEGs

def log_uniform(rng, low, high):
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def mix_rows(rng, num_rows, num_negatives):
    """Rows of MMEB_MIX: {"task", "query", "candidates": [positive, negatives]}; a side is
    (text tokens, (height, width) or None)."""
    areas = {"full": (224 * 224, max_pixels), "crop": (56 * 56, 224 * 224)}

    def side(spec):
        (low, high), image = spec
        size = None
        if image:
            area, aspect = log_uniform(rng, *areas[image]), log_uniform(rng, 0.5, 2.0)
            size = (max(16, round(math.sqrt(area * aspect))), max(16, round(math.sqrt(area / aspect))))
        return min(high, int(log_uniform(rng, low, high + 1))), size

    rows = []
    for _ in range(num_rows):
        task, _, query, candidate = rng.choices(MMEB_MIX, weights=[mix[1] for mix in MMEB_MIX])[0]
        candidates = [side(candidate) for _ in range(1 + num_negatives)]
        rows.append({"task": task, "query": side(query), "candidates": candidates})
    return rows


def side_tokens(side):
    """Sequence length of a synthetic side: template, text, and the image's merged patches between
    <|vision_start|> and <|vision_end|> (Qwen's smart_resize, factor 32)."""
    text_tokens, size = side
    if size is None:
        return TEMPLATE_TOKENS + text_tokens
    height, width = smart_resize(size[0], size[1], 32, MIN_PIXELS, max_pixels)
    return TEMPLATE_TOKENS + text_tokens + height * width // 32**2 + 2


def padded_size(lengths, chunks):
    """Positions the model computes for these chunks: each chunk is as long as its longest item."""
    return sum(max(lengths[i] for i in chunk) * len(chunk) for chunk in chunks)


def words_text(rng, count):
    return " ".join(rng.choice(WORDS) for _ in range(max(1, count)))  # about a token a word in the tiny tokenizer


def side_item(rng, side):
    """A synthetic side as an Embedder item: words, and a plain in-memory image of its size."""
    text_tokens, size = side
    colour = tuple(rng.randrange(256) for _ in range(3))
    image = Image.new("RGB", (size[1], size[0]), colour) if size else None
    return {"text": words_text(rng, text_tokens), "image": image}


class MixItems(torch.utils.data.Dataset):
    """Synthetic rows as TrainDataset items (model inputs), built in DataLoader workers when there are any."""

    def __init__(self, rows, preprocessor):
        self.rows, self.preprocessor = rows, preprocessor

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        rng, row = random.Random(f"{seed}/{i}"), self.rows[i]
        feature = lambda side: self.preprocessor(**side_item(rng, side))  # noqa: E731
        return {"query": feature(row["query"]), "candidates": [feature(c) for c in row["candidates"]], "row": i}


def write_jpegs(folder, rng, count):
    """JPEGs of a few hundred pixels a side (256 to 768): smooth colour fields with noise, quality 90."""
    import numpy as np
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(count):
        height, width = rng.randint(256, 768), rng.randint(256, 768)
        generator = np.random.default_rng(k)
        field = Image.fromarray(generator.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        field = field.resize((width, height), Image.BICUBIC)
        pixels = np.asarray(field, dtype=np.float32) + generator.normal(0, 12, (height, width, 3))
        paths.append(os.path.join(folder, f"{k:03d}.jpg"))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(paths[-1], quality=90)
    return paths


# -----------------------------------------------------------------------------
# the model and its batches

def random_embedder(spec, preprocessor):
    """A randomly initialised Qwen3_5Model in a real shape, built directly on the device (float32 master weights),
    with the tiny checkpoint's tokenizer: its token ids are valid rows of the 248,320-row embedding."""
    from transformers import Qwen3_5Config, Qwen3_5Model
    token = preprocessor.tokenizer.convert_tokens_to_ids
    config = Qwen3_5Config(text_config=dict(SHARED_TEXT, **spec["text"]),
                           vision_config=dict(SHARED_VISION, **spec["vision"]),
                           image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
                           vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
                           tie_word_embeddings=True)
    with torch.device(device_):
        model = Qwen3_5Model._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return Embedder(model, preprocessor)


def to_device(batch):
    move = lambda chunk: {k: v.to(device_) if v is not None else None for k, v in chunk.items()}  # noqa: E731
    return dict(batch, query=[move(c) for c in batch["query"]], candidate=[move(c) for c in batch["candidate"]])


# -----------------------------------------------------------------------------
# the report

class Report:
    """The results, printed as they are measured and rewritten to `out` after each row."""

    def __init__(self, header):
        self.results = {"header": header, "step": [], "padding": [], "lora": None, "data": None, "eval": None}
        self.previous = {}
        if compare:
            with open(compare) as f:
                self.previous = json.load(f)

    def add(self, section, row, line):
        if isinstance(self.results[section], list):
            self.results[section].append(row)
        else:
            self.results[section] = row
        print(line, flush=True)
        if out:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with open(out + ".tmp", "w") as f:
                json.dump(self.results, f, indent=2)
            os.replace(out + ".tmp", out)

    def regression(self, section, name, key, value):
        """' REGRESSION (was x)' when value is more than 10 % worse (larger) than in the --compare run."""
        rows = self.previous.get(section) or []
        before = next((r.get(key) for r in (rows if isinstance(rows, list) else [rows]) if r.get("name") == name), None)
        return f"  REGRESSION (was {before:.3f})" if before and value > 1.10 * before else ""


def machine():
    if device_.type == "cuda":
        return f"{torch.cuda.get_device_name()}, 1 GPU"
    name = platform.processor() or "CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    return f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)"


def commit():
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        git = lambda *args: subprocess.run(["git", *args], cwd=here, capture_output=True, text=True,  # noqa: E731
                                           check=True).stdout.strip()
        return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if git("status", "--porcelain") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -----------------------------------------------------------------------------
# the measurements

def measure_steps(report, embedder, batches, stage, loss_args, learning_rate, full_finetune):
    """Section 1 for one stage: the plain and the GradCache step against their floors."""
    trainable = [p for p in embedder.parameters() if p.requires_grad]
    optimizer = make_optimizer(trainable, learning_rate)
    embedder.train()
    for grad_cache, batch in ((False, batches["plain"]), (True, batches["grad_cache"])):
        name = f"{stage}{' + GradCache' if grad_cache else ''}"
        chunks = batch["query"] + batch["candidate"]
        real = sum(int(c["attention_mask"].sum()) for c in chunks)
        row = {"name": name, "queries": len(batch["targets"]), "chunks": len(chunks), "real_tokens": real,
               "padding": 1 - real / sum(c["attention_mask"].numel() for c in chunks)}
        phases = Phases()
        functions = {"step": lambda: train_step(embedder, optimizer, trainable, batch, loss_args, grad_cache, phases),
                     "floor": lambda: floor_step(embedder, batch, trainable, one_graph=not grad_cache)}
        if grad_cache:
            functions["no_grad_forward"] = lambda: no_grad_forward(embedder, batch)
        long_step = grad_cache and device_.type == "cuda" and grad_cache_batch > batch_size  # fewer rounds
        if device_.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            times = side_by_side(functions, *((min(iters, 2), min(warmup, 1)) if long_step else ()))
        except torch.cuda.OutOfMemoryError as error:
            row["error"] = "out of memory: " + str(error).splitlines()[0][:120]
        if "error" in row:  # outside the except block, so the failed step's tensors are released first
            optimizer.zero_grad(set_to_none=True)
            for p in trainable:
                p.grad = None
            torch.cuda.empty_cache()
            report.add("step", row, f"  {name:<32} {row['error']}")
            continue
        seconds = {key: statistics.median(values) for key, values in times.items()}
        row.update(step_s=seconds["step"], floor_s=seconds["floor"], ratio=paired_ratio(times["step"], times["floor"]),
                   tokens_per_s=real / seconds["step"], phases=phases.shares())
        line = (f"  {name:<32} {row['queries']:>4} q {len(chunks):>4} chunks | step {seconds['step'] * 1e3:8.1f} ms | "
                f"floor {seconds['floor'] * 1e3:8.1f} ms | ratio {row['ratio']:.3f}")
        key = "ratio"
        if grad_cache:
            own_floor = [a + b for a, b in zip(times["floor"], times["no_grad_forward"])]
            row.update(no_grad_forward_s=seconds["no_grad_forward"],
                       ratio_own_floor=paired_ratio(times["step"], own_floor))
            line += f" | own floor {row['ratio_own_floor']:.3f}"
            key = "ratio_own_floor"
        line += (" (over goal)" if row[key] > 1.10 else "") + f" | {row['tokens_per_s']:,.0f} tok/s"
        if device_.type == "cuda":
            row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
            peak = gpu_peak()
            row["mfu"] = step_flops(embedder, batch, full_finetune) / seconds["step"] / peak if peak else None
            mfu = "-" if row["mfu"] is None else format(row["mfu"], ".1%")
            line += f" | MFU {mfu} | peak {row['peak_memory_gb']:.1f} GB"
        line += report.regression("step", name, key, row[key])
        line += "\n" + " " * 36 + "time: " + " | ".join(f"{k} {v:.0%}" for k, v in row["phases"].items())
        report.add("step", row, line)


def measure_padding(report, preprocessor, toy):
    """Section 2: the padding share under each chunking policy, length-sorted versus the batch's own order."""
    policies = [("one chunk per side", None, None), (f"micro_batch {micro_batch} items", None, micro_batch),
                (f"GradCache {grad_cache_chunk} items", None, grad_cache_chunk),
                (f"<= {max_tokens} tokens", max_tokens, None)]
    rows = mix_rows(random.Random(seed), 100 * 32, num_hard_negatives)
    mix_batches = [rows[i:i + 32] for i in range(0, len(rows), 32)]  # the paper's batch per GPU
    toy_batches = []
    if toy:
        dataset = data.TrainDataset(data.load_train_rows(toy["train"], toy["images"], num_hard_negatives, seed=seed),
                                    preprocessor)
        sampler = iter(data.ShardedBatchSampler(len(dataset), 32, seed=seed))
        toy_batches = [[dataset[i] for i in next(sampler)] for _ in range(10)]
    tokens_per_row = statistics.mean(sum(side_tokens(s) for s in [r["query"]] + r["candidates"]) for r in rows)
    print(f"  (MMEB-shaped mix: {len(mix_batches)} batches of 32 rows, {tokens_per_row:,.0f} real tokens a row"
          f"{'; toy: 10 batches of 32 rows' if toy else ''})")
    for label, max_tok, max_items in policies:
        row = {"name": label, "mix_tokens_per_row": tokens_per_row}
        for sort in (True, False):
            key = "sorted" if sort else "batch_order"
            if toy_batches:
                collate = data.collate_train(preprocessor, max_tokens=max_tok, max_items=max_items, sort_by_length=sort)
                row[f"toy_{key}"] = data.padding_share([collate(items) for items in toy_batches])
            real = computed = 0
            for batch in mix_batches:  # queries; then positives and negatives, in collate_train's order
                for sides in ([r["query"] for r in batch],
                              [r["candidates"][0] for r in batch] + [c for r in batch for c in r["candidates"][1:]]):
                    lengths = [side_tokens(s) for s in sides]
                    real += sum(lengths)
                    computed += padded_size(lengths, data.split_by_length(lengths, max_tok, max_items, sort))
            row[f"mix_{key}"] = 1 - real / computed
        toy_text = f"toy {row['toy_sorted']:6.1%} sorted, {row['toy_batch_order']:6.1%} batch order | " if toy else ""
        report.add("padding", row, f"  {label:<24} {toy_text}MMEB-shaped mix {row['mix_sorted']:6.1%} sorted, "
                                   f"{row['mix_batch_order']:6.1%} batch order")


def measure_lora(report, adapted, merged, batch):
    """Section 3: the adapted model's forward + backward over the merged model's, on the same chunks."""
    def embeddings_need_gradients(module, args, output):  # both models backpropagate down to the input embeddings
        return output.requires_grad_()

    hooks = [m.model.language_model.embed_tokens.register_forward_hook(embeddings_need_gradients)
             for m in (adapted, merged)]
    merged.requires_grad_(False)
    adapted.train()  # activation checkpointing, where on, acts in training mode only
    merged.train()
    adapters = [p for p in adapted.parameters() if p.requires_grad]
    times = side_by_side({"adapted": lambda: floor_step(adapted, batch, adapters, one_graph=True),
                          "merged": lambda: floor_step(merged, batch, [], one_graph=True)})
    for hook in hooks:
        hook.remove()
    row = {"name": "lora", "rank": lora_rank, "adapted_s": statistics.median(times["adapted"]),
           "merged_s": statistics.median(times["merged"]), "ratio": paired_ratio(times["adapted"], times["merged"])}
    report.add("lora", row, f"  rank {lora_rank}: adapted {row['adapted_s'] * 1e3:.1f} ms | merged "
                            f"{row['merged_s'] * 1e3:.1f} ms | ratio {row['ratio']:.3f}"
                            + report.regression("lora", "lora", "ratio", row["ratio"]))


def measure_data(report, preprocessor, folder, step_seconds):
    """Section 4: one worker's items per second on MMEB-shaped rows whose images are JPEG files on disk."""
    rng = random.Random(seed)
    jpegs = write_jpegs(folder, rng, 48)
    rows = mix_rows(rng, 4 * batch_size, num_hard_negatives)
    with open(os.path.join(folder, "rows.jsonl"), "w") as f:
        for row in rows:
            sides = [(words_text(rng, tokens), os.path.basename(rng.choice(jpegs)) if size else "")
                     for tokens, size in [row["query"]] + row["candidates"]]
            f.write(json.dumps({"qry": sides[0][0], "qry_image_path": sides[0][1], "pos_text": sides[1][0],
                                "pos_image_path": sides[1][1], "neg_text": [s[0] for s in sides[2:]],
                                "neg_image_path": [s[1] for s in sides[2:]]}) + "\n")
    dataset = data.TrainDataset(data.load_train_rows(os.path.join(folder, "rows.jsonl"), folder, num_hard_negatives,
                                                     seed=seed), preprocessor)
    collate = data.collate_train(preprocessor, max_items=micro_batch)  # as train.py's DataLoader without GradCache
    batches = [range(k * batch_size, (k + 1) * batch_size) for k in range(4)]
    collate([dataset[i] for i in batches[0]])  # warm-up: imports, tokenizer caches
    start = time.perf_counter()
    for indices in batches:
        collate([dataset[i] for i in indices])
    items_per_s = len(rows) * (2 + num_hard_negatives) / (time.perf_counter() - start)
    paper_items = 32 * (2 + num_hard_negatives)  # the paper's batch per GPU
    row = {"items_per_s_per_worker": items_per_s, "worker_s_per_paper_batch": paper_items / items_per_s,
           "image_share": sum(bool(size) for r in rows for _, size in [r["query"]] + r["candidates"])
           / (len(rows) * (2 + num_hard_negatives))}
    line = (f"  {items_per_s:.0f} items/s per worker ({row['image_share']:.0%} of the items with a JPEG of "
            f"256-768 px a side); one worker takes {row['worker_s_per_paper_batch']:.1f} s per paper batch of "
            f"{paper_items} items")
    if step_seconds and num_workers:
        row["headroom"] = num_workers * items_per_s * step_seconds / (batch_size * (2 + num_hard_negatives))
        line += f"; {num_workers} workers supply {row['headroom']:.1f}x what the Stage I step consumes"
    report.add("data", row, line)


def measure_eval(report, embedder, toy, items):
    """Section 5: Embedder.encode items/s; on the toy set also eval.py's dedup factor (references / distinct items)."""
    row = {}
    if toy:  # the distinct (text, image) items of each dataset, counted as eval.distinct_items counts them
        items, references = [], 0
        for name in data.find_mmeb_datasets(toy["eval"]):
            rows = data.read_mmeb_dataset(os.path.join(toy["eval"], name), toy["images"])
            distinct = {(s["text"] or "", s["image"]): s for r in rows for s in [r["query"]] + r["candidates"]}
            items += list(distinct.values())
            references += sum(1 + len(r["candidates"]) for r in rows)
        row["dedup_factor"] = references / len(items)
        items = random.Random(seed).sample(items, min(eval_items, len(items)))
    start = time.perf_counter()
    embedder.encode(items, batch_size=16, num_workers=num_workers)
    synchronize()
    row.update(items=len(items), items_per_s=len(items) / (time.perf_counter() - start))
    dedup = f" | dedup factor {row['dedup_factor']:.2f} (references / distinct items)" if toy else ""
    report.add("eval", row, f"  {row['items_per_s']:,.1f} items/s over {len(items)} items (batch 16, {num_workers} "
                            f"workers){dedup}")


def attempt(measure, *args):
    """Run one section; a GPU out-of-memory error is printed and the next section still runs."""
    message = None
    try:
        measure(*args)
    except torch.cuda.OutOfMemoryError as error:
        message = "  out of memory: " + str(error).splitlines()[0][:160]
    if message:  # outside the except block, so the failed section's tensors are released first
        torch.cuda.empty_cache()
        print(message, flush=True)


def run(folder, ptdtype, real_shape):
    """Build the model and the batches, then measure the wanted sections in order."""
    wanted = set(sections.split(","))
    torch.manual_seed(seed)
    checkpoint = make_tiny_checkpoint(os.path.join(folder, "tiny"), seed=seed)
    import transformers
    header = {"shape": shape, "machine": machine(), "device": device, "dtype": dtype, "date": time.strftime("%Y-%m-%d"),
              "commit": commit(), "torch": torch.__version__, "transformers": transformers.__version__,
              "gated_deltanet": linear_attention_path(), "batch_size": batch_size,
              "num_hard_negatives": num_hard_negatives, "grad_cache_batch": grad_cache_batch,
              "grad_cache_chunk": grad_cache_chunk, "micro_batch": micro_batch,
              "activation_checkpointing": activation_checkpointing, "iters": iters, "warmup": warmup}
    report = Report(header)
    print(f"PACE bench | {shape} | {header['machine']} | {device} {dtype} | torch {torch.__version__} | "
          f"transformers {transformers.__version__} | commit {header['commit']} | {header['date']}")
    print("Gated DeltaNet kernels: " + " | ".join(f"{k}: {v}" for k, v in header["gated_deltanet"].items()), flush=True)

    # the model and this device's batches: the toy data on tiny, the MMEB-shaped mix on a real shape
    toy = None
    if real_shape:
        preprocessor = Preprocessor.from_pretrained(checkpoint, min_pixels=MIN_PIXELS, max_pixels=max_pixels)
        rows = mix_rows(random.Random(seed), max(batch_size, grad_cache_batch), num_hard_negatives)
        loader = torch.utils.data.DataLoader(MixItems(rows, preprocessor), batch_size=None, num_workers=num_workers)
        items = list(loader)
        embedder = random_embedder(SHAPES[shape], preprocessor)
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shapes"))
        from prepare import prepare
        toy = prepare(os.path.join(folder, "shapes"), seed=seed, num_train=400)  # 10 batches of 32 for the padding
        embedder = Embedder.from_pretrained(checkpoint, max_length=512, max_pixels=128 * 128)  # config/shapes_stage1.py
        dataset = data.TrainDataset(data.load_train_rows(toy["train"], toy["images"], num_hard_negatives, seed=seed),
                                    embedder.preprocessor)
        items = [dataset[i] for i in range(max(batch_size, grad_cache_batch))]
    embedder.to(device_)
    preprocessor = embedder.preprocessor
    plain = data.collate_train(preprocessor, max_items=micro_batch)(items[:batch_size])
    grad_cache = data.collate_train(preprocessor, max_items=grad_cache_chunk)(items[:grad_cache_batch])
    batches = {"plain": to_device(plain), "grad_cache": to_device(grad_cache)}
    if activation_checkpointing:
        embedder.model.language_model.gradient_checkpointing_enable({"use_reentrant": False})
    lora.inject_lora(embedder.model, lora_rank, 2 * lora_rank)  # Stage I: only the adapters train
    merged = copy.deepcopy(embedder)
    lora.merge_lora(merged.model)  # Stage II: the adapters folded in, then the whole language model trains
    merged.requires_grad_(False)
    merged.model.language_model.requires_grad_(True)

    if "step" in wanted:
        print(f"1. training step / floor (the bare backbone's forward + backward of the same chunks); median of "
              f"{iters} rounds after {warmup}; goal <= 1.10 (GradCache: against its own floor)", flush=True)
        measure_steps(report, embedder, batches, "Stage I (LoRA, cos)",
                      dict(similarity="cos", temperature=0.1, focal_gamma=2.0, focal_temperature=0.1), 2e-5, False)
        measure_steps(report, merged, batches, "Stage II (full, dot)",
                      dict(similarity="dot", temperature=100.0, focal_gamma=2.0, focal_temperature=0.1), 2e-6, True)
    if "padding" in wanted:
        print("2. padding: share of computed positions (queries and candidates chunked apart, as data.collate_train); "
              "goal <= 10 % sorted", flush=True)
        measure_padding(report, preprocessor, toy)
    if "lora" in wanted:
        print("3. LoRA: adapted / merged, forward + backward of the same chunks", flush=True)
        attempt(measure_lora, report, embedder, merged, batches["plain"])
    del embedder, batches
    if "data" in wanted:
        print("4. data loading: TrainDataset + collate_train in one process, as one DataLoader worker", flush=True)
        stage1 = next((r for r in report.results["step"] if r["name"] == "Stage I (LoRA, cos)" and "step_s" in r), None)
        measure_data(report, Preprocessor.from_pretrained(checkpoint, min_pixels=MIN_PIXELS, max_pixels=max_pixels),
                     os.path.join(folder, "jpegs"), stage1["step_s"] if stage1 and real_shape else None)
    if "eval" in wanted:
        print("5. evaluation: Embedder.encode", flush=True)
        merged.requires_grad_(False)
        merged.to(ptdtype)  # eval.py loads the model in its compute dtype
        rng = random.Random(seed + 1)
        mix = None if toy else [side_item(rng, side) for row in mix_rows(rng, eval_items // (2 + num_hard_negatives),
                                                                         num_hard_negatives)
                                for side in [row["query"]] + row["candidates"]]
        attempt(measure_eval, report, merged, toy, mix)


def main():
    global device_, autocast, batch_size, grad_cache_batch, activation_checkpointing
    device_ = torch.device(device)
    if device_.type == "cpu" and threads:
        torch.set_num_threads(threads)
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    autocast = torch.autocast(device_.type, dtype=ptdtype) if ptdtype != torch.float32 else nullcontext()
    real_shape = shape != "tiny"
    if real_shape and shape not in SHAPES:
        raise ValueError(f"shape must be 'tiny' or one of {sorted(SHAPES)}, got {shape!r}")
    batch_size = batch_size or (32 if real_shape else 8)
    grad_cache_batch = grad_cache_batch or (128 if real_shape else batch_size)
    activation_checkpointing = real_shape if activation_checkpointing is None else activation_checkpointing
    folder = tempfile.mkdtemp(prefix="pace_bench_")
    try:
        run(folder, ptdtype, real_shape)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
