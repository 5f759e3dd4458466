"""
train.py: both PACE stages, one file, read top to bottom.

    python train.py config/shapes_stage1.py                          # toy Stage I on a laptop CPU
    torchrun --nproc_per_node=8 train.py config/stage1.py            # Stage I: LoRA, cosine, tau 0.1
    torchrun --nproc_per_node=8 train.py config/stage2.py            # Stage II: merged, full, dot, tau 100
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train.py ...

Stage I (PACE.md, Table 3): LoRA on the language model, cosine logits (eq. 1), Focal Embedding Loss.
Stage II: init_from a Stage I step folder; its adapters are merged (lora.merge_lora) and the whole
language model trains with dot-product logits (eq. 2); the focal confidence stays cosine (eq. 4).
The vision tower and its merger stay frozen in both.

Multi-GPU: FSDP2 (fully_shard per decoder layer, then the root, which holds the frozen vision tower),
bf16 parameters with float32 gradient reduction and float32 master weights. Each rank encodes its share
of the global batch; loss.py gathers the candidates of all ranks. Checkpoints are sharded
(torch.distributed.checkpoint) and hold model, optimizer, data position, RNG, step and config;
`--resume=True` continues the newest one exactly. At the end a merged Hugging Face folder is written
to out_dir/export/.
"""
import glob
import json
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

import data
import lora
from configurator import configure, print_config, save_config
from loss import forward_backward, pace_loss
from model import compute_init, load_embedder, read_checkpoint_info, save_hf_folder

# -----------------------------------------------------------------------------
# config: defaults are the paper's Stage I (Table 3); config/*.py files override them
out_dir = "out/stage1"  # checkpoints, log.jsonl, config.json and export/ go here
init_from = ""  # a Hugging Face Qwen3.5 folder, or a step folder of an earlier run (Stage II)
resume = False  # continue from the newest complete checkpoint in out_dir
export_only = False  # with resume: write out_dir/export/ from the newest checkpoint and stop
train_data = []  # list of paths (JSON Lines / Parquet) or (path, max_rows) pairs, mixed in one run
image_dir = ""  # root that the rows' image paths are relative to
skip_bad_rows = False  # skip and count malformed rows instead of stopping with an error
max_iters = 2000  # optimizer steps
batch_size = 32  # global queries per step, split evenly over the ranks
num_hard_negatives = 5  # per query; candidates = all positives + all hard negatives of the global batch
max_length = 8192  # tokens per item; text is truncated, never image placeholders or the template
max_pixels = 1605632  # image pixel budget (paper: 1,605,632)
min_pixels = 0  # 0: the checkpoint's own minimum
learning_rate = 2e-5  # AdamW peak learning rate
warmup_ratio = 0.05  # share of max_iters with linear warmup
lr_decay = "linear"  # after warmup: 'linear' to 0, 'cosine' to 0, or 'constant'
weight_decay = 0.0  # AdamW weight decay on matrices
adam_betas = (0.9, 0.999)  # AdamW betas
grad_clip = 1.0  # clip the global gradient norm to this (0: off)
similarity = "cos"  # 'cos' (eq. 1, Stage I) or 'dot' (eq. 2, Stage II)
temperature = 0.1  # tau of the contrastive logits: 0.1 for cos, 100 for dot
focal_gamma = 2.0  # gamma of eq. (5); 0 is plain InfoNCE (the VLM2Vec baseline)
focal_temperature = 0.1  # tau_w of the cosine focal confidence, eq. (4)
lora_rank = 32  # LoRA rank on the language model; 0 = full fine-tuning of the language model
lora_alpha = 64  # LoRA scale is alpha / rank
lora_dropout = 0.0  # dropout on the LoRA input
grad_cache_chunk = 0  # GradCache (Appendix C.1): items per chunk, 0 = off
micro_batch = 32  # without GradCache: at most this many items a forward call (data.split_by_length)
num_workers = 4  # DataLoader worker processes per rank (decode, resize, tokenise)
checkpoint_interval = 500  # save a checkpoint every this many steps (and at the last step)
keep_checkpoints = [2000]  # steps whose checkpoints pruning never removes (Stage II starts from 2000)
keep_last = 2  # newest checkpoints kept besides keep_checkpoints
max_bad_steps = 10  # stop after this many non-finite losses in a row
log_interval = 10  # print and log every this many steps
seed = 1337  # seeds data order, LoRA init and dropout
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype; master weights stay float32
compile = False  # torch.compile each decoder layer
activation_checkpointing = False  # recompute each decoder layer in backward to save memory
wandb_log = False  # also log to Weights & Biases
wandb_project = "pace"  # W&B project
wandb_run_name = ""  # W&B run name ('' = out_dir)
config = configure(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------


rank, local_rank, world_size, device_ = compute_init(device)
master = rank == 0
distributed = world_size > 1
if batch_size % world_size:
    raise ValueError(f"batch_size={batch_size} must split evenly over {world_size} ranks")
if similarity not in ("cos", "dot"):
    raise ValueError(f"similarity must be 'cos' or 'dot', got {similarity!r}")
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
torch.manual_seed(seed + rank)
if master:
    os.makedirs(out_dir, exist_ok=True)
    print_config(config)
    save_config(config, os.path.join(out_dir, "config.json"))


def log0(*args):
    if master:
        print(*args, flush=True)


def complete_checkpoints():
    """Step folders of out_dir that finished writing, oldest first."""
    paths = [p for p in glob.glob(os.path.join(out_dir, "step_*")) if not p.endswith(".tmp")]
    return sorted(p for p in paths if os.path.isfile(os.path.join(p, "pace.json")))


# -----------------------------------------------------------------------------
# model: a Hugging Face backbone, or a Stage I step folder whose LoRA is merged first (Stage II)

resume_from = complete_checkpoints()[-1] if (resume or export_only) and complete_checkpoints() else None
if (resume or export_only) and resume_from is None:
    log0(f"no complete checkpoint in {out_dir}: {'nothing to export' if export_only else 'starting fresh'}")
    if export_only:
        sys.exit(1)
if not init_from:
    raise ValueError("set init_from to a Qwen3.5 folder or a training step folder")
pixel_args = dict(max_length=max_length, max_pixels=max_pixels or None, min_pixels=min_pixels or None)
embedder, init_info = load_embedder(init_from, torch.float32, **pixel_args)
backbone = init_info.get("backbone", init_from)  # the Hugging Face folder at the root of the lineage
if lora.merge_lora(embedder):  # Stage II from a Stage I step folder: fold its adapters into W
    log0(f"merged the LoRA adapters of {init_from}")
torch.manual_seed(seed)  # identical adapter init on every rank
if lora_rank > 0:
    wrapped = lora.inject_lora(embedder.model, lora_rank, lora_alpha, lora_dropout)
    log0(f"LoRA rank {lora_rank} on {len(wrapped)} linear layers of the language model")
else:
    embedder.requires_grad_(False)
    embedder.model.language_model.requires_grad_(True)  # full fine-tuning; vision tower stays frozen
torch.manual_seed(seed + rank)
layers = embedder.model.language_model.layers
if activation_checkpointing:
    embedder.model.language_model.activation_checkpointing_enable({"use_reentrant": False})
if compile:
    for layer in layers:
        layer.compile()  # in place: parameter names, and so checkpoints, are unchanged
embedder.to(device_)
autocast = nullcontext()
if distributed:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=ptdtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    # The frozen vision tower is not a unit of its own: a rank whose batch holds no image never calls it,
    # and a unit's all-gather is a collective every rank must join. In the root unit it is gathered with
    # the embeddings at every forward, whichever ranks see images.
    fully_shard(embedder, mp_policy=policy)
elif ptdtype != torch.float32:
    autocast = torch.autocast(device_.type, dtype=ptdtype)
trainable = [p for p in embedder.parameters() if p.requires_grad]
num_trainable = sum(p.numel() for p in trainable)
num_language = sum(p.numel() for p in embedder.model.language_model.parameters())
log0(f"trainable parameters: {num_trainable / 1e6:.2f}M of {num_language / 1e6:.2f}M in the language model")

decay = [p for p in trainable if p.dim() >= 2]
no_decay = [p for p in trainable if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=learning_rate, betas=adam_betas, fused=device_.type == "cuda")


def get_lr(step):
    """Linear warmup over warmup_ratio * max_iters, then decay to zero (or constant)."""
    warmup = max(1, round(warmup_ratio * max_iters))
    if step < warmup:
        return learning_rate * (step + 1) / warmup
    progress = (step - warmup) / max(1, max_iters - warmup)
    if lr_decay == "cosine":
        return learning_rate * 0.5 * (1 + math.cos(math.pi * progress))
    if lr_decay == "linear":
        return learning_rate * (1 - progress)
    return learning_rate


# -----------------------------------------------------------------------------
# data: this rank's share of each global batch, decoded and tokenised in worker processes

preprocessor = embedder.preprocessor
rows = data.load_train_rows(train_data, image_dir, num_hard_negatives, seed=seed, skip_bad_rows=skip_bad_rows)
dataset = data.TrainDataset(rows, preprocessor)
sampler = data.ShardedBatchSampler(len(dataset), batch_size, rank, world_size, seed=seed)
# Each side's items are sorted by length and cut into chunks, one forward call each: short items no longer
# pad to the longest of the batch (bench.py measures the padding share). The number of chunks depends on
# the item count alone, never on tokens: every rank must make the same number of forward calls, each FSDP2
# forward being a collective; the cuts go where padding is least.
collate = data.collate_train(preprocessor, max_items=grad_cache_chunk or micro_batch or None)
loader_args = dict(batch_sampler=sampler, num_workers=num_workers, collate_fn=collate,
                   pin_memory=device_.type == "cuda")
log0(f"{len(dataset)} training rows, {sampler.batches_per_epoch} steps per epoch at batch {batch_size}")


# -----------------------------------------------------------------------------
# checkpoints

def checkpoint_state():
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(embedder, optimizer)
    return {"model": model_state, "optim": optim_state}


def save_checkpoint(step):
    """out_dir/step_NNNNNN: sharded model and optimizer, plus pace.json and each rank's RNG. Written to a
    .tmp folder and renamed, so the newest complete checkpoint is never half-written."""
    import torch.distributed.checkpoint as dcp
    path = os.path.join(out_dir, f"step_{step:06d}")
    tmp = path + ".tmp"
    if master:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    if distributed:
        dist.barrier()
    dcp.save(checkpoint_state(), checkpoint_id=tmp)
    rng = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device_.type == "cuda" else None}
    torch.save(rng, os.path.join(tmp, f"rng_rank{rank}.pt"))
    if distributed:
        dist.barrier()
    if master:
        info = {"step": step, "backbone": backbone, "lora_rank": lora_rank, "lora_alpha": lora_alpha,
                "similarity": similarity, "sampler": sampler.state_dict(), "world_size": world_size,
                "bad_steps": bad_steps_total, "config": config}
        with open(os.path.join(tmp, "pace.json"), "w") as f:
            json.dump(info, f, indent=2)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        prune_checkpoints()
    if distributed:
        dist.barrier()
    log0(f"saved {path}")


def prune_checkpoints():
    steps = complete_checkpoints()
    for path in steps[:-keep_last] if keep_last > 0 else steps:
        if read_checkpoint_info(path)["step"] not in keep_checkpoints:
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path):
    """Restore model, optimizer and this rank's RNG from a step folder; -> its pace.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    info = read_checkpoint_info(path)
    state = checkpoint_state()
    dcp.load(state, checkpoint_id=path)
    set_state_dict(embedder, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng_path = os.path.join(path, f"rng_rank{rank}.pt")
    if os.path.isfile(rng_path) and info.get("world_size") == world_size:
        rng = torch.load(rng_path, weights_only=False)
        torch.set_rng_state(rng["cpu"])
        if rng["cuda"] is not None and device_.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"])
    return info


def export(step):
    """out_dir/export/: the consolidated model with LoRA merged, as a Hugging Face folder."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(embedder, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if master:
        state = lora.merge_lora_state_dict(state, lora_alpha / lora_rank if lora_rank > 0 else 0.0)
        save_hf_folder(state, backbone, os.path.join(out_dir, "export"),
                       {"step": step, "backbone": backbone, "similarity": similarity, "lora_rank": 0})
        print(f"exported {os.path.join(out_dir, 'export')}", flush=True)
    if distributed:
        dist.barrier()


# -----------------------------------------------------------------------------
# the training step

def encode(batch):
    """A collated batch on this rank -> (B, D) float32 embeddings."""
    batch = {k: v.to(device_, non_blocking=True) if v is not None else None for k, v in batch.items()}
    with autocast:
        return embedder(**batch)


def step_loss(q, c, targets):
    return pace_loss(q, c, targets.to(device_), similarity=similarity, temperature=temperature,
                     focal_gamma=focal_gamma, focal_temperature=focal_temperature)


def grad_norm_and_clip():
    norm = torch.nn.utils.clip_grad_norm_(trainable, grad_clip if grad_clip > 0 else float("inf"))
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


def count_tokens(batch):
    chunks = batch["query"] + batch["candidate"]
    return sum(int(chunk["attention_mask"].sum()) for chunk in chunks), sum(chunk["attention_mask"].numel() for chunk in chunks)


# -----------------------------------------------------------------------------
# the loop

step, bad_steps_total = 0, 0
if resume_from:
    info = load_checkpoint(resume_from)
    step, bad_steps_total = info["step"], info.get("bad_steps", 0)
    sampler.load_state_dict(info["sampler"])
    log0(f"resumed from {resume_from} at step {step}")
if export_only:
    export(step)
    sys.exit(0)
if wandb_log and master:
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name or out_dir, config=config)

peak_flops = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}
gpu_peak = next((v for k, v in peak_flops.items() if device_.type == "cuda" and k in torch.cuda.get_device_name()), None)
# MFU counts matmul weights only (the token embedding is a lookup) and real tokens only (not padding):
# forward 2N, backward 4N (LoRA: 2N, no weight gradients). Attention and the vision tower are left out.
num_matmul = num_language - embedder.model.language_model.embed_tokens.weight.numel()
flops_per_token = (6 if lora_rank == 0 else 4) * num_matmul
bad_in_row, tokens_seen, real_seen, t0 = 0, 0, 0, time.time()
embedder.train()
loader = iter(torch.utils.data.DataLoader(dataset, **loader_args))  # endless: epochs follow each other
while step < max_iters:
    batch = next(loader)
    sampler.position += 1  # consumed (workers prefetch ahead; checkpoints save what the loop used)
    lr = get_lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    stats = forward_backward(encode, batch, step_loss, grad_cache=bool(grad_cache_chunk),
                             gradient_sync=embedder.set_requires_gradient_sync if distributed else None)
    grad_norm = grad_norm_and_clip()
    finite = math.isfinite(stats["loss"]) and math.isfinite(grad_norm)  # the same on every rank
    if finite:
        optimizer.step()
        bad_in_row = 0
    else:
        bad_in_row, bad_steps_total = bad_in_row + 1, bad_steps_total + 1
        log0(f"step {step}: non-finite loss {stats['loss']} or grad norm {grad_norm}; update skipped "
             f"({bad_in_row} in a row, {bad_steps_total} in all)")
    optimizer.zero_grad(set_to_none=True)
    real, computed = count_tokens(batch)
    tokens_seen, real_seen = tokens_seen + computed, real_seen + real
    step += 1
    if step % log_interval == 0 or step == max_iters or step == 1:
        elapsed, t0 = time.time() - t0, time.time()
        tokens_per_s = tokens_seen * world_size / elapsed  # computed positions, padding included
        real_per_s = real_seen * world_size / elapsed
        tokens_seen = real_seen = 0
        record = {"step": step, "loss": stats["loss"], "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": tokens_per_s, "padding": 1 - real / computed, "bad_steps": bad_steps_total,
                  **{k: v for k, v in stats.items() if k != "loss"}}
        if device_.type == "cuda":
            record["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
            if gpu_peak:
                record["mfu"] = flops_per_token * real_per_s / (gpu_peak * world_size)
        if master:
            with open(os.path.join(out_dir, "log.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            extra = f" mfu {record['mfu']:.1%}" if "mfu" in record else ""
            print(f"step {step}/{max_iters} | loss {stats['loss']:.4f} | lr {lr:.2e} | grad {grad_norm:.3f} | "
                  f"pos_prob {stats['pos_prob']:.3f} | q_norm {stats['query_norm']:.2f} | "
                  f"{tokens_per_s:.0f} tok/s{extra}", flush=True)
            if wandb_log:
                wandb.log(record, step=step)
    if bad_in_row >= max_bad_steps:
        log0(f"stopping: {bad_in_row} non-finite steps in a row; the last good checkpoint is "
             f"{(complete_checkpoints() or ['none'])[-1]}")
        break
    if finite and (step % checkpoint_interval == 0 or step == max_iters or step in keep_checkpoints):
        save_checkpoint(step)

stopped = bad_in_row >= max_bad_steps
if not stopped:
    export(step)
if distributed:
    dist.barrier()
    dist.destroy_process_group()
sys.exit(1 if stopped else 0)
