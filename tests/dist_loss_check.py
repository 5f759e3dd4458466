"""
Two-rank check of loss.pace_loss, launched by tests/test_loss.py:

    python -m torch.distributed.run --nproc_per_node=2 -m tests.dist_loss_check OUT_DIR     # from the repository root

Every rank builds the same fixed global batch and the same tiny encoder (an nn.Linear shared
by queries and candidates, so there is a real parameter gradient), encodes its half, runs
pace_loss (candidates gathered across ranks), backward, and averages the parameter gradients
over ranks as FSDP/DDP do. Each rank writes OUT_DIR/rank{r}.pt; the test recomputes the whole
batch in one process and compares losses, stats and gradients.
"""

import os
import sys

import torch
import torch.distributed as dist

import loss
from loss import pace_loss, statistics

QUERIES_PER_RANK = 3
HARD_NEGATIVES = 2  # per query
INPUT_DIM, EMBED_DIM = 8, 16
# (similarity, temperature, focal_gamma, weighting, soft_labels): Stage I and Stage II settings, with and without
# focal, two of Figure 6(b)'s weightings (random draws differ by rank by design, so it is left out here), and
# UniME-V2's judge soft labels (loss.py's eqs. U1-U4) beside the focal loss ('judge', the hybrid) and alone with the
# 1e-8 floor ('unime_v2', the released loss, at its tau 0.02)
CASES = [("cos", 0.1, 0.0, "focal", "none"), ("cos", 0.1, 2.0, "focal", "none"), ("dot", 100.0, 0.0, "focal", "none"),
         ("dot", 100.0, 2.0, "focal", "none"), ("cos", 0.1, 2.0, "query_positive", "none"),
         ("dot", 100.0, 2.0, "query_negative", "none"), ("cos", 0.1, 2.0, "focal", "judge"),
         ("dot", 100.0, 0.0, "focal", "judge"), ("cos", 0.02, 0.0, "focal", "unime_v2")]
CASES = [case + ((),) for case in CASES] + [("cos", 0.1, 2.0, "focal", "none", (4, 8)),  # and Matryoshka's prefixes
                                            ("dot", 100.0, 2.0, "focal", "none", (8,))]
JUDGE_TEMPERATURE, ALIGNMENT_WEIGHT = 0.05, 0.7


def own_candidates():
    """(Q, 1 + HARD_NEGATIVES) local indices of each local query's own candidates: query i's positive is local
    candidate i, its hard negatives Q + i * HARD_NEGATIVES + k (the layout of make_global_batch)."""
    negatives = QUERIES_PER_RANK + torch.arange(QUERIES_PER_RANK)[:, None] * HARD_NEGATIVES \
        + torch.arange(HARD_NEGATIVES)  # (Q, K)
    return torch.cat([torch.arange(QUERIES_PER_RANK)[:, None], negatives], dim=1)


def judge_scores(world, seed=1):
    """(world, Q, 1 + HARD_NEGATIVES) scores in [0, 1], the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(world, QUERIES_PER_RANK, 1 + HARD_NEGATIVES, generator=g)


def judge_args(soft_labels, scores):
    """pace_loss's keyword arguments of a case's soft labels; scores: this rank's (Q, 1 + K) or None."""
    if soft_labels == "none":
        return {}
    if soft_labels == "unime_v2":
        return {"judge_scores": scores, "judge_temperature": 0.02, "infonce_weight": 0.0, "alignment_floor": 1e-8}
    return {"judge_scores": scores, "judge_temperature": JUDGE_TEMPERATURE, "alignment_weight": ALIGNMENT_WEIGHT}


def make_global_batch(world, seed=0):
    """Encoder state and inputs of the whole batch, the same on every rank.
    query_inputs: (world, Q, INPUT_DIM); candidate_inputs: (world, M, INPUT_DIM) with, per rank,
    its Q positives first, then its Q*HARD_NEGATIVES hard negatives."""
    g = torch.Generator().manual_seed(seed)
    # weights scaled so embedding norms are about 30: dot logits at tau=100 are then O(10)
    encoder_state = {"weight": 2.5 * torch.randn(EMBED_DIM, INPUT_DIM, generator=g),
                     "bias": torch.randn(EMBED_DIM, generator=g)}
    query_inputs = torch.randn(world, QUERIES_PER_RANK, INPUT_DIM, generator=g)
    positive_inputs = query_inputs + 0.7 * torch.randn(query_inputs.shape, generator=g)
    negative_inputs = torch.randn(world, QUERIES_PER_RANK * HARD_NEGATIVES, INPUT_DIM, generator=g)
    candidate_inputs = torch.cat([positive_inputs, negative_inputs], dim=1)
    return encoder_state, query_inputs, candidate_inputs


def main(out_dir):
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    encoder_state, query_inputs, candidate_inputs = make_global_batch(world)
    encoder = torch.nn.Linear(INPUT_DIM, EMBED_DIM)
    encoder.load_state_dict(encoder_state)
    targets = torch.arange(QUERIES_PER_RANK)  # local: query i's positive is local candidate i

    scores = judge_scores(world)
    results = {"world": world, "encoder_state": encoder_state, "query_inputs": query_inputs,
               "candidate_inputs": candidate_inputs, "judge_scores": scores, "cases": {}}
    for similarity, temperature, focal_gamma, weighting, soft_labels, dims in CASES:
        encoder.zero_grad()
        q = encoder(query_inputs[rank])  # (Q, D)
        c = encoder(candidate_inputs[rank])  # (M, D)
        extra = judge_args(soft_labels, scores[rank])
        if extra:
            extra["own_candidates"] = own_candidates()
        terms = pace_loss(q, c, targets, similarity=similarity, temperature=temperature, focal_gamma=focal_gamma,
                          focal_temperature=0.1, weighting=weighting, matryoshka_dims=dims, **extra)
        terms.loss.backward()
        stats = statistics(terms)
        grads = {}
        for name, p in encoder.named_parameters():  # emulate FSDP/DDP: average over ranks
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            grads[name] = p.grad / world
        results["cases"][(similarity, temperature, focal_gamma, weighting, soft_labels, dims)] = {
            "loss": terms.loss.item(), "stats": stats, "grads": grads}

    # the hot path: a gather of a shape already checked gathers no shapes, and a step's loss costs one all-reduce
    # (the normaliser of eqs. (6)-(7)), its statistics one more, on log steps only
    calls = {"all_reduce": 0, "all_gather": 0}
    originals = {name: getattr(dist, name) for name in calls}

    def counted(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)
        return call

    for name in calls:
        setattr(dist, name, counted(name))
    try:
        terms = pace_loss(encoder(query_inputs[rank]), encoder(candidate_inputs[rank]), targets)
        results["hot_path"] = dict(calls)
        statistics(terms)
        results["with_statistics"] = dict(calls)
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
    results["checked_shapes"] = sorted(loss.CHECKED_SHAPES)

    # ranks with different candidate counts, at their first gather: every rank must raise, none may hang
    loss.CHECKED_SHAPES.clear()
    c = encoder(candidate_inputs[rank])[: candidate_inputs.shape[1] - rank]
    try:
        pace_loss(encoder(query_inputs[rank]), c, targets)
        results["mismatch_error"] = None
    except ValueError as error:
        results["mismatch_error"] = str(error)

    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
