"""
train.py: both PACE stages, one file, read top to bottom.

    python train.py config/shapes_stage1.py                          # the toy's Stage I, on a laptop CPU
    torchrun --nproc_per_node=8 train.py config/stage1.py            # Stage I: LoRA, cosine logits, tau 0.1
    torchrun --nproc_per_node=8 train.py config/stage2.py            # Stage II: merged, full, dot logits, tau 100
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train.py ...

The defaults below are the paper's Stage I (Table 3); a config file or --key=value changes any of them. Stage I
trains LoRA adapters on the language model with cosine logits (eq. 1); Stage II merges a Stage I step's adapters
(lora.merge_lora) and trains the whole language model with dot-product logits (eq. 2); both weight each query by
the Focal Embedding Loss (eqs. 3-7, loss.py). The vision tower stays frozen. A step: each rank embeds its share of
the global batch, loss.py ranks every query against the candidates of all ranks, backward, clip, AdamW
(train_step.py), sharded with FSDP2 on several GPUs. The data is the prepared table (data.py), converted from the
downloads once (readers/training.py). Checkpoints (runs/checkpoint.py) hold model, optimizer, data position, RNG,
step and config; --resume=True continues the newest intact one exactly. out_dir/export/ gets the merged model.
"""
import atexit
import functools
import math
import os
import sys
import time

import torch
import torch.distributed as dist

import common
import configurator
import data
import lora
import loss
import rerank
import train_step
from common import UserError
from model import EmbeddingSpec
from readers import training
from runs import checkpoint, cost, outdir
from runs.export import check_checkpoint, inherited_spec, load_embedder, save_hf_folder

common.install_error_hook()  # a mistake to fix (a bad key, a missing file, a bad row) ends in one line
outdir.sturdy_output()  # a closed pipe (| tee, ended by the same Ctrl-C), a full disk or a lost terminal stop nothing
# -----------------------------------------------------------------------------
# config: the paper's Stage I (Table 3); config/*.py files and --key=value override it
out_dir = "out/stage1"  # checkpoints, log.jsonl, config.json and export/ go here
init_from = "models/Qwen3.5-0.8B-Base"  # a Hugging Face Qwen3.5 folder, or a step folder of an earlier run (Stage II)
objective = "embed"  # 'embed': the embedder, PACE's loss; 'rerank': a reranker of (query, candidate) prompts, eq. (R2) (rerank.py)
resume = False  # continue from the newest intact checkpoint in out_dir
allow_config_change = False  # with resume: let a resume change what defines the run (every key but runs/checkpoint.py's STEERING), recorded in config.json
overwrite = False  # a fresh run where an earlier run's checkpoints are: delete them (else the run refuses to start)
export_only = False  # with resume: write out_dir/export/ from the newest checkpoint and stop
train_data = ["data/mmE5/mmE5-MMEB-hardneg", "data/mmE5/mmE5-synthetic"]  # files, subset folders or download roots, or {"path", "image_dir", "max_rows", "weight", "parser"} dicts (readers/training.py)
image_dir = "data/mmE5"  # where the rows' image paths (images/...) are relative to, unless an entry names its own
train_split = "original"  # the split a subset folder is read through: MMEB-train's 'original' or 'diverse_instruction'
table_dir = "data/tables"  # where train_data is converted, once, into the table every rank memory-maps
allow_eval_datasets = False  # let train_data hold rows of MMEB's 16 out-of-distribution evaluation datasets
allow_any_image_path = False  # let rows name images outside image_dir (absolute paths, ../)
skip_bad_rows = False  # skip and count bad rows (a missing image, an empty query) and undecodable images instead of stopping
check_data = False  # read every source and row as the run would, report them and exit (0: the run would start, 1: not)
instructions = "paper"  # MMEB queries: 'paper' = Table 5's instruction per task format (readers/mmeb.py), 'dataset' = their own
max_iters = 7847  # optimizer steps: one epoch of ~2.0M rows at batch 256 (docs/experiments.md, "Batch size")
batch_size = 256  # global queries per step, split evenly over the ranks
homogeneous_batch = 0  # > 0: each group of this many queries on a rank from one train_data entry (VLM2Vec-V2's homogeneous batches)
num_hard_negatives = 5  # per query; candidates = all positives + all hard negatives of the global batch
# the embedding spec: every field of model.EmbeddingSpec but the backbone is a key, with the spec's default and comment
globals().update(EmbeddingSpec.defaults())
# the loss and the optimizer
learning_rate = 2e-5  # AdamW peak learning rate
warmup_ratio = 0.05  # share of max_iters with linear warmup
lr_decay = "linear"  # after warmup: 'linear' to 0, 'cosine' to 0, or 'constant'
weight_decay = 0.0  # AdamW weight decay on matrices
adam_betas = (0.9, 0.999)  # AdamW betas
grad_clip = 1.0  # clip the global gradient norm to this (0: off)
temperature = 0.1  # tau of the contrastive logits: 0.1 for cos, 100 for dot; a reranker's tau_r of eq. (R2)
focal_gamma = 2.0  # gamma of eq. (5); 0 is plain InfoNCE (the VLM2Vec baseline)
focal_temperature = 0.1  # tau_w of the cosine focal confidence, eq. (4)
weighting = "focal"  # query weights: 'focal' (eq. 5) or Figure 6(b)'s 'random', 'query_positive', 'query_negative'
soft_labels = "none"  # 'judge': UniME-V2's alignment with a judge's scores (tools/mine.py writes them), eqs. (U1)-(U4) of loss.py
judge_temperature = 0.02  # tau_j of the judge's soft labels, eq. (U1) (UniME-V2's code: 0.02)
alignment_weight = 1.0  # lambda of the alignment term, eq. (U4)
infonce_weight = 1.0  # mu of the InfoNCE beside it, eq. (U4); 0: UniME-V2's released loss, the alignment alone
alignment_floor = 0.0  # eps of UniME-V2's log(p + eps), eq. (U3') of loss.py (its code: 1e-8); 0: the exact KL
lora_rank = 32  # LoRA rank on the language model; 0 = full fine-tuning of the language model
lora_alpha = 64  # LoRA scale is alpha / rank
lora_dropout = 0.0  # dropout on the LoRA input
grad_cache_chunk = 0  # GradCache (Appendix C.1): items per chunk, 0 = off
micro_batch = 32  # without GradCache: at most this many items a forward call (data.split_by_length)
# the run
num_workers = 8  # DataLoader worker processes per rank (decode, resize, tokenise); at most the rank's share of the cores
checkpoint_interval = 500  # save a checkpoint every this many steps (and at the last step)
checkpoint_minutes = 30.0  # also save when this much wall time has passed since the last save (0: off)
stop_signals = ["SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP"]  # on one: finish the step, save, exit 75 (resume me)
keep_checkpoints = [2000, 4000, 7847]  # never pruned: Stage II starts from 2,000; Figure 6(a) from 4,000 and 7,847
keep_last = 2  # newest checkpoints kept besides keep_checkpoints
max_bad_steps = 10  # stop after this many bad steps in a row (non-finite, or the embeddings collapsed)
log_interval = 10  # print and log every this many steps (and at least every 30 s)
seed = 1337  # seeds data order, the fill of missing negatives, LoRA init and dropout
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype; master weights stay float32
activation_checkpointing = True  # recompute each decoder layer in backward: the paper's batch needs it at 80 GB
threads = 0  # torch threads of each process on a CPU (0: torch's default)
timeout_minutes = 10.0  # a collective that waits longer (a stopped or dead rank) ends the run
wandb_log = False  # also log to Weights & Biases (pip install wandb); a resumed run continues the same W&B run
wandb_project = "pace"  # W&B project
wandb_run_name = ""  # W&B run name ('' = out_dir)
config = configurator.configure(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------

for key, allowed in (("objective", ("embed", "rerank")), ("weighting", loss.WEIGHTINGS), ("dtype", ("float32", "bfloat16")), ("soft_labels", ("none", "judge")),
                     ("lr_decay", ("linear", "cosine", "constant")), ("instructions", ("paper", "dataset"))):
    configurator.check_choice(key, config[key], allowed)
# the spec: a field this config does not set is init_from's (Stage II keeps Stage I's pooling, dim, prompt, budgets)
spec_fields, spec_moves = inherited_spec(init_from, {key: config[key] for key in EmbeddingSpec.defaults()},
                                         configurator.chosen(globals()))
config.update(spec_fields)  # config.json, the resume check and the card say what the run uses
globals().update(spec_fields)
spec_said = f"spec against {init_from}'s: " + ", ".join(spec_moves)
# the spec's choices checked now (pooling, similarity, video_frames), before the data
EmbeddingSpec(**spec_fields)
reranking = objective == "rerank"
if reranking and (soft_labels != "none" or num_hard_negatives < 1):
    raise UserError("objective='rerank' learns from each row's positive against its negatives: soft_labels must be "
                    f"'none' and num_hard_negatives 1 or more (got {soft_labels!r}, {num_hard_negatives})")
configurator.check_counts(config, ("checkpoint_interval", "log_interval", "keep_last", "max_iters", "max_bad_steps"))

# -----------------------------------------------------------------------------
# data: the prepared table (converted from train_data on first use, by one process), checked before anything else

table = data.TrainTable(training.prepared_table(train_data, image_dir, table_dir, train_split, instructions,
                                               allow_any_image_path))
# the table's name covers its row files, not their images: each looked up again (seconds)
if check_data:
    table.subsets = training.subsets_on_disk(table)
problems = training.image_dir_problems(train_data, image_dir, table.subsets) + training.problems(
    table.subsets, num_hard_negatives, skip_bad_rows, allow_eval_datasets, soft_labels == "judge")
if len(table) < batch_size:
    problems.append(f"{len(table):,} usable rows cannot fill one batch of {batch_size}")
# the mixture's sources, or None: rows drawn uniformly
sources = training.mixture(train_data, image_dir, table.subsets, homogeneous_batch)
# what the rows are, said by --check_data and at a run's start alike
data_lines = training.report_lines(table.subsets, num_hard_negatives, video_frames) + (
    training.mixture_lines(sources, batch_size, homogeneous_batch) if sources else [])
# --check_data=True: no model, no process group; what the run would meet before step 1, a verdict
if check_data:
    # the ranks torchrun starts; a plain --check_data=True checks one process
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    problems += common.refusals((data.check_batch, batch_size, ranks, homogeneous_batch),
                                (check_checkpoint, init_from),
                                (outdir.refuse_mixing, out_dir, not (resume or export_only), overwrite))
    print("\n".join(data_lines))
    configurator.print_config(config)
    if spec_moves:
        print(spec_said)
    bad, usable = (sum(sum(s[key].values()) for s in table.subsets) for key in ("bad", "files"))
    print(f"check_data: {len(table.subsets)} subsets, {usable:,} usable rows, {bad:,} bad, on {ranks} rank(s); " + (
        "the run would start" if not problems else "the run would NOT start:\n  " + "\n  ".join(problems)))
    sys.exit(1 if problems else 0)
if problems:
    raise UserError("train_data: " + "; ".join(problems) + " (--check_data=True reports every source)")

rank, local_rank, world_size, run_device = common.compute_init(device, timeout_minutes)
master, distributed = rank == 0, world_size > 1
if not master:
    # rank 0 speaks for all; every rank's errors still reach stderr
    sys.stdout = open(os.devnull, "w")
# the batch's split over the ranks, before the model (--check_data asks the same)
data.check_batch(batch_size, world_size, homogeneous_batch)
ptdtype = getattr(torch, dtype)
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(seed + rank)

# out_dir: one run at a time (the lock), never two runs mixed, what a crash left cleared; a bad init_from refused first
check_checkpoint(init_from)
lock = common.on_rank_zero(lambda: outdir.take_lock(out_dir), rank, world_size)
atexit.register(outdir.release_lock, lock)
export_dir, log_path = os.path.join(out_dir, "export"), os.path.join(out_dir, "log.jsonl")
# refused on every rank alike
earlier = outdir.refuse_mixing(out_dir, fresh=not (resume or export_only), overwrite=overwrite)
if master:
    outdir.clear(out_dir, earlier)  # what a crash left; with overwrite, the earlier run
    configurator.print_config(config)
    if spec_moves:
        print(spec_said)
    print("\n".join(data_lines))
common.barrier()
resume_from = common.on_rank_zero(lambda: outdir.newest_intact(out_dir) if resume or export_only else None, rank,
                                  world_size)
# every rank resumes from what rank 0 verified
resumed = checkpoint.read_info(resume_from) if resume_from else {}
if (resume or export_only) and resume_from is None:
    if export_only:
        raise UserError(f"no intact checkpoint in {out_dir}: nothing to export")
    print(f"no intact checkpoint in {out_dir}: starting fresh")
if resume and not export_only and outdir.is_finished(resumed, max_iters, checkpoint.read_info(export_dir)):
    print(f"{out_dir} finished at step {max_iters} and is exported: nothing to do (export/ and its model card are "
          "kept; raise --max_iters to train on)")
    common.barrier()
    sys.exit(0)
changed = outdir.resume_changes(resumed.get("config", {}), config, allow_config_change) if resume_from else {}
if changed:
    print(f"resuming {resume_from} with changed settings: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in
                                                                        changed.items()))
if master:
    outdir.write_config(os.path.join(out_dir, "config.json"), config, resumed.get("step", 0), changed)

# -----------------------------------------------------------------------------
# model: a Hugging Face backbone, or a Stage I step folder whose LoRA is merged first (Stage II), under this run's spec

embedder, _ = load_embedder(init_from, torch.float32, **spec_fields)
if lora.merge_lora(embedder):  # Stage II from a Stage I step folder: fold its adapters into W
    print(f"merged the LoRA adapters of {init_from}")
if reranking:  # the same backbone under a second head: the LM head's rows of yes and no, frozen (rerank.py)
    embedder = rerank.Reranker.of(embedder, init_from)
language_model = embedder.model.language_model
torch.manual_seed(seed)  # identical adapter init on every rank
if lora_rank > 0:
    wrapped = lora.inject_lora(embedder.model, lora_rank, lora_alpha, lora_dropout)
else:  # full fine-tuning: every parameter (a fork's own too) but the vision tower's
    embedder.requires_grad_(True)
    embedder.model.visual.requires_grad_(False)
    if reranking:  # the token embeddings stay: where the head is tied they are what the score reads
        language_model.embed_tokens.requires_grad_(False)
torch.manual_seed(seed + rank)
# transformers checkpoints a layer's forward inside FSDP2's hooks, so a recomputed layer sees bf16 inputs (FSDP2
# skipped that cast when the checkpoint wrapped the unit before torch 2.13: pytorch issue 159359)
if activation_checkpointing:
    embedder.enable_activation_checkpointing()
embedder.to(run_device)
if distributed:
    # FSDP2: bf16 compute, float32 reduction and master weights
    train_step.fully_shard_embedder(embedder, ptdtype)
# bf16 autocast in one process on a GPU, else none
autocast = train_step.autocast_for(embedder, ptdtype)
trainable = train_step.trainable_parameters(embedder)
num_trainable, num_language = sum(p.numel() for p in trainable), sum(p.numel() for p in language_model.parameters())
print(f"trainable: {num_trainable / 1e6:.2f}M parameters, " + (
    f"rank-{lora_rank} LoRA adapters on {len(wrapped)} linear layers of the {(num_language - num_trainable) / 1e6:.2f}M"
    "-parameter language model" if lora_rank > 0 else "the whole language model") + "; the vision tower is frozen")
if embedder.family.linear_attention:
    print(cost.kernel_report(run_device))
optimizer = train_step.adamw(embedder, learning_rate, adam_betas, weight_decay, sharded=distributed)
# the loss's settings: the reranker's, eq. (R2), or eqs. (3)-(7)
loss_args = dict(temperature=temperature) if reranking else dict(
    similarity=similarity, temperature=temperature, focal_gamma=focal_gamma, focal_temperature=focal_temperature,
    weighting=weighting, matryoshka_dims=matryoshka_dims)
judged = soft_labels == "judge"
if judged:
    loss_args.update(judge_temperature=judge_temperature, alignment_weight=alignment_weight,
                     infonce_weight=infonce_weight, alignment_floor=alignment_floor)  # (U1)-(U4)


def get_lr(it):
    """Linear warmup over warmup_ratio * max_iters, then decay to zero (or constant). it: 0-based step."""
    warmup = max(1, round(warmup_ratio * max_iters))
    if it < warmup:
        return learning_rate * (it + 1) / warmup
    progress = (it - warmup) / max(1, max_iters - warmup)
    if lr_decay == "cosine":
        return learning_rate * 0.5 * (1 + math.cos(math.pi * progress))
    return learning_rate * (1 - progress) if lr_decay == "linear" else learning_rate


# -----------------------------------------------------------------------------
# batches: this rank's share of each global batch, decoded and tokenised in worker processes

preprocessor = embedder.preprocessor
if allow_eval_datasets and any(s["leak"] for s in table.subsets):
    print("allow_eval_datasets=True: training on " + ", ".join(sorted({s["dataset"] for s in table.subsets if s["leak"]}))
          + ", MMEB out-of-distribution evaluation datasets: their MMEB scores are no longer out of distribution")
# a reranker's rows are its (query, candidate) prompts, each query with its positive and its negatives
dataset = (rerank.PairDataset(table, embedder.prompt, num_hard_negatives, seed, skip_bad_rows) if reranking else
           data.TrainDataset(table, preprocessor, num_hard_negatives, seed, skip_bad_rows))
sampler = data.MixtureSampler(sources, batch_size, rank, world_size, seed, homogeneous_batch) if sources else \
    data.ShardedBatchSampler(len(dataset), batch_size, rank, world_size, seed=seed)
# a source shorter than a group repeats within it, as VLM2Vec-V2 restarts a read-through one
for source in sources or []:
    if source["rows"] < homogeneous_batch * world_size:
        print(f"note: {source['path']} has {source['rows']} rows, fewer than a group of {homogeneous_batch} queries on "
              f"each of {world_size} ranks: its rows repeat within a group")
# Each side's items are sorted by length and cut into chunks, one forward call each: short items do not pad to
# the longest of the batch. The number of chunks depends on the item count alone, never on tokens: every rank
# makes the same number of forward calls, each FSDP2 forward being a collective.
collate = (rerank.collate_pairs if reranking else data.collate_train)(preprocessor, grad_cache_chunk or micro_batch or None)
workers = common.worker_count(num_workers)
loader_args = dict(batch_sampler=sampler, num_workers=workers, collate_fn=collate, pin_memory=run_device.type == "cuda",
                   # the stop signals are the main process's
                   worker_init_fn=functools.partial(outdir.ignore_signals, stop_signals))
print(f"{len(dataset):,} training rows ({table.path}), {sampler.batches_per_epoch:,} steps an epoch at batch "
      f"{batch_size}" + (f"; {workers} DataLoader workers (num_workers={num_workers}, more than this rank's cores)"
                         if workers < num_workers else ""))


# -----------------------------------------------------------------------------
# checkpoints: out_dir/step_NNNNNN (the format is in runs/checkpoint.py)

# the run's counters, saved with every checkpoint
step, bad_steps_total, skipped_rows_total = 0, 0, 0

def save_checkpoint(step):
    """out_dir/step_NNNNNN, written by every rank (runs/checkpoint.save_step); then the old ones are pruned."""
    checkpoint.save_step(checkpoint.step_path(out_dir, step), embedder, optimizer, rank, world_size, {
        "step": step, "lora_rank": lora_rank, "lora_alpha": lora_alpha, "sampler": sampler.state_dict(),
        "world_size": world_size, "table": table.path, "bad_steps": bad_steps_total,
        "skipped_rows": skipped_rows_total, "config": config})
    if master:
        outdir.prune(out_dir, keep_last, keep_checkpoints)
    common.barrier()


def export(step):
    """out_dir/export/: the consolidated model with LoRA merged, as a Hugging Face folder with a model card."""
    # imported here, where it is needed: 0.8 s of every start otherwise
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    print(f"exporting {export_dir} ...", flush=True)
    state = get_model_state_dict(embedder, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if master:
        state = lora.merge_lora_state_dict(state, lora_alpha)
        if reranking and embedder.head_source:  # an untied head: the backbone's, frozen, beside the weights, in
            # their float32 (config.json then says float32)
            state.update({k: v.float() for k, v in rerank.lm_head_tensors(embedder.head_source).items()})
        save_hf_folder(state, embedder.spec, export_dir, {"step": step, "trained_lora_rank": lora_rank, "config": config})
        print(f"exported {export_dir}")
    common.barrier()


# -----------------------------------------------------------------------------
# the loop

if resume_from:
    # the model, the optimizer, this rank's RNG
    info = checkpoint.load_step(resume_from, embedder, optimizer, rank, world_size)
    step, bad_steps_total, skipped_rows_total = info["step"], info.get("bad_steps", 0), info.get("skipped_rows", 0)
    sampler.load_state_dict(info["sampler"])
    print(f"resumed from {resume_from} at step {step}")
if export_only:
    export(step)
    sys.exit(0)
wandb = outdir.start_wandb(out_dir, resume_from is not None, wandb_project, wandb_run_name or out_dir, config) \
    if wandb_log and master else None
gpu_peak = cost.peak_flops(run_device)
# log.jsonl: this run's steps
log = outdir.StepLog(log_path, step, max_iters, world_size, gpu_peak, master, wandb)
bad_in_row, first_bad, stopping, last_save = 0, 0, False, time.time()
# a signal only sets stop.received: the step in progress finishes
stop = outdir.StopSignals(stop_signals)
embedder.train()
# its own generator: making the iterator would otherwise draw from the global RNG, after a resume restored it
loader = iter(torch.utils.data.DataLoader(dataset, generator=torch.Generator().manual_seed(seed + rank), **loader_args))
# the loader's workers ignore the stop signals, so at exit they are killed, on every path
outdir.kill_workers_at_exit()
while step < max_iters:
    step += 1  # the number of this step, from 1, as every line and record shows it
    batch = next(loader)
    sampler.position += 1  # consumed (workers prefetch ahead; checkpoints save what the loop used)
    lr = get_lr(step - 1)
    for group in optimizer.param_groups:
        group["lr"] = lr
    terms = train_step.forward_backward(embedder, batch, loss_args, grad_cache_chunk, autocast, judged)
    grad_norm = train_step.clip_gradients(trainable, grad_clip)

    # one all-reduce a step, summed over the ranks, so that every rank skips, logs, saves and
    # stops at the same steps (each a collective): the loss (eq. 7, the mean of the ranks'
    # terms.loss), whether the embeddings collapsed (every logit of a query alike), this rank's
    # undecodable rows, 30 s since the last line, a stop signal, checkpoint_minutes since the
    # last save
    now = time.time()
    host = [len(batch["skipped"]), now - log.window["start"] > 30, bool(stop.received),
            0 < checkpoint_minutes * 60 < now - last_save]
    local = torch.stack([terms.loss.detach().float() / world_size, loss.collapse_flag(terms)])
    step_totals = torch.cat([local, torch.tensor(host, dtype=torch.float32, device=run_device)])
    if distributed:
        dist.all_reduce(step_totals)
    loss_value, collapsed, skipped_now, line_due, signalled, save_due = step_totals.tolist()
    stopping = signalled > 0

    # the update, unless the step went wrong: the same verdict on every rank (loss and norm are global)
    problem = ""
    if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
        problem = "a non-finite loss or gradient"
    elif collapsed == world_size:
        problem = "collapsed embeddings (every logit of a query alike)"
    if not problem:
        optimizer.step()
        bad_in_row = 0
    else:
        first_bad = first_bad if bad_in_row else step
        bad_in_row, bad_steps_total = bad_in_row + 1, bad_steps_total + 1
        print(f"step {step}/{max_iters}: {problem} (loss {loss_value}, grad norm {grad_norm}); "
              f"update skipped ({bad_in_row} in a row, {bad_steps_total} in all)")
    optimizer.zero_grad(set_to_none=True)

    # the log: every step's tokens and time; a line every log_interval (statistics: one all-reduce more)
    chunks = batch["query"] + batch["candidate"]
    flops = cost.step_flops(embedder, chunks, lora_rank == 0) if gpu_peak else 0
    log.add(chunks, batch["skipped"], int(skipped_now), flops)
    skipped_rows_total += int(skipped_now)  # every step, so a checkpoint at any step saves it
    if step % log_interval == 0 or step in (1, max_iters) or line_due > 0 or stopping:
        counts = {"bad_steps": bad_steps_total, "skipped_rows": skipped_rows_total}
        log.line(step, loss.statistics(terms), lr, grad_norm, counts)
    if bad_in_row >= max_bad_steps:
        break

    # a checkpoint, only of weights that are numbers
    due = step % checkpoint_interval == 0 or step == max_iters or step in keep_checkpoints
    if due or stopping or save_due > 0:
        if not problem and train_step.parameters_finite(trainable):
            save_checkpoint(step)
            last_save = time.time()
        else:
            print(f"step {step}: no checkpoint written: {problem or 'the parameters are not all finite'}")
    if stopping:
        break

stopped = bad_in_row >= max_bad_steps
if stopping and not stopped:
    good = checkpoint.complete(out_dir)
    print(f"stopped at step {step} on {stop.received or 'a signal to another rank'}; the newest checkpoint is "
          f"{good[-1] if good else 'none'}: continue with --resume=True (exit code {outdir.EXIT_RESUME})", flush=True)
elif stopped:
    # step first_bad's forward ran on the weights saved as step first_bad - 1: that checkpoint, and any after it,
    # hold weights that went wrong. They move aside (nothing is deleted), so --resume=True takes the one before.
    if master:
        for path in outdir.set_aside(out_dir, first_bad - 1):
            print(f"moved {path} aside to {path}.suspect: its weights led to step {first_bad}")
    good = checkpoint.complete(out_dir)
    print(f"stopping: {bad_in_row} bad steps in a row from step {first_bad}; the last good checkpoint is "
          f"{good[-1] if good else 'none'}")
else:
    export(step)
    print(f"draw the training curves: python -m tools.plot {out_dir}")
common.barrier()
if distributed:
    dist.destroy_process_group()
sys.exit(1 if stopped else outdir.EXIT_RESUME if stopping else 0)
