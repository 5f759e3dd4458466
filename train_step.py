"""
train_step.py: one PACE training step and what it runs on, as functions with explicit arguments: train.py calls
them in its loop, bench/bench.py times them and the tests check them, so all three run the same code.

    fully_shard_embedder(embedder, torch.bfloat16)                  # FSDP2, in torchtitan's order (several ranks)
    optimizer = adamw(embedder, lr=2e-5, betas=(0.9, 0.999), weight_decay=0.0, sharded=True)
    terms = forward_backward(embedder, batch, loss_args, grad_cache_chunk=0)   # embed, eqs. (3)-(7), backward
    grad_norm = clip_gradients(trainable_parameters(embedder), 1.0)
    optimizer.step(); optimizer.zero_grad(set_to_none=True)

A step: each rank embeds its share of the global batch (queries, then their positives and hard negatives), loss.py
ranks every query against the candidates of all ranks, backward; train.py then clips and steps AdamW. GradCache
(Appendix C.1) gives the same gradients as the plain step in the memory of one chunk. What a step costs and which
kernels run it: runs/cost.py.
"""
from contextlib import nullcontext

import torch
import torch.distributed as dist

import loss


def fully_shard_embedder(embedder, param_dtype):
    """FSDP2 in torchtitan's order: each decoder layer is a unit (its all-gather overlaps the previous layer's
    compute), then the root, which holds the embeddings and the frozen vision tower. The tower is not a unit of
    its own: a rank whose batch has no image never calls it, and a unit's all-gather is a collective every rank
    must join; in the root it is gathered at every forward. param_dtype compute (bf16), float32 gradient
    reduction; the optimizer keeps float32 master weights. Inject or merge LoRA before this, never after."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in embedder.model.language_model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(embedder, mp_policy=policy)


def sharded(module):
    """True when fully_shard wrapped module (FSDP2 adds set_requires_gradient_sync): its parameters are DTensors."""
    return hasattr(module, "set_requires_gradient_sync")


def trainable_parameters(embedder):
    return [p for p in embedder.parameters() if p.requires_grad]


def adamw_options(torch_version, device_type, sharded):
    """AdamW's implementation for this torch and device. Fused (one kernel for all parameters) is the fastest on
    CUDA, but on FSDP2's DTensor parameters torch 2.10 and 2.11 leak host memory with it, about one DTensorSpec
    per tensor per step (https://github.com/pytorch/pytorch/issues/181761,
    https://github.com/pytorch/pytorch/issues/188174): foreach there. On a CPU, foreach."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    if device_type == "cuda" and not (sharded and (major, minor) in ((2, 10), (2, 11))):
        return {"fused": True}
    return {"foreach": True}


def adamw(embedder, lr, betas, weight_decay, sharded):
    """AdamW over the trainable parameters: weight decay on matrices only, the implementation adamw_options picks."""
    trainable = trainable_parameters(embedder)
    groups = [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]
    options = adamw_options(torch.__version__, embedder.device.type, sharded)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **options)


def autocast_for(embedder, dtype):
    """The autocast a step runs under: none when FSDP2 casts (it holds its own MixedPrecisionPolicy) or the compute
    dtype is float32; else bf16 autocast on the embedder's device (one process on a GPU)."""
    if sharded(embedder) or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(embedder.device.type, dtype=dtype)


def embed(embedder, chunk, autocast=None):
    """One collated chunk of this rank's batch -> (B, D) float32 embeddings."""
    with autocast or nullcontext():
        return embedder(**chunk)


def forward_backward(embedder, batch, loss_args, grad_cache_chunk=0, autocast=None, judged=False):
    """Embed the batch, compute the loss (loss.pace_loss(**loss_args): similarity, temperature, focal_gamma,
    focal_temperature, weighting; judged: also the batch's judge scores, at loss_args' judge_temperature and
    alignment_weight) and backpropagate. -> loss.LossTerms (for the step's verdict and, on log steps, statistics).
    Plain: one graph over every chunk, one backward. GradCache (grad_cache_chunk > 0; the collate cut the batch
    into chunks of that many items), a large batch in the memory of one chunk: 1) embed every chunk without a
    graph; 2) the loss, and its gradient with respect to those embeddings; 3) embed each chunk again, with a
    graph, and backpropagate its share of that gradient. The same gradients as the plain step: each re-embedding
    replays its first pass's RNG state (dropout draws the same masks), and FSDP2 reduces gradients once, after
    the last chunk. Both compute the loss at one line, the place for what a fork adds to it. A reranker's batch
    (rerank.collate_pairs: "pairs") holds one side, its prompts, each embedded to a score: loss.rerank_loss."""
    device = embedder.device
    if judged:  # UniME-V2's alignment: each query's own candidates and their scores
        loss_args = dict(loss_args, judge_scores=batch["judge_scores"].to(device),
                         own_candidates=batch["own_candidates"].to(device))
    chunks, rng_states = batch["query"] + batch["candidate"], []
    with torch.no_grad() if grad_cache_chunk else nullcontext():  # GradCache's 1): no graph
        embeddings = []
        for chunk in chunks:
            if grad_cache_chunk:
                rng_states.append((torch.get_rng_state(), torch.cuda.get_rng_state() if device.type == "cuda" else None))
            embeddings.append(embed(embedder, chunk, autocast))
    if grad_cache_chunk:  # 2) the loss's gradient stops at the embeddings
        embeddings = [e.requires_grad_() for e in embeddings]
    if "pairs" in batch:  # a reranker's (query, candidate) scores, eq. (R1): each query's own at batch["pairs"]
        terms = loss.rerank_loss(torch.cat(embeddings)[batch["pairs"].to(device)], **loss_args)  # (n, 1 + K) in
    else:
        num_query_chunks, targets = len(batch["query"]), batch["targets"].to(device)
        q, c = torch.cat(embeddings[:num_query_chunks]), torch.cat(embeddings[num_query_chunks:])  # (n, D), (n * (1 + K), D)
        terms = loss.pace_loss(q, c, targets, **loss_args)
    terms.loss.backward()  # plain: into the parameters; GradCache: d loss / d embedding into each embeddings[i].grad
    for i, (chunk, cached, (cpu_rng, cuda_rng)) in enumerate(zip(chunks, embeddings, rng_states)):  # GradCache's 3)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng)
        if sharded(embedder):
            embedder.set_requires_gradient_sync(i == len(chunks) - 1)
        embed(embedder, chunk, autocast).backward(cached.grad)
    return terms


def clip_gradients(trainable, grad_clip):
    """Clip the global gradient norm to grad_clip (0: no clipping); -> the norm before clipping (the same on every
    rank: for FSDP2's DTensor gradients the norm is reduced over the ranks)."""
    norm = torch.nn.utils.clip_grad_norm_(trainable, grad_clip if grad_clip > 0 else float("inf"))
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


def parameters_finite(trainable):
    """True when every trainable parameter is finite on every rank: a checkpoint is only written then."""
    local = all(bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()) for p in trainable)
    device = trainable[0].device if trainable else torch.device("cpu")
    flag = torch.tensor(float(local), device=device)
    if loss.rank_and_world()[1] > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)
