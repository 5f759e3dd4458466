"""
bench.py: PACE's speed against the floor. One script, one table (in the spirit of nanoGPT's bench.py).

    python bench.py                                   # CPU: tiny Qwen3.5 + toy data, about a minute
    python bench.py --sections=padding                # one section only (here: seconds)
    python bench.py --shape=qwen3.5-0.8b              # GPU: random weights in the real shapes, the paper's batch
    python bench.py --shape=qwen3.5-2b --out=bench/out/2b.json --compare=bench/out/2b_before.json
    bash bench/gpu.sh                                 # both shapes on a GPU machine, tables to $OUT

Each timing figure is a ratio taken side by side in this run: round-robin, the median over `iters` rounds
(after `warmup`) of the ratio within a round, so the machine's speed and its drift cancel out.
1. step: the whole PACE step (embed queries and candidates, loss eqs. (3)-(7), backward, clipping, AdamW) over
   its floor, the bare backbone's forward + backward of the very same chunks (one graph, as the plain step's
   loss couples them; per chunk under GradCache), same trainable set, the pooled positions summed as the loss.
   Stage I (LoRA, cos) and Stage II (full, dot), with and without GradCache. Goal <= 1.10. GradCache re-runs
   every forward by design, so its own floor adds one no-grad forward of all chunks; the goal is on that ratio.
2. padding: the share of computed positions that are padding, and the forward calls a batch, under
   data.split_by_length's cut, length-sorted versus the batch's own order, on the toy data and on a synthetic
   length mix shaped like MMEB. Goal <= 10 %. Sorting acts within a batch: which rows meet stays random.
3. LoRA: forward + backward of the adapted model over the merged one (both backpropagate to the embeddings).
4. data: items per second per DataLoader worker (JPEG decode, resize, patchify, tokenise, collate), and on GPU
   the headroom of `num_workers` workers over the measured Stage I step.
5. eval: Embedder.encode items/s and, on the toy set, eval.py's dedup factor (references / distinct items).
On a real shape the step rows add tokens/s, MFU (useful FLOPs against the GPU's dense bf16 peak) and peak memory,
and the header says which Gated DeltaNet kernels ran: flash-linear-attention's or transformers' fallback.

The step is re-created from train.py's building blocks (Embedder, pace_loss, lora, AdamW); no file imports
train.py; the step itself is loss.forward_backward, the very function train.py calls.
"""
import copy
import functools
import importlib.util
import inspect
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import data
import lora
from configurator import configure
from loss import forward_backward, pace_loss
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
micro_batch = 32  # without GradCache: at most this many items a forward call (train.py's micro_batch)
activation_checkpointing = None  # recompute each decoder layer in backward (train.py's flag); None = on for real shapes
lora_rank = 32  # Stage I LoRA rank (alpha = 2 * rank)
max_pixels = 1605632  # image pixel budget (paper)
num_workers = 8 if torch.cuda.is_available() else 0  # DataLoader workers per GPU (config/stage1.py): data headroom, eval, building items
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
    "qwen3.5-0.8b": dict(text=dict(hidden_size=1024, intermediate_size=3584), vision=dict(
        depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=1024)),
    "qwen3.5-2b": dict(text=dict(hidden_size=2048, intermediate_size=6144), vision=dict(
        depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048))}
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

# A synthetic length mix shaped like MMEB-train (PACE.md): per task family its share of rows, and for the query and
# for every candidate (positive and negatives alike) a text length range in tokens and an image kind. 'full' images:
# log-uniform areas from 224^2 to max_pixels (photos, charts, documents); 'crop' images (grounding candidates) from
# 56^2 to 224^2, which the resize raises to MIN_PIXELS.
MMEB_MIX = [  # (task family, share, (query tokens, query image), (candidate tokens, candidate image))
    ("classification", 0.25, ((10, 30), "full"), ((1, 6), None)),  # ImageNet-1K, N24News, VOC2007, SUN397 ...
    ("vqa", 0.25, ((15, 50), "full"), ((1, 10), None)),  # OK-VQA, DocVQA, ChartQA, InfographicsVQA ...
    ("text to image", 0.15, ((15, 45), None), ((5, 8), "full")),  # MSCOCO_t2i, VisualNews_t2i, CIRR ...
    ("image to text", 0.15, ((10, 15), "full"), ((10, 60), None)),  # MSCOCO_i2t, VisualNews_i2t
    ("documents", 0.10, ((10, 40), None), ((150, 1500), None)),  # WebQA, VisDial-like long texts
    ("grounding", 0.10, ((10, 20), "full"), ((8, 12), "crop")),  # MSCOCO grounding
]
results = {}  # section -> rows, as measured; "header" -> the run's config, machine and software
TEMPLATE_TOKENS = 20  # the embedding prompt around the content (model.py), in Qwen's tokenizer
WORDS = "the a red green blue small large image shows photo of on in at left right question answer caption".split()


# -----------------------------------------------------------------------------
# timing; the training step, as train.py takes it on one process, and its floor; its FLOPs and kernels

def clock():
    if device_.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def side_by_side(functions, rounds=None, warm=None):
    """{name: function} -> {name: [seconds in each timed round]} over `rounds` (iters) after `warm` (warmup):
    round-robin, so each round times the functions back to back and drift in the machine's speed hits all alike."""
    rounds, warm = rounds or iters, warmup if warm is None else warm
    times = {name: [] for name in functions}
    for i in range(warm + rounds):
        for name, function in functions.items():
            start = clock()
            function()
            if i >= warm:
                times[name].append(clock() - start)
    return times


def paired_ratio(numerators, denominators):
    """The median over rounds of numerator / denominator, each pair timed back to back."""
    return statistics.median(a / b for a, b in zip(numerators, denominators))


def encode(embedder, chunk):
    chunk = {k: v.to(device_, non_blocking=True) if v is not None else None for k, v in chunk.items()}
    with autocast:
        return embedder(**chunk)


def train_step(embedder, optimizer, trainable, batch, loss_args, grad_cache):
    """One optimizer step as train.py's loop takes it: forward_backward, clip to 1.0, AdamW, zero_grad."""
    stats = forward_backward(functools.partial(encode, embedder), batch,
                             lambda q, c, targets: pace_loss(q, c, targets.to(device_), **loss_args), grad_cache)
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, 1.0).item()
    if math.isfinite(stats["loss"]) and math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def floor_step(embedder, batch, trainable, one_graph):
    """The floor: the bare backbone's forward and backward of the same chunks, the pooled hidden states summed
    as the loss, gradients dropped after (as zero_grad does). With one_graph, one backward over all chunks, as
    the plain step must (its loss couples them); else one per chunk, as GradCache's second pass."""
    total = 0.0
    for chunk in batch["query"] + batch["candidate"]:  # already on the device
        if chunk["pixel_values"] is not None:  # the worker's uint8 patches -> the backbone's float input
            chunk = {**chunk, "pixel_values": embedder.preprocessor.model_pixels(chunk["pixel_values"])}
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


def step_flops(embedder, batch, full_finetune):
    """Useful FLOPs of one step on `batch` (no recomputation, no padding): language-model matmuls at 2N per token
    forward and 4N (full) or 2N (LoRA: activation gradients only) backward, N without the token embedding (a lookup);
    causal attention scores of the full-attention layers (forward 2 T^2 d, backward twice that); the frozen vision
    tower's forward. The Gated DeltaNet state updates (a few % at these sizes) are not counted."""
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


def linear_attention_path():
    """Which kernels transformers bound for the Gated DeltaNet layers and the causal conv1d when it was imported:
    flash-linear-attention's (causal_conv1d's) or its reference PyTorch fallback."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen
    paths = {}
    for function, package in (("torch_chunk_gated_delta_rule", "fla"), ("causal_conv1d_fn", "causal_conv1d")):
        bound = inspect.getclosurevars(getattr(qwen, function)).nonlocals  # use_kernel_func_from_hub_with_fallback's
        implementation = bound.get("implementation")
        paths[function] = (f"{implementation.__module__}.{implementation.__name__}"
                           if bound.get("is_new_implementation") else "reference PyTorch (fallback)" if implementation
                           else f"{package} {'importable' if importlib.util.find_spec(package) else 'not installed'}")
    return paths


# -----------------------------------------------------------------------------
# data: the synthetic MMEB-shaped mix, JPEGs

def mix_rows(rng, num_rows, num_negatives):
    """Rows of MMEB_MIX: {"task", "query", "candidates": [positive, negatives]}; a side is
    (text tokens, (height, width) or None)."""
    areas = {"full": (224 * 224, max_pixels), "crop": (56 * 56, 224 * 224)}
    log_uniform = lambda low, high: math.exp(rng.uniform(math.log(low), math.log(high)))  # noqa: E731

    def side(spec):
        (low, high), image = spec
        size = None
        if image:
            area, aspect = log_uniform(*areas[image]), log_uniform(0.5, 2.0)
            size = (max(16, round(math.sqrt(area * aspect))), max(16, round(math.sqrt(area / aspect))))
        return min(high, int(log_uniform(low, high + 1))), size

    def row(task, share, query, candidate):  # the candidates are drawn first, then the query
        return {"task": task, "candidates": [side(candidate) for _ in range(1 + num_negatives)], "query": side(query)}

    return [row(*rng.choices(MMEB_MIX, weights=[mix[1] for mix in MMEB_MIX])[0]) for _ in range(num_rows)]


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


def side_item(rng, side, jpegs=()):
    """A synthetic side as an Embedder item: words (about a token each in the tiny tokenizer) and, if it has one,
    an image: one of the JPEG files `jpegs`, else a plain in-memory image of its size."""
    text_tokens, size = side
    image = (rng.choice(jpegs) if jpegs else Image.new("RGB", (size[1], size[0]),
                                                       tuple(rng.randrange(256) for _ in range(3)))) if size else None
    return {"text": " ".join(rng.choice(WORDS) for _ in range(max(1, text_tokens))), "image": image}


def mix_item(rows, preprocessor, i):
    """Synthetic row i as a TrainDataset item (model inputs)."""
    rng, row = random.Random(f"{seed}/{i}"), rows[i]
    feature = lambda side: preprocessor(**side_item(rng, side))  # noqa: E731
    return {"query": feature(row["query"]), "candidates": [feature(c) for c in row["candidates"]], "row": i}


def write_jpegs(folder, rng, count):
    """JPEGs of a few hundred pixels a side (256 to 768): smooth colour fields with noise, quality 90."""
    os.makedirs(folder, exist_ok=True)
    for k in range(count):
        height, width = rng.randint(256, 768), rng.randint(256, 768)
        generator = np.random.default_rng(k)
        field = Image.fromarray(generator.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((width, height),
                                                                                                Image.BICUBIC)
        pixels = np.asarray(field, dtype=np.float32) + generator.normal(0, 12, (height, width, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(os.path.join(folder, f"{k:03d}.jpg"), quality=90)
    return [os.path.join(folder, f"{k:03d}.jpg") for k in range(count)]


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


def collate_to_device(preprocessor, items, max_items):
    """data.collate_train's batch, as train.py's DataLoader gives it, moved to the device once."""
    batch = data.collate_train(preprocessor, max_items=max_items)(items)
    move = lambda chunk: {k: v.to(device_) if v is not None else None for k, v in chunk.items()}  # noqa: E731
    return dict(batch, query=[move(c) for c in batch["query"]], candidate=[move(c) for c in batch["candidate"]])


def report(section, row, line, ratio=None):
    """Print a result and add its row to results[section], rewriting `out`. With ratio (a key of row), the line
    says REGRESSION when that ratio is more than 10 % worse than in the --compare run."""
    previous = json.loads(Path(compare).read_text()).get(section) or [] if compare and ratio else []
    before = [r for r in ([previous] if isinstance(previous, dict) else previous) if r.get("name") == row.get("name")]
    if before and before[0].get(ratio) and row[ratio] > 1.10 * before[0][ratio]:
        line += f"  REGRESSION (was {before[0][ratio]:.3f})"
    results.setdefault(section, []).append(row)
    print(line, flush=True)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        Path(out + ".tmp").write_text(json.dumps(results, indent=2))
        os.replace(out + ".tmp", out)


def header():
    """The config, the machine, the software and the commit."""
    import transformers
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if os.path.exists("/proc/cpuinfo") else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "CPU")
    machine = (f"{torch.cuda.get_device_name()}, 1 GPU" if device_.type == "cuda"
               else f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)")
    commit = subprocess.run("git describe --always --dirty=+uncommitted", shell=True, capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()  # no git: empty
    return {**{key: globals()[key] for key in config}, "machine": machine, "date": time.strftime("%Y-%m-%d"),
            "commit": os.environ.get("BENCH_COMMIT") or commit or "unknown", "torch": torch.__version__,
            "transformers": transformers.__version__, "gated_deltanet": linear_attention_path()}


def attempt(section, name, measure, *args):
    """Run one measurement; a GPU out-of-memory error becomes its row and the next measurement still runs."""
    try:
        return measure(*args)
    except torch.cuda.OutOfMemoryError as error:
        message = "out of memory: " + str(error).splitlines()[0][:120]
    torch.cuda.empty_cache()  # outside the except block, so the failed measurement's tensors are released first
    report(section, {"name": name, "error": message}, f"  {name:<32} {message}")


# -----------------------------------------------------------------------------
# the measurements

def measure_step(name, embedder, optimizer, trainable, batch, loss_args, grad_cache, full_finetune):
    """Section 1, one row: a step (plain or GradCache) against its floor."""
    optimizer.zero_grad(set_to_none=True)  # a row before that ran out of memory may have left gradients
    chunks = batch["query"] + batch["candidate"]
    real = sum(int(c["attention_mask"].sum()) for c in chunks)
    functions = {"step": lambda: train_step(embedder, optimizer, trainable, batch, loss_args, grad_cache),
                 "floor": lambda: floor_step(embedder, batch, trainable, one_graph=not grad_cache)}
    if grad_cache:  # GradCache's first pass, which its own floor adds: every chunk embedded without a graph
        functions["no_grad_forward"] = torch.no_grad()(lambda: [encode(embedder, chunk) for chunk in chunks])
    if device_.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    long_step = grad_cache and device_.type == "cuda" and grad_cache_batch > batch_size  # fewer rounds
    times = side_by_side(functions, *((min(iters, 2), min(warmup, 1)) if long_step else ()))
    seconds = {key: statistics.median(values) for key, values in times.items()}
    row = {"name": name, "queries": len(batch["targets"]), "chunks": len(chunks), "real_tokens": real,
           "padding": 1 - real / sum(c["attention_mask"].numel() for c in chunks), "step_s": seconds["step"],
           "floor_s": seconds["floor"], "ratio": paired_ratio(times["step"], times["floor"]),
           "tokens_per_s": real / seconds["step"]}
    line = (f"  {name:<32} {row['queries']:>4} q {len(chunks):>4} chunks | step {seconds['step'] * 1e3:8.1f} ms | "
            f"floor {seconds['floor'] * 1e3:8.1f} ms | ratio {row['ratio']:.3f}")
    key = "ratio_own_floor" if grad_cache else "ratio"
    if grad_cache:
        own_floor = [a + b for a, b in zip(times["floor"], times["no_grad_forward"])]
        row.update(no_grad_forward_s=seconds["no_grad_forward"], ratio_own_floor=paired_ratio(times["step"], own_floor))
        line += f" | own floor {row['ratio_own_floor']:.3f}"
    line += (" (over goal)" if row[key] > 1.10 else "") + f" | {row['tokens_per_s']:,.0f} tok/s"
    if device_.type == "cuda":
        peak = next((p for gpu, p in PEAK_BF16.items() if gpu in torch.cuda.get_device_name()), None)
        row.update(peak_memory_gb=torch.cuda.max_memory_allocated() / 2**30,
                   mfu=step_flops(embedder, batch, full_finetune) / seconds["step"] / peak if peak else None)
        line += f" | MFU {format(row['mfu'], '.1%') if peak else '-'} | peak {row['peak_memory_gb']:.1f} GB"
    report("step", row, line, key)


def measure_padding(toy_dataset):
    """Section 2: padding share and forward calls a batch under each cut, sorted versus the batch's own order.
    Positions are counted from the lengths, as data.collate_train pads: each chunk to its longest item."""
    def sides(rows, length):  # queries; then positives and negatives, in collate_train's order
        return [[length(r["query"]) for r in rows],
                [length(r["candidates"][0]) for r in rows] + [length(c) for r in rows for c in r["candidates"][1:]]]

    data_sets = {}  # name -> batches of 32 rows (the paper's batch a GPU) -> [query lengths, candidate lengths]
    if toy_dataset:
        sampler = iter(data.ShardedBatchSampler(len(toy_dataset), 32, seed=seed))
        data_sets["toy"] = [sides([toy_dataset[i] for i in next(sampler)], lambda f: len(f["input_ids"]))
                            for _ in range(10)]
    mix = mix_rows(random.Random(seed), 100 * 32, num_hard_negatives)
    data_sets["mix"] = [sides(mix[i:i + 32], side_tokens) for i in range(0, len(mix), 32)]
    tokens_per_row = sum(map(sum, sum(data_sets["mix"], []))) / len(mix)
    print(f"2. padding: share of computed positions (each side chunked apart, as data.collate_train) and forward calls "
          f"a batch, over batches of 32 rows: {len(data_sets.get('toy', []))} toy, 100 MMEB-shaped ("
          f"{tokens_per_row:,.0f} real tokens a row); goal <= 10 % sorted", flush=True)
    for label, max_items in [("one chunk per side", None), (f"micro_batch {micro_batch} items", micro_batch),
                             (f"GradCache {grad_cache_chunk} items", grad_cache_chunk)]:
        row, parts = {"name": label}, []
        for key, batches in data_sets.items():
            lengths = sum(batches, [])  # every side of every batch
            for sort, order in ((True, "sorted"), (False, "batch_order")):
                chunks = [data.split_by_length(side, max_items, sort) for side in lengths]
                row[f"{key}_{order}"] = 1 - sum(map(sum, lengths)) / sum(map(padded_size, lengths, chunks))
                row[f"{key}_calls_{order}"] = sum(map(len, chunks)) / len(batches)
            parts.append(f"{'toy' if key == 'toy' else 'MMEB-shaped mix'} {row[f'{key}_sorted']:6.1%} sorted, "
                         f"{row[f'{key}_batch_order']:6.1%} batch order, {row[f'{key}_calls_sorted']:4.1f} calls")
        report("padding", row, f"  {label:<22} " + " | ".join(parts))


def measure_lora(adapted, merged, batch):
    """Section 3: the adapted model's forward + backward over the merged model's, on the same chunks."""
    hooks = [m.model.language_model.embed_tokens.register_forward_hook(lambda _, __, output: output.requires_grad_())
             for m in (adapted, merged)]  # both models backpropagate down to the input embeddings
    merged.requires_grad_(False)
    adapted.train()  # activation checkpointing, where on, acts in training mode only
    merged.train()
    adapters = [p for p in adapted.parameters() if p.requires_grad]
    try:
        times = side_by_side({"adapted": lambda: floor_step(adapted, batch, adapters, one_graph=True),
                              "merged": lambda: floor_step(merged, batch, [], one_graph=True)})
    finally:
        for hook in hooks:
            hook.remove()
    row = {"name": "lora", "rank": lora_rank, "adapted_s": statistics.median(times["adapted"]),
           "merged_s": statistics.median(times["merged"]), "ratio": paired_ratio(times["adapted"], times["merged"])}
    report("lora", row, f"  rank {lora_rank}: adapted {row['adapted_s'] * 1e3:.1f} ms | merged "
                        f"{row['merged_s'] * 1e3:.1f} ms | ratio {row['ratio']:.3f}", "ratio")


def measure_data(preprocessor, folder, step_seconds):
    """Section 4: one worker's items per second on MMEB-shaped rows whose images are JPEG files on disk."""
    rng = random.Random(seed)
    jpegs = write_jpegs(folder, rng, 48)
    rows = mix_rows(rng, 4 * batch_size, num_hard_negatives)
    dataset = data.TrainDataset([{"query": side_item(rng, r["query"], jpegs),
                                  "candidates": [side_item(rng, c, jpegs) for c in r["candidates"]]}
                                 for r in rows], preprocessor)  # rows as load_train_rows gives them
    collate = data.collate_train(preprocessor, max_items=micro_batch)  # as train.py's DataLoader without GradCache
    collate([dataset[i] for i in range(batch_size)])  # warm-up: imports, tokenizer caches
    start = time.perf_counter()
    for k in range(4):
        collate([dataset[i] for i in range(k * batch_size, (k + 1) * batch_size)])
    items_per_s = 4 * batch_size * (2 + num_hard_negatives) / (time.perf_counter() - start)
    paper_items = 32 * (2 + num_hard_negatives)  # the paper's 32 queries a GPU
    row = {"name": "data", "items_per_s_per_worker": items_per_s, "worker_s_per_paper_batch": paper_items / items_per_s,
           "image_share": statistics.mean(bool(size) for r in rows for _, size in [r["query"]] + r["candidates"])}
    line = (f"  {items_per_s:.0f} items/s per worker ({row['image_share']:.0%} of the items with a JPEG of 256-768 px "
            f"a side); one worker takes {row['worker_s_per_paper_batch']:.1f} s per paper batch of {paper_items} items")
    if step_seconds and num_workers:  # the Stage I step's items against what the workers supply in its time
        row["headroom"] = num_workers * items_per_s * step_seconds / (batch_size * (2 + num_hard_negatives))
        line += f"; {num_workers} workers supply {row['headroom']:.1f}x what the Stage I step consumes"
    report("data", row, line)


def measure_eval(embedder, toy):
    """Section 5: Embedder.encode items/s: on the toy set, with eval.py's dedup factor; else on MMEB-shaped items."""
    row, rng = {"name": "eval"}, random.Random(seed + 1)
    if not toy:
        rows = mix_rows(rng, eval_items // (2 + num_hard_negatives), num_hard_negatives)
        items = [side_item(rng, side) for r in rows for side in [r["query"]] + r["candidates"]]
    else:  # the distinct (text, image) items of each dataset, counted as eval.distinct_items counts them
        items, references = [], 0
        for name in data.find_mmeb_datasets(toy["eval"]):
            rows = data.read_mmeb_dataset(os.path.join(toy["eval"], name), toy["images"])
            distinct = {(s["text"] or "", s["image"]): s for r in rows for s in [r["query"]] + r["candidates"]}
            items += list(distinct.values())
            references += sum(1 + len(r["candidates"]) for r in rows)
        row["dedup_factor"] = references / len(items)
        items = random.Random(seed).sample(items, min(eval_items, len(items)))
    start = clock()
    embedder.encode(items, batch_size=16, num_workers=num_workers)
    row.update(items=len(items), items_per_s=len(items) / (clock() - start))
    dedup = f" | dedup factor {row['dedup_factor']:.2f} (references / distinct items)" if toy else ""
    report("eval", row, f"  {row['items_per_s']:,.1f} items/s over {len(items)} items (batch 16, {num_workers} "
                        f"workers){dedup}")


def main():
    """Build the model and the batches, then measure the wanted sections in order."""
    global device_, autocast, batch_size, grad_cache_batch, activation_checkpointing
    device_ = torch.device(device)
    if device_.type == "cpu" and threads:
        torch.set_num_threads(threads)
    ptdtype = getattr(torch, dtype)  # 'float32', 'bfloat16' or 'float16'
    autocast = torch.autocast(device_.type, dtype=ptdtype) if ptdtype != torch.float32 else nullcontext()
    real_shape = shape != "tiny"
    if real_shape and shape not in SHAPES:
        raise ValueError(f"shape must be 'tiny' or one of {sorted(SHAPES)}, got {shape!r}")
    batch_size = batch_size or (32 if real_shape else 8)
    grad_cache_batch = grad_cache_batch or (128 if real_shape else batch_size)
    activation_checkpointing = real_shape if activation_checkpointing is None else activation_checkpointing
    temporary = tempfile.TemporaryDirectory(prefix="pace_bench_", ignore_cleanup_errors=True)  # removed at exit
    wanted, folder = set(sections.split(",")), temporary.name
    torch.manual_seed(seed)
    checkpoint = make_tiny_checkpoint(os.path.join(folder, "tiny"), seed=seed)
    info = results["header"] = header()
    print(f"PACE bench | {shape} | {info['machine']} | {device} {dtype} | torch {info['torch']} | "
          f"transformers {info['transformers']} | commit {info['commit']} | {info['date']}")
    print("Gated DeltaNet kernels: " + " | ".join(f"{k}: {v}" for k, v in info["gated_deltanet"].items()), flush=True)

    # the model and this device's batches: the toy data on tiny, the MMEB-shaped mix on a real shape
    toy, toy_dataset = None, None
    if real_shape:
        preprocessor = Preprocessor.from_pretrained(checkpoint, min_pixels=MIN_PIXELS, max_pixels=max_pixels)
        rows = mix_rows(random.Random(seed), max(batch_size, grad_cache_batch), num_hard_negatives)
        items = list(torch.utils.data.DataLoader(range(len(rows)), batch_size=None, num_workers=num_workers,
                                                 collate_fn=functools.partial(mix_item, rows, preprocessor)))
        embedder = random_embedder(SHAPES[shape], preprocessor)
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shapes"))
        from prepare import prepare
        toy = prepare(os.path.join(folder, "shapes"), seed=seed, num_train=400)  # 10 batches of 32 for the padding
        embedder = Embedder.from_pretrained(checkpoint, max_length=512, max_pixels=128 * 128)  # config/shapes_stage1.py
        preprocessor = embedder.preprocessor
        toy_dataset = data.TrainDataset(data.load_train_rows(toy["train"], toy["images"], num_hard_negatives,
                                                             seed=seed), preprocessor)
        items = [toy_dataset[i] for i in range(max(batch_size, grad_cache_batch))]
    embedder.to(device_)
    batches = {False: collate_to_device(preprocessor, items[:batch_size], micro_batch),  # without GradCache
               True: collate_to_device(preprocessor, items[:grad_cache_batch], grad_cache_chunk)}  # and with it
    if activation_checkpointing:
        embedder.model.language_model.activation_checkpointing_enable({"use_reentrant": False})
    lora.inject_lora(embedder.model, lora_rank, 2 * lora_rank)  # Stage I: only the adapters train
    merged = copy.deepcopy(embedder)
    lora.merge_lora(merged.model)  # Stage II: the adapters folded in, then the whole language model trains
    merged.requires_grad_(False)
    merged.model.language_model.requires_grad_(True)

    if "step" in wanted:
        print(f"1. training step / floor (the bare backbone's forward + backward of the same chunks); median of "
              f"{iters} rounds after {warmup}; goal <= 1.10 (GradCache: against its own floor)", flush=True)
        for stage, model, loss_args, learning_rate in [
                ("Stage I (LoRA, cos)", embedder, dict(similarity="cos", temperature=0.1), 2e-5),
                ("Stage II (full, dot)", merged, dict(similarity="dot", temperature=100.0), 2e-6)]:
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=learning_rate, betas=(0.9, 0.999), weight_decay=0.0,
                                          fused=device_.type == "cuda")  # as train.py's, at its weight decay 0
            model.train()
            for grad_cache in (False, True):
                name = stage + (" + GradCache" if grad_cache else "")
                attempt("step", name, measure_step, name, model, optimizer, trainable,
                        batches[grad_cache], dict(loss_args, focal_gamma=2.0, focal_temperature=0.1), grad_cache,
                        model is merged)  # Stage II fine-tunes the whole language model
            optimizer.zero_grad(set_to_none=True)  # what a last row that ran out of memory left
    if "padding" in wanted:
        measure_padding(toy_dataset)
    if "lora" in wanted:
        print("3. LoRA: adapted / merged, forward + backward of the same chunks", flush=True)
        attempt("lora", "lora", measure_lora, embedder, merged, batches[False])
    del embedder, batches
    if "data" in wanted:
        print("4. data loading: TrainDataset + collate_train in one process, as one DataLoader worker", flush=True)
        stage1 = [r for r in results.get("step", []) if r["name"] == "Stage I (LoRA, cos)" and "step_s" in r]
        measure_data(Preprocessor.from_pretrained(checkpoint, min_pixels=MIN_PIXELS, max_pixels=max_pixels),
                     os.path.join(folder, "jpegs"), stage1[0]["step_s"] if stage1 and real_shape else None)
    if "eval" in wanted:
        print("5. evaluation: Embedder.encode", flush=True)
        merged.requires_grad_(False)
        merged.to(ptdtype)  # eval.py loads the model in its compute dtype
        attempt("eval", "eval", measure_eval, merged, toy)


if __name__ == "__main__":
    main()
