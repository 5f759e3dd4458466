"""
The PACE objective: similarities, the Focal Embedding Loss, and the cross-rank gather.

Implements equations (1)-(7) of the paper (see shared/PACE.md):
    s_cos(q, c) = q.c / (|q| |c|)                                    eq. (1), Stage I
    s_dot(q, c) = q.c                                                eq. (2), Stage II
    pi_i = softmax_j(s(q_i, c_j) / tau) at the positive,  l_i = -log pi_i       eq. (3)
    p_i  = softmax_j(s_cos(q_i, c_j) / tau_w) at the positive (always cosine)  eq. (4)
    a_i  = stopgrad[(1 - p_i)^gamma]                                 eq. (5)
    L    = sum_i a_i l_i / sum_i a_i, sums over the global batch     eqs. (6), (7)
With gamma = 0 every a_i = 1 and L is plain InfoNCE.

Usage (train.py), on every rank:
    loss, stats = pace_loss(q, c, targets, similarity="cos", temperature=0.1)
    loss.backward()
q holds this rank's queries, c this rank's candidates (its queries' positives and hard
negatives) and targets[i] the index of query i's positive in the local c. Every query is
ranked against the candidates of all ranks, gathered with an autograd-aware all-gather.
Without torch.distributed (or with one process) nothing is gathered.

forward_backward(encode, batch, loss_fn, grad_cache) is the training step's embed + loss + backward,
plain or with GradCache (paper, Appendix C.1); train.py and bench.py both call it.
"""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional
import torch.nn.functional as F

NORMALIZE_EPS = 1e-6  # floor on |x| in eq. (1), so a zero vector gives cos = 0, not NaN


def similarity_matrix(q, c, similarity):
    """(N, D) x (M, D) -> (N, M) float32 similarities: 'cos' (eq. 1) or 'dot' (eq. 2)."""
    if similarity not in ("cos", "dot"):
        raise ValueError(f"similarity must be 'cos' or 'dot', got {similarity!r}")
    # float32 even inside a bf16 autocast region: logits at tau = 0.1 or on raw dot
    # products of norm-30 vectors lose too much in bf16
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, c = q.float(), c.float()
        if similarity == "cos":
            q = F.normalize(q, dim=-1, eps=NORMALIZE_EPS)
            c = F.normalize(c, dim=-1, eps=NORMALIZE_EPS)
        return q @ c.T  # (N, M)


def world_rank_and_size():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_candidates(c):
    """(M, D) local candidates -> (world*M, D) candidates of all ranks, in rank order.
    Autograd-aware: the backward sums every rank's gradient for c back into its owner."""
    rank, world = world_rank_and_size()
    if world == 1:
        return c
    # every rank must contribute the same (M, D): a small all_gather of the shapes first,
    # so a mismatch is a clear error on all ranks instead of a hang or garbage
    shape = torch.tensor(c.shape, dtype=torch.long, device=c.device)  # (2,)
    shapes = [torch.empty_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape)
    shapes = [tuple(s.tolist()) for s in shapes]
    if len(set(shapes)) != 1:
        raise ValueError(f"gather_candidates: every rank needs the same candidate shape (M, D), got {shapes} by rank")
    return torch.cat(dist_functional.all_gather(c), dim=0)  # (world*M, D)


def check_inputs(q, c, targets):
    if q.dim() != 2 or q.shape[0] == 0:
        raise ValueError(f"q must be (N, D) with N >= 1, got shape {tuple(q.shape)}")
    if c.dim() != 2:
        raise ValueError(f"c must be (M, D), got shape {tuple(c.shape)}")
    if q.shape[1] != c.shape[1]:
        raise ValueError(f"q and c must share the embedding size D, got q {tuple(q.shape)} and c {tuple(c.shape)}")
    if targets.shape != (q.shape[0],) or targets.dtype != torch.long:
        raise ValueError(f"targets must be a ({q.shape[0]},) long tensor, got {tuple(targets.shape)} {targets.dtype}")
    if targets.numel() and (targets.min() < 0 or targets.max() >= c.shape[0]):
        raise ValueError(f"targets must index the local candidates, 0 <= t < {c.shape[0]}, "
                         f"got range [{targets.min().item()}, {targets.max().item()}]")


def pace_loss(q, c, targets, similarity="cos", temperature=0.1, focal_gamma=2.0, focal_temperature=0.1):
    """Focal Embedding Loss, eqs. (3)-(7). q: (N, D) local queries, c: (M, D) local candidates,
    targets: (N,) positive index in the local c. Returns (loss to backward, dict of floats)."""
    check_inputs(q, c, targets)
    rank, world = world_rank_and_size()
    n_local, m_local = q.shape[0], c.shape[0]
    all_c = gather_candidates(c)  # (world*M, D)
    targets = targets + rank * m_local  # (N,) index into all_c
    logits = similarity_matrix(q, all_c, similarity) / temperature  # (N, world*M) float32
    nll = -logits.log_softmax(dim=-1).gather(1, targets[:, None]).squeeze(1)  # (N,) l_i, eq. (3)

    with torch.no_grad():
        cos = similarity_matrix(q, all_c, "cos")  # (N, world*M), eq. (1)
        # eq. (4): the confidence is always cosine at its own temperature, even in Stage II
        focal_confidence = (cos / focal_temperature).softmax(dim=-1).gather(1, targets[:, None]).squeeze(1)  # (N,)
        weights = (1.0 - focal_confidence).pow(focal_gamma)  # (N,) a_i, eq. (5); 0^0 = 1 so gamma=0 gives ones
        positive = F.one_hot(targets, all_c.shape[0]).bool()  # (N, world*M)
        # one packed all-reduce for every sum: [sum a*l, sum a, sum pi, sum p, sum |q|, N,
        # sum |c| (local c only, so each candidate counts once), M, sum pos cos, sum neg cos, #neg]
        sums = torch.stack([
            (weights * nll).sum(), weights.sum(), torch.exp(-nll).sum(), focal_confidence.sum(),
            q.float().norm(dim=-1).sum(), torch.tensor(float(n_local), device=q.device),
            c.float().norm(dim=-1).sum(), torch.tensor(float(m_local), device=q.device),
            cos[positive].sum(), cos[~positive].sum(), (~positive).sum().float(),
        ]).double()
        extremes = torch.stack([-weights.min(), weights.max()]).double()  # max of -min is -min
        if world > 1:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        global_weight_sum = sums[1].float()  # eq. (6): normalise by the weights of the whole batch

    # eq. (7). Why world * (local numerator) / (global denominator) gives the right gradient:
    # the full-batch loss is L = sum_r L_r with L_r = sum_{i on rank r} a_i l_i / sum_global a.
    # Let every rank backpropagate its L_r. q_r enters only L_r, so rank r gets dL/dq_r. Rank
    # r's candidates enter every L_r', and the all-gather backward sums each rank's gradient
    # for them back to rank r, so rank r gets dL/dc_r. Rank r's parameter gradient is then its
    # share of dL/dtheta, and the shares sum to dL/dtheta. FSDP/DDP average over ranks (divide
    # by world), which the factor world undoes. With one process this is exactly L.
    loss = world * (weights * nll).sum() / global_weight_sum

    sums = sums.tolist()
    n_global, m_global = sums[5], sums[7]
    stats = {
        "loss": sums[0] / sums[1],
        "pos_prob": sums[2] / n_global,  # mean pi_i, eq. (3)
        "focal_confidence": sums[3] / n_global,  # mean p_i, eq. (4)
        "weight_min": -extremes[0].item(),  # a_i, eq. (5)
        "weight_max": extremes[1].item(),
        "query_norm": sums[4] / n_global,
        "candidate_norm": sums[6] / m_global,
        "pos_cos": sums[8] / n_global,
        "neg_cos": sums[9] / max(sums[10], 1.0),
    }
    return loss, stats


def forward_backward(encode, batch, loss_fn, grad_cache=False, gradient_sync=None):
    """Embeddings, eq. (7) loss and its gradient. -> stats. encode(chunk) -> (B, D) embeddings;
    loss_fn(q, c, targets) -> (loss, stats); batch["query"] / batch["candidate"] are lists of collated
    chunks. gradient_sync(flag), when given (FSDP2's set_requires_gradient_sync), lets GradCache reduce
    gradients once, on the last chunk.

    GradCache: 1) embed every chunk without a graph; 2) loss and d loss / d embedding on the detached
    embeddings; 3) re-embed each chunk with a graph and backpropagate its cached gradient. Same gradients
    as the plain step, at the memory of one chunk. Dropout replays the same RNG state."""
    if not grad_cache:
        q = torch.cat([encode(chunk) for chunk in batch["query"]])  # (n, D)
        c = torch.cat([encode(chunk) for chunk in batch["candidate"]])  # (n * (1 + K), D)
        loss, stats = loss_fn(q, c, batch["targets"])
        loss.backward()
        return stats
    chunks = batch["query"] + batch["candidate"]
    rng_states, reps = [], []
    with torch.no_grad():
        for chunk in chunks:
            rng_states.append((torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None))
            reps.append(encode(chunk))
    reps = [r.detach().requires_grad_(True) for r in reps]
    num_query_chunks = len(batch["query"])
    loss, stats = loss_fn(torch.cat(reps[:num_query_chunks]), torch.cat(reps[num_query_chunks:]), batch["targets"])
    loss.backward()
    for i, (chunk, rep, (cpu_rng, cuda_rng)) in enumerate(zip(chunks, reps, rng_states)):
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng)
        if gradient_sync is not None:
            gradient_sync(i == len(chunks) - 1)
        encode(chunk).backward(rep.grad)
    return stats
