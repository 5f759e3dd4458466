"""
bench/bench.py: PACE's speed against the floor. One script, one table (in the spirit of nanoGPT's bench.py).

    python -m bench.bench                                  # CPU: tiny Qwen3.5 + toy data, about two minutes
    python -m bench.bench --sections=padding               # one section only (here: seconds)
    python -m bench.bench --sections=startup               # reading and checking 200,000 rows in the real layout
    python -m bench.bench --sections=gdn                   # the Gated DeltaNet's rule: ours against transformers'
    python -m bench.bench --fsdp=True                      # the step through FSDP2, as train.py runs on 8 GPUs
    python -m bench.bench --shape=qwen3.5-0.8b             # GPU: random weights in the real shapes, the paper's batch
    python -m bench.bench --shape=qwen3.5-2b --out=bench/out/2b.json --compare=bench/out/2b_before.json
    bash bench/gpu.sh                                      # a GPU machine: both shapes, tables to $OUT

The step timed is train.py's own: the functions of train_step.py that train.py's loop calls. Each timing is a
ratio taken side by side: round-robin, the median over `iters` rounds (after `warmup`) of the ratio within a
round, so the machine's speed and its drift cancel out.
1. step: the whole PACE step (embed, loss eqs. (3)-(7), backward, clipping, AdamW) over its floor, the embedder's
   forward + backward of the same chunks, the sum of the embeddings as the loss (one graph; per chunk under
   GradCache), same trainable set: Stage I (LoRA, cos) and Stage II (full, dot), with and without GradCache (its own
   floor adds one no-grad forward of all chunks). Goal <= 1.10. Then Stage I on 8-frame video queries against its
   floor, Stage II with Matryoshka's prefixes over Stage II without, and the reranker's step (rerank.py: LoRA, a
   query's positive and negatives as (query, candidate) prompts, eq. R2) over its floor, the same forward and
   backward with the scores' sum as the loss.
2. padding: the share of computed positions that are padding, and the forward calls a batch, under three cuts
   of each side: ceil(n / max_items) near-equal chunks in the batch's order or length-sorted (the simple rule),
   and data.split_by_length's least-padding cut; on the toy data and on the MMEB-shaped length mix
   (synthetic.py). Goal <= 10 %. Sorting acts within a batch: which rows meet stays random.
3. cut: the plain step's time under the least-padding cut over the simple rule's, on the same MMEB-shaped rows
   (at most 3 rounds after 1).
4. LoRA: forward + backward of the adapted model over the merged one (both backpropagate to the embeddings).
5. data: items/s per DataLoader worker (JPEG decode, resize, patchify, tokenise, collate); on GPU the headroom
   of `num_workers` workers over the Stage I step.
6. eval: Embedder.encode items/s and, on the toy set, eval.py's dedup factor (references / distinct items).
7. startup (not in the default sections): 200,000 synthetic rows in the real mmE5 layout and 300k / 2.03M as many
   LLaVA-Hound video rows (bench/startup.py) converted into the prepared table once (rows/s, peak memory), then two
   training starts at once on it as two ranks (plain, then a weighted mixture of its subsets in same-source groups):
   seconds and private memory before the first step, the file pages mapped (shared); then --check_data=True on the
   cached table (seconds grow with the image files, --startup_images); extrapolated to 2.03M rows and 300k videos.
8. gdn (not in the default sections; first where asked for): one Gated DeltaNet layer's rule, deltanet.py's against
   transformers' (and fla's on a GPU), time, error and ops per layer; then both stages' steps under each path, and
   the profiler's ten costliest ops of one step (bench/gdn.py; with --out, also into <out>_profile.txt).
On a GPU the step rows add tokens/s, MFU (runs/cost.py) and peak memory; the header says which Gated DeltaNet kernels
run. --fsdp=True shards both stages' models in a one-rank process group (gloo on CPU, NCCL on CUDA) with
train_step.fully_shard_embedder and runs forward_backward's distributed path, as on 8 GPUs (step and cut).
"""
import copy
import functools
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import common
import data
import loss
import rerank
import train_step
from bench import gdn, startup, synthetic  # the data, models and cuts measured on; the Gated DeltaNet's section
from bench.timing import Results, attempt, clock, paired_ratio, side_by_side
from configurator import configure
from model import Preprocessor
from runs.cost import kernel_report, peak_flops, step_flops
from shapes.tiny_model import make_tiny_checkpoint

_here = os.path.dirname(os.path.abspath(__file__))
# -----------------------------------------------------------------------------
# config (--key=value, as train.py)
shape = "tiny"  # 'tiny' (the tiny checkpoint + the toy data) or 'qwen3.5-0.8b', 'qwen3.5-2b' (random weights)
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype; weights float32, as train.py
fsdp = False  # shard with train_step.fully_shard_embedder in a one-rank process group: the 8-GPU code path
batch_size = 0  # queries per step; 0 = 32 on a real shape (the paper's, per GPU), 8 on tiny
num_hard_negatives = 5  # per query (paper)
grad_cache_chunk = 8  # items per GradCache chunk
grad_cache_batch = 0  # queries per GradCache step; 0 = 128 on a real shape (a GPU's share of 1,024 on 8), else batch
micro_batch = 32  # without GradCache: at most this many items a forward call (train.py's micro_batch)
activation_checkpointing = None  # recompute each decoder layer in backward (train.py's flag); None = on for real shapes
lora_rank = 32  # Stage I LoRA rank (alpha = 2 * rank)
max_pixels = 1605632  # image pixel budget (paper)
num_workers = 8 if torch.cuda.is_available() else 0  # DataLoader workers per GPU (config/stage1.py)
threads = 1  # torch threads on a CPU run: one keeps timings steady; OpenMP barriers stall when cores are shared
eval_items = 512  # items Embedder.encode is timed on (a seeded sample; the dedup factor counts them all)
iters = 10  # timed rounds per figure (median)
warmup = 2  # untimed rounds first
sections = "step,padding,cut,lora,data,eval"  # which figures to measure, comma-separated (also: startup, gdn)
seed = 0  # seeds the synthetic data
out = ""  # also write the results as JSON here (rewritten after every row: a run cut short keeps what it did)
compare = ""  # a previous --out JSON: ratios more than 10 % worse than there are flagged REGRESSION
startup_rows = 200_000  # rows the startup section reads
startup_images = 1000  # image files a subset of its download holds (at most one a row): what --check_data looks up
config = configure(globals(), sys.argv[1:]) if __name__ == "__main__" else {}
real_shape = shape != "tiny"  # the defaults that depend on the shape (0 or None above)
batch_size = batch_size or (32 if real_shape else 8)
grad_cache_batch = grad_cache_batch or (128 if real_shape else batch_size)
activation_checkpointing = real_shape if activation_checkpointing is None else activation_checkpointing
# -----------------------------------------------------------------------------

STAGES = [("Stage I (LoRA, cos)", dict(similarity="cos", temperature=0.1), 2e-5),  # name, loss, learning rate
          ("Stage II (full, dot)", dict(similarity="dot", temperature=100.0), 2e-6)]
FOCAL = dict(focal_gamma=2.0, focal_temperature=0.1, weighting="focal")  # the paper's Focal Embedding Loss, both stages
ROW_ITEMS = 2 + num_hard_negatives  # items a row: the query, its positive, its hard negatives


# -----------------------------------------------------------------------------
# the step as train.py takes it

def step_inputs(embedder, loss_args, grad_cache, autocast):
    """What one measured step needs: the embedder, its trainable parameters, the loss arguments (the stage's
    similarity and temperature, the paper's focal settings) and the GradCache chunk (0: plain)."""
    return {"embedder": embedder, "trainable": train_step.trainable_parameters(embedder), "autocast": autocast,
            "loss_args": {**loss_args, **FOCAL}, "grad_cache_chunk": grad_cache_chunk if grad_cache else 0,
            "device": embedder.device}


def train_step_once(step, optimizer, batch):
    """One optimizer step as train.py's loop takes it: forward_backward, clip_gradients (grad_clip 1.0, as the
    paper's runs), AdamW, zero_grad."""
    terms = train_step.forward_backward(step["embedder"], batch, step["loss_args"], step["grad_cache_chunk"],
                                        step["autocast"])
    grad_norm = train_step.clip_gradients(step["trainable"], 1.0)
    # the step's verdict, read back once as train.py reads it (there within the all-reduce every step makes)
    loss_value, collapsed = torch.stack([terms.loss.detach().float(), loss.collapse_flag(terms)]).tolist()
    if math.isfinite(loss_value) and math.isfinite(grad_norm) and not collapsed:  # train.py skips such an update too
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def floor_step(step, batch, one_graph):
    """The floor: the embedder's forward and backward of the same chunks (train_step.embed), the sum of the
    embeddings as the loss, gradients dropped after. one_graph: one backward over all chunks, as the plain step
    (its loss couples them); else one a chunk, as GradCache's second pass (FSDP2 reducing after the last only)."""
    chunks, embedder = batch["query"] + batch["candidate"], step["embedder"]
    if one_graph:
        sum(train_step.embed(embedder, chunk, step["autocast"]).sum() for chunk in chunks).backward()
    else:
        for i, chunk in enumerate(chunks):
            if train_step.sharded(embedder):
                embedder.set_requires_gradient_sync(i == len(chunks) - 1)
            train_step.embed(embedder, chunk, step["autocast"]).sum().backward()
    for p in step["trainable"]:
        p.grad = None


# -----------------------------------------------------------------------------
# what a figure is counted from

def padded_size(lengths, chunks):
    """Positions the model computes for these chunks: each chunk is as long as its longest item."""
    return sum(max(lengths[i] for i in chunk) * len(chunk) for chunk in chunks)


def batch_tokens(batch):
    """A collated batch -> (its chunks, real tokens, the share of computed positions that is padding)."""
    chunks = batch["query"] + batch["candidate"]
    real = sum(int(c["attention_mask"].sum()) for c in chunks)
    return chunks, real, 1 - real / sum(c["attention_mask"].numel() for c in chunks)


def header(device):
    """The config, the machine, the software, the commit and the Gated DeltaNet kernels."""
    import transformers
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if os.path.exists("/proc/cpuinfo") else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "CPU")
    machine = (f"{torch.cuda.get_device_name(device)}, 1 GPU" if device.type == "cuda"
               else f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)")
    commit = subprocess.run("git describe --always --dirty=+uncommitted", shell=True, capture_output=True, text=True,
                            cwd=_here).stdout.strip()  # no git: empty
    return {**{key: globals()[key] for key in config}, "machine": machine, "date": time.strftime("%Y-%m-%d"),
            "commit": os.environ.get("BENCH_COMMIT") or commit or "unknown", "torch": torch.__version__,
            "transformers": transformers.__version__, "kernels": kernel_report(device)}


# -----------------------------------------------------------------------------
# the measurements

def measure_steps(results, stages, batches, video_batch, reranker=None):
    """Section 1: each stage's step, plain and with GradCache, against its floor; Stage I's on video queries; the
    reranker's (its name, optimizer, step inputs and batch of pairs)."""
    print(f"1. training step / floor (the embedder's forward + backward of the same chunks); median of {iters} "
          f"rounds after {warmup}; goal <= 1.10 (GradCache: against its own floor)", flush=True)
    for stage, (name, optimizer, steps) in enumerate(stages):
        for grad_cache in (False, True):
            label = name + (" + GradCache" if grad_cache else "")
            attempt(results, "step", label, measure_step, label, steps[grad_cache], optimizer, batches[grad_cache],
                    grad_cache, stage == 1)  # Stage II fine-tunes the whole language model
            optimizer.zero_grad(set_to_none=True)  # what a row that ran out of memory left
    name, optimizer, steps = stages[0]
    attempt(results, "step", "video", measure_step, "Stage I, 8-frame videos", steps[False], optimizer, video_batch,
            False, False)
    name, optimizer, steps = stages[1]
    attempt(results, "step", "Stage II + MRL", measure_matryoshka, steps[False], optimizer, batches[False])
    optimizer.zero_grad(set_to_none=True)
    if reranker is not None:
        name, optimizer, step, pairs = reranker
        attempt(results, "step", "reranker", measure_step, name, step, optimizer, pairs, False, False)


def measure_matryoshka(results, step, optimizer, batch):
    """Section 1's last row: Stage II's step with Matryoshka's prefixes D/2 and D/4 over it without (goal <= 1.02)."""
    dim = step["embedder"].dim
    matryoshka = dict(step, loss_args=dict(step["loss_args"], matryoshka_dims=(dim // 4, dim // 2)))
    times, seconds = side_by_side({"mrl": lambda: train_step_once(matryoshka, optimizer, batch),
                                   "plain": lambda: train_step_once(step, optimizer, batch)}, step["device"], iters, warmup)
    row = {"name": "Stage II + MRL", "dims": [dim // 4, dim // 2], "step_s": seconds["mrl"],
           "ratio": paired_ratio(times["mrl"], times["plain"])}
    results.add("step", row, f"  {'Stage II + MRL (D/4, D/2)':<32} step {seconds['mrl'] * 1e3:8.1f} ms | "
                             f"over the step without them {row['ratio']:.3f}" + (" (over goal)" if row["ratio"] > 1.02 else ""),
                "ratio")


def measure_step(results, name, step, optimizer, batch, grad_cache, full_finetune):
    """Section 1, one row: a step (plain or GradCache) against its floor."""
    device, (chunks, real, padding) = step["device"], batch_tokens(batch)
    functions = {"step": lambda: train_step_once(step, optimizer, batch),
                 "floor": lambda: floor_step(step, batch, one_graph=not grad_cache)}
    if grad_cache:  # GradCache's first pass, which its own floor adds: every chunk embedded without a graph
        functions["no_grad_forward"] = torch.no_grad()(
            lambda: [train_step.embed(step["embedder"], chunk, step["autocast"]) for chunk in chunks])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    long_step = grad_cache and device.type == "cuda" and grad_cache_batch > batch_size  # fewer rounds
    rounds = (min(iters, 2), min(warmup, 1)) if long_step else (iters, warmup)
    times, seconds = side_by_side(functions, device, *rounds)
    row = {"name": name, "queries": len(batch["rows"]), "chunks": len(chunks), "real_tokens": real,
           "padding": padding, "step_s": seconds["step"], "floor_s": seconds["floor"],
           "ratio": paired_ratio(times["step"], times["floor"]), "tokens_per_s": real / seconds["step"]}
    line = (f"  {name:<32} {row['queries']:>4} q {len(chunks):>4} chunks | step {seconds['step'] * 1e3:8.1f} ms | "
            f"floor {seconds['floor'] * 1e3:8.1f} ms | ratio {row['ratio']:.3f}")
    key = "ratio_own_floor" if grad_cache else "ratio"
    if grad_cache:
        own_floor = [a + b for a, b in zip(times["floor"], times["no_grad_forward"])]
        row.update(no_grad_forward_s=seconds["no_grad_forward"], ratio_own_floor=paired_ratio(times["step"], own_floor))
        line += f" | own floor {row['ratio_own_floor']:.3f}"
    line += (" (over goal)" if row[key] > 1.10 else "") + f" | {row['tokens_per_s']:,.0f} tok/s"
    if device.type == "cuda":
        peak = peak_flops(device)
        row.update(peak_memory_gb=torch.cuda.max_memory_allocated() / 2**30,
                   mfu=step_flops(step["embedder"], chunks, full_finetune) / seconds["step"] / peak if peak else None)
        line += f" | MFU {format(row['mfu'], '.1%') if peak else '-'} | peak {row['peak_memory_gb']:.1f} GB"
    results.add("step", row, line, key)


def measure_padding(results, toy_dataset):
    """Section 2: padding share and forward calls a batch under each cut. Positions are counted from the lengths,
    as data.collate_train pads: each chunk to its longest item."""
    data_sets = synthetic.padding_batches(toy_dataset, num_hard_negatives, max_pixels, seed)  # name -> batches
    tokens_per_row = sum(map(sum, sum(data_sets["mix"], []))) / (32 * len(data_sets["mix"]))
    print(f"2. padding: share of computed positions (each side cut apart, as data.collate_train) and forward calls a "
          f"batch, over batches of 32 rows: {len(data_sets.get('toy', []))} toy, 100 MMEB-shaped ({tokens_per_row:,.0f}"
          f" real tokens a row); goal <= 10 % with the cut train.py uses", flush=True)
    for label, max_items in [("one chunk per side", None), (f"micro_batch {micro_batch}", micro_batch),
                             (f"GradCache {grad_cache_chunk}", grad_cache_chunk)]:
        for cut, split in synthetic.CUTS.items() if max_items else [("", data.split_by_length)]:
            row, parts = {"name": f"{label}, {cut}" if cut else label}, []
            for key, batches in data_sets.items():
                lengths = sum(batches, [])  # every side of every batch
                chunks = [split(side, max_items) for side in lengths]
                row[key] = 1 - sum(map(sum, lengths)) / sum(map(padded_size, lengths, chunks))
                row[f"{key}_calls"] = sum(map(len, chunks)) / len(batches)
                parts.append(f"{'toy' if key == 'toy' else 'MMEB-shaped mix'} {row[key]:6.1%}, "
                             f"{row[f'{key}_calls']:4.1f} calls")
            results.add("padding", row, f"  {row['name']:<36} " + " | ".join(parts))


def measure_cuts(results, stages, items, preprocessor):
    """Section 3: each stage's plain step on the same rows under the least-padding cut and the simple rule."""
    print(f"3. cut: the plain step on {batch_size} MMEB-shaped rows, micro_batch {micro_batch}: the least-padding "
          f"cut (data.split_by_length) / the sorted items in ceil(n / {micro_batch}) equal chunks", flush=True)
    batches = {cut: synthetic.collate(preprocessor, items, micro_batch, synthetic.CUTS[cut])
               for cut in ("sorted, equal chunks", "least padding")}
    for name, optimizer, steps in stages:
        attempt(results, "cut", name, measure_cut, name, steps[False], optimizer, batches)


def measure_cut(results, name, step, optimizer, batches):
    """Section 3, one row: over at most 3 rounds after 1 (its steps are long)."""
    times, seconds = side_by_side({cut: functools.partial(train_step_once, step, optimizer, batch)
                                   for cut, batch in batches.items()}, step["device"], min(iters, 3), min(warmup, 1))
    row = {"name": name, "ratio": paired_ratio(times["least padding"], times["sorted, equal chunks"])}
    for cut, batch in batches.items():
        chunks, _, padding = batch_tokens(batch)
        row[cut] = {"step_s": seconds[cut], "calls": len(chunks), "padding": padding}
    parts = [f"{cut} {row[cut]['step_s'] * 1e3:7.1f} ms ({row[cut]['calls']} calls, {row[cut]['padding']:.1%} padding)"
             for cut in batches]
    results.add("cut", row, f"  {name:<22} " + " | ".join(parts) + f" | least padding / equal {row['ratio']:.3f}")


def measure_lora(results, adapted, merged, batch):
    """Section 4: the floor of section 1 on the same chunks, adapted model over merged (frozen) model; both
    backpropagate down to the input embeddings."""
    print("4. LoRA: adapted / merged, forward + backward of the same chunks", flush=True)
    hooks = [step["embedder"].model.language_model.embed_tokens.register_forward_hook(
        lambda module, inputs, output: output.requires_grad_()) for step in (adapted, merged)]
    try:
        times, seconds = side_by_side({"adapted": lambda: floor_step(adapted, batch, one_graph=True),
                                       "merged": lambda: floor_step(merged, batch, one_graph=True)}, adapted["device"],
                                      iters, warmup)
    finally:
        for hook in hooks:
            hook.remove()
    row = {"name": "lora", "rank": lora_rank, "adapted_s": seconds["adapted"], "merged_s": seconds["merged"],
           "ratio": paired_ratio(times["adapted"], times["merged"])}
    results.add("lora", row, f"  rank {lora_rank}: adapted {row['adapted_s'] * 1e3:.1f} ms | merged "
                             f"{row['merged_s'] * 1e3:.1f} ms | ratio {row['ratio']:.3f}", "ratio")


def measure_data(results, preprocessor, folder):
    """Section 5: one worker's items per second on MMEB-shaped rows whose images are JPEG files on disk; on a GPU,
    against what the Stage I step of section 1 consumes."""
    print("5. data loading: TrainDataset + collate_train in one process, as one DataLoader worker", flush=True)
    dataset, image_share = synthetic.jpeg_dataset(folder, preprocessor, 4 * batch_size, num_hard_negatives, max_pixels,
                                                  seed)
    collate_fn = data.collate_train(preprocessor, max_items=micro_batch)  # as train.py's DataLoader without GradCache
    collate_fn([dataset[i] for i in range(batch_size)])  # warm-up: imports, tokenizer caches
    start = time.perf_counter()
    for k in range(4):
        collate_fn([dataset[i] for i in range(k * batch_size, (k + 1) * batch_size)])
    items_per_s = 4 * batch_size * ROW_ITEMS / (time.perf_counter() - start)
    paper_items = 32 * ROW_ITEMS  # the paper's 32 queries a GPU
    row = {"name": "data", "items_per_s_per_worker": items_per_s, "worker_s_per_paper_batch": paper_items / items_per_s,
           "image_share": image_share}
    line = (f"  {items_per_s:.0f} items/s per worker ({row['image_share']:.0%} of the items with a JPEG of 256-768 px "
            f"a side); one worker takes {row['worker_s_per_paper_batch']:.1f} s per paper batch of {paper_items} items")
    stage1 = [r for r in results.data.get("step", []) if r["name"] == STAGES[0][0] and "step_s" in r]
    if stage1 and real_shape and num_workers:  # the Stage I step's items against what the workers supply in its time
        row["headroom"] = num_workers * items_per_s * stage1[0]["step_s"] / (batch_size * ROW_ITEMS)
        line += f"; {num_workers} workers supply {row['headroom']:.1f}x what the Stage I step consumes"
    results.add("data", row, line)


def measure_eval(results, embedder, toy, device):
    """Section 6: Embedder.encode items/s: on the toy set, with eval.py's dedup factor; else on MMEB-shaped items."""
    print("6. evaluation: Embedder.encode", flush=True)
    items, dedup_factor = synthetic.eval_items(toy, eval_items, num_hard_negatives, max_pixels, seed)
    row = {"name": "eval"} if dedup_factor is None else {"name": "eval", "dedup_factor": dedup_factor}
    start = clock(device)
    embedder.encode(items, batch_size=16, num_workers=num_workers)
    row.update(items=len(items), items_per_s=len(items) / (clock(device) - start))
    dedup = f" | dedup factor {row['dedup_factor']:.2f} (references / distinct items)" if toy else ""
    results.add("eval", row, f"  {row['items_per_s']:,.1f} items/s over {len(items)} items (batch 16, {num_workers} "
                             f"workers){dedup}")


def measure_startup(results, num_rows, images_per_subset):
    """Section 7: num_rows rows of a synthetic mmE5 download and 300k / 2.03M as many video rows converted into the
    prepared table, then two training starts on it at once (startup.startup_figures), each in a process of its own:
    conversion rows per second and its memory at the peak, each start's seconds and private memory before its first
    step, --check_data=True's seconds on the cached table, extrapolated to the paper's 2.03M rows and 300k videos."""
    print(f"7. start-up: {num_rows:,} rows in the mmE5-MMEB-hardneg layout (20 subsets, list-literal negatives) and "
          "LLaVA-Hound video captions, converted once, then two starts at once as two ranks, each in a process of its "
          "own", flush=True)
    row = startup.startup_figures(num_rows, num_hard_negatives, seed, images_per_subset)
    results.add("startup", row, f"  conversion {row['conversion_rows_per_s']:,.0f} rows/s (peak growth "
                f"{row['conversion_peak_growth_bytes_per_row']:,.0f} B a row, table {row['table_bytes_per_row']:,.0f} B a "
                f"row) | a start {row['start_s']:.2f} s, {row['start_private_bytes'] / 2**20:.1f} MB private, "
                f"{row['start_file_resident_bytes'] / 2**20:.1f} MB mapped (shared) | a weighted mixture of its 21 "
                f"subsets in same-source groups, resumed half way: {row['mixture_start_s']:.2f} s, "
                f"{row['mixture_start_private_bytes'] / 2**20:.1f} MB private | --check_data=True on the cached table "
                f"{row['check_data_s']:.2f} s ({row['image_files']:,} image files and {row['video_folders']:,} video "
                f"folders looked up) | the paper's {row['paper_rows']:,} rows and {row['paper_video_rows']:,} videos: "
                f"conversion about {row['paper_conversion_s']:,.0f} s once, --check_data {row['paper_check_data_s']:.1f} s, "
                f"a start at most {row['paper_start_s_at_most']:.1f} s and {row['paper_start_private_mb_at_most']:.0f} MB "
                f"a rank (a mixture's {row['paper_mixture_start_s_at_most']:.1f} s and "
                f"{row['paper_mixture_start_private_mb_at_most']:.0f} MB), a table of {row['paper_table_gb']:.2f} GB")


# -----------------------------------------------------------------------------
# the model, its two stages, the process group

def shard(models, ptdtype, results):
    """FSDP2 exactly as train.py shards: train_step.fully_shard_embedder on each model; the header says so."""
    from torch.distributed.tensor import DTensor
    for model in models:
        train_step.fully_shard_embedder(model, ptdtype)
    sharding = results.data["header"]["sharding"] = {
        "backend": dist.get_backend(), "world_size": dist.get_world_size(),
        "dtensor_parameters": all(isinstance(p, DTensor) for m in models for p in m.parameters())}
    print(f"FSDP2 (train_step.fully_shard_embedder): {sharding}; sections step and cut only", flush=True)
    results.write()


def reranker_step(reranker, autocast, items):
    """The reranker's row: the reranker (a copy of Stage I's LoRA model under rerank.py's head), AdamW at Stage I's
    rate, its step inputs at tau_r = 1, and the batch of these PairDataset items (rerank.collate_pairs).
    -> (name, optimizer, step inputs, batch)"""
    optimizer = train_step.adamw(reranker, STAGES[0][2], (0.9, 0.999), 0.0, sharded=fsdp)
    step = dict(step_inputs(reranker, {}, False, autocast), loss_args={"temperature": 1.0})
    return "Reranker (LoRA, pairs)", optimizer, step, rerank.collate_pairs(reranker.preprocessor, micro_batch)(items)


def train_stages(models, autocast):
    """Each stage's name, AdamW (train_step.adamw, as train.py builds it) and its step_inputs, plain and with
    GradCache. -> [(name, optimizer, {grad_cache: step_inputs})]"""
    stages = []
    for (name, loss_args, learning_rate), model in zip(STAGES, models):
        optimizer = train_step.adamw(model, learning_rate, (0.9, 0.999), 0.0, sharded=fsdp)
        stages.append((name, optimizer, {grad_cache: step_inputs(model, loss_args, grad_cache, autocast)
                                         for grad_cache in (False, True)}))
    return stages


def main():
    """Build the model, its two stages and the batches, then measure the wanted sections in order."""
    if real_shape and shape not in synthetic.SHAPES:
        raise common.UserError(f"shape must be 'tiny' or one of {sorted(synthetic.SHAPES)}, got {shape!r}")
    if fsdp and "RANK" not in os.environ:  # outside torchrun: join a one-rank process group, as train.py's ranks do
        synthetic.one_rank_torchrun()
    run_device = common.compute_init(device)[3]  # as train.py takes it (NCCL on CUDA, gloo on CPU)
    if run_device.type == "cpu" and threads:
        torch.set_num_threads(threads)
    ptdtype = getattr(torch, dtype)  # 'float32' or 'bfloat16'; under FSDP2 its MixedPrecisionPolicy casts instead
    wanted = set(sections.split(",")) & {"step", "cut"} if fsdp else set(sections.split(","))
    if wanted == {"startup"}:  # no model needed
        results = Results(out, compare)
        results.data["header"] = {"sections": sections, "startup_rows": startup_rows, "startup_images": startup_images}
        return measure_startup(results, startup_rows, startup_images)
    temporary = tempfile.TemporaryDirectory(prefix="pace_bench_", ignore_cleanup_errors=True)  # removed at exit
    torch.manual_seed(seed)
    checkpoint = make_tiny_checkpoint(os.path.join(temporary.name, "tiny"), seed=seed)
    mix_preprocessor = Preprocessor.from_pretrained(checkpoint, min_pixels=synthetic.MIN_PIXELS, max_pixels=max_pixels)
    results = Results(out, compare)
    info = results.data["header"] = header(run_device)
    print(f"PACE bench | {shape} | {info['machine']} | {run_device} {dtype} | torch {info['torch']} | "
          f"transformers {info['transformers']} | commit {info['commit']} | {info['date']}\n{info['kernels']}")
    count = max(batch_size, grad_cache_batch)  # items enough for either batch
    if real_shape:  # random weights in a real shape, the MMEB-shaped mix
        embedder, toy, toy_dataset = synthetic.random_embedder(shape, mix_preprocessor, run_device), None, None
        items = synthetic.mix_items(mix_preprocessor, count, num_hard_negatives, max_pixels, seed, num_workers)
    else:  # the tiny checkpoint, the toy data
        embedder, toy, toy_dataset = synthetic.toy_data(temporary.name, checkpoint, num_hard_negatives, seed)
        items = [toy_dataset[i] for i in range(count)]
    models = synthetic.stage_models(embedder.to(run_device), lora_rank, activation_checkpointing)
    if "step" in wanted:  # the reranker's row: Stage I's LoRA model, its own copy, under rerank.py's head
        models = (*models, rerank.Reranker.of(copy.deepcopy(models[0]), checkpoint).train())
    if fsdp:
        shard(models, ptdtype, results)
    autocast = train_step.autocast_for(models[0], ptdtype)  # as train.py: none under FSDP2 or in float32
    stages = train_stages(models, autocast)
    batches = {False: synthetic.collate(embedder.preprocessor, items[:batch_size], micro_batch),  # without GradCache
               True: synthetic.collate(embedder.preprocessor, items[:grad_cache_batch], grad_cache_chunk)}  # with it

    if "gdn" in wanted:  # the layer's rule, then each stage's plain step by path (first: the GPU run's main figures)
        gdn.measure_layers(results, run_device, ptdtype, min(iters, 3), min(warmup, 1))
        steps, (chunks, real, _) = [], batch_tokens(batches[False])
        for stage, (name, optimizer, step) in enumerate(stages):  # Stage II fine-tunes the whole language model
            steps.append((name, functools.partial(train_step_once, step[False], optimizer, batches[False]), real,
                          step_flops(step[False]["embedder"], chunks, stage == 1)))
        gdn.measure_step_paths(results, steps, run_device, iters, warmup, peak_flops(run_device),
                               out.removesuffix(".json") + "_profile.txt" if out else "")
    if "step" in wanted:  # and a batch of video queries, LLaVA-Hound's caption retrieval; the reranker's pairs
        video = synthetic.video_items(embedder.preprocessor, batch_size, num_hard_negatives, seed)
        prompt = models[2].prompt
        pairs = synthetic.mix_items(mix_preprocessor, batch_size, num_hard_negatives, max_pixels, seed, num_workers,
                                    prompt) if real_shape else [rerank.PairDataset(
                                        toy_dataset.table, prompt, num_hard_negatives, seed)[i] for i in range(batch_size)]
        measure_steps(results, stages, batches, synthetic.collate(embedder.preprocessor, video, micro_batch),
                      reranker_step(models[2], autocast, pairs))
    if "padding" in wanted:
        measure_padding(results, toy_dataset)
    if "cut" in wanted:  # a real shape's items are the mix already
        rows = items[:batch_size] if real_shape else synthetic.mix_items(
            mix_preprocessor, batch_size, num_hard_negatives, max_pixels, seed, num_workers)
        measure_cuts(results, stages, rows, mix_preprocessor)
    merged = models[1].requires_grad_(False)  # from here on Stage II's model is frozen
    if "lora" in wanted:
        frozen = step_inputs(merged, STAGES[1][1], False, autocast)
        attempt(results, "lora", "lora", measure_lora, stages[0][2][False], frozen, batches[False])
    if "data" in wanted:
        measure_data(results, mix_preprocessor, os.path.join(temporary.name, "jpegs"))
    if "eval" in wanted:
        attempt(results, "eval", "eval", measure_eval, merged.to(ptdtype), toy, run_device)  # eval.py's compute dtype
    if "startup" in wanted:
        measure_startup(results, startup_rows, startup_images)
    if fsdp:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    common.install_error_hook()
    main()
