"""
loss.py: the PACE objective. Embeddings in, a loss out; statistics on request.

    terms = pace_loss(q, c, targets, similarity="cos", temperature=0.1, focal_gamma=2.0)
    terms.loss.backward()
    stats = statistics(terms)        # on log steps: every figure of the log line, one all-reduce

q (N, D) holds this rank's queries, c (M, D) its candidates (its queries' positives, then their hard negatives),
targets[i] the index of query i's positive in c. Every query is ranked against the candidates of all ranks, gathered
with an autograd-aware all-gather.

The equations (paper, Section 3.3):
    s_cos(q, c) = q.c / (|q| |c|)                                        eq. (1), Stage I
    s_dot(q, c) = q.c                                                    eq. (2), Stage II
    pi_i = softmax_j(s(q_i, c_j) / tau) at the positive,  l_i = -log pi_i            eq. (3)
    p_i  = softmax_j(s_cos(q_i, c_j) / tau_w) at the positive: cosine in both stages  eq. (4)
    a_i  = stopgrad[(1 - p_i)^gamma]                                     eq. (5)
    L    = sum_i a_i l_i / sum_i a_i, both sums over the global batch     eqs. (6), (7)
With gamma = 0 every a_i = 1 and L is plain InfoNCE (the VLM2Vec baseline). Matryoshka dimensions (matryoshka_dims,
MRL): l_i is the mean of eq. (3) over the whole vector and each leading prefix q[:d], c[:d], each at its own s (the
prefix normalised for cos, its own norm for dot) and the same tau, while p_i stays the whole vector's cosine.
Figure 6(b)'s other query weightings
have no formulas in the paper; these are this codebase's, detached and normalised as eq. (5)'s (weighting=...):
    "focal"           a_i = (1 - p_i)^gamma                                   eq. (5), the default
    "random"          a_i ~ Uniform(0, 1), drawn afresh each step: weighting that knows nothing
    "query_positive"  a_i = ((1 - s_cos(q_i, c_i+)) / 2)^gamma: a positive far from its query is hard
    "query_negative"  a_i = ((1 + max_{j != +} s_cos(q_i, c_j)) / 2)^gamma: a close hardest negative is hard

UniME-V2's judge soft labels (Gu et al., AAAI 2026; tools/mine.py writes them): a judge scored query i's positive
and K hard negatives (k = 0..K) j_ik = e_yes / (e_yes + e_no); the model's distribution over them is pulled to it:
    P_i  = softmax_k(j_ik / tau_j)                                       (U1) the judge's soft labels
    Q_i  = softmax_k(s(q_i, c_ik) / tau)                                 (U2) the model's, eq. (1) or (2), eq. (3)'s tau
    A_i  = 1/2 [KL(P_i || Q_i) + KL(Q_i || P_i)]                         (U3) symmetric
    L    = mu * (focal-weighted InfoNCE of eqs. (6)-(7)) + lambda * (1/N) sum_i A_i, N the global batch's queries  (U4)
P_i is data; Q_i carries the gradient. UniME-V2's released loss (config/unime_v2.py) is (U3) alone (mu = 0) at
tau_j = tau = 0.02 on cosine, each log of the other's reference floored, eps = 1e-8 (alignment_floor), which at that
tau sets the value more than the distributions do; config/unime_v2_hybrid.py is InfoNCE beside the exact (U3):
    A_i  = 1/2 [sum_k P_ik (log P_ik - log(Q_ik + eps)) + sum_k Q_ik (log Q_ik - log(P_ik + eps))]   (U3')

The reranker (rerank.py) scores each of query i's own positive and K hard negatives, s_ik (k = 0: the positive) =
log P(yes) - log P(no) of one prompt holding both sides (R1), and learns them by a softmax cross-entropy over them
(Qwen3-VL-Reranker's listwise form; no candidate of another query enters, so nothing is gathered):
    L_R  = (1/N) sum_i -log softmax_k(s_ik / tau_r)[0]                     (R2)
"""
import warnings
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional
import torch.nn.functional as F

# torch 2.13 marks its autograd-aware all_gather deprecated in favour of a private module; it works, and says so
# at every step otherwise
warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_gather is deprecated")

NORMALIZE_EPS = 1e-6  # floor on |x| in eq. (1), so a zero vector gives cos = 0, not NaN
SIMILARITIES = ("cos", "dot")  # eq. (1), eq. (2)
WEIGHTINGS = ("focal", "random", "query_positive", "query_negative")
COLLAPSE_SPREAD = 1e-4  # a batch whose every query sees logits within this of each other carries no signal


class LossTerms(NamedTuple):
    """What pace_loss computed. loss carries the gradient; the rest is detached, for statistics()."""
    loss: torch.Tensor  # () world * this rank's share of L: each rank backpropagates its own; their mean is L
    logits: torch.Tensor  # (N, world * M) s / tau, eq. (3)
    cos: torch.Tensor  # (N, world * M) s_cos, eq. (1); a reranker's (N, 1 + K) scores, eq. (R1)
    targets: torch.Tensor  # (N,) each query's positive among all ranks' candidates
    nll: torch.Tensor  # (N,) l_i, eq. (3) (with MRL its mean over the dimensions)
    confidence: torch.Tensor  # (N,) p_i, eq. (4)
    weights: torch.Tensor  # (N,) a_i before normalisation, eq. (5)
    query_norms: Optional[torch.Tensor]  # (N,); None for a reranker's scores
    candidate_norms: Optional[torch.Tensor]  # (M,) this rank's candidates only, so each counts once
    alignment: Optional[torch.Tensor]  # (N,) A_i of eq. (U3), or None without judge scores
    alignment_weight: float  # lambda of eq. (U4)
    infonce_weight: float  # mu of eq. (U4): 1 without judge scores


def comparison_vectors(x, similarity):
    """x (..., D) as `similarity` compares it, in float32: unit vectors for 'cos' (eq. 1), as they are for 'dot'
    (eq. 2). Their plain dot products are then the similarities: similarity_matrix here, eval.py's scores of each
    query's own candidates."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    x = x.float()
    return F.normalize(x, dim=-1, eps=NORMALIZE_EPS) if similarity == "cos" else x


def similarity_matrix(q, c, similarity):
    """(N, D) x (M, D) -> (N, M) float32 similarities: 'cos' (eq. 1) or 'dot' (eq. 2)."""
    # float32 even inside a bf16 autocast region: logits at tau = 0.1, or raw dot products of
    # norm-30 vectors, lose too much in bf16
    with torch.autocast(device_type=q.device.type, enabled=False):
        return comparison_vectors(q, similarity) @ comparison_vectors(c, similarity).T  # (N, M)


def rank_and_world():
    """(rank, world size) of this process in the process group: (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


CHECKED_SHAPES = set()  # the (M, D) every rank was found to share: checked at the first gather of each shape


def gather_candidates(c):
    """(M, D) local candidates -> (world * M, D) candidates of all ranks, in rank order. Autograd-aware:
    the backward sums every rank's gradient for c back into its owner. Every rank must give the same (M, D):
    the first gather of a shape checks that all do (a clear error instead of a hang), later ones trust it."""
    rank, world = rank_and_world()
    if world == 1:
        return c
    if tuple(c.shape) not in CHECKED_SHAPES:
        shape = torch.tensor(c.shape, dtype=torch.long, device=c.device)  # (2,)
        shapes = [torch.empty_like(shape) for _ in range(world)]
        dist.all_gather(shapes, shape)
        shapes = [tuple(s.tolist()) for s in shapes]
        if len(set(shapes)) != 1:
            raise ValueError(f"gather_candidates: every rank needs the same candidate shape (M, D), got {shapes} by rank")
        CHECKED_SHAPES.add(tuple(c.shape))
    return torch.cat(dist_functional.all_gather(c), dim=0)  # (world * M, D)


def check_inputs(q, c, targets, weighting, judge_scores, own_candidates):
    """Shapes and choices only: nothing here reads a value back from the device."""
    if q.dim() != 2 or q.shape[0] == 0:
        raise ValueError(f"q must be (N, D) with N >= 1, got shape {tuple(q.shape)}")
    if c.dim() != 2 or q.shape[1] != c.shape[1]:
        raise ValueError(f"q and c must be (N, D) and (M, D) with one D, got q {tuple(q.shape)} and c {tuple(c.shape)}")
    if targets.shape != (q.shape[0],) or targets.dtype != torch.long:
        raise ValueError(f"targets must be a ({q.shape[0]},) long tensor, got {tuple(targets.shape)} {targets.dtype}")
    if targets.device.type == "cpu" and (targets.min() < 0 or targets.max() >= c.shape[0]):  # free on the CPU only
        raise ValueError(f"targets must index the local candidates, 0 <= t < {c.shape[0]}, "
                         f"got range [{targets.min().item()}, {targets.max().item()}]")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if (judge_scores is None) != (own_candidates is None):
        raise ValueError("judge_scores and own_candidates go together, each (N, 1 + K)")
    if judge_scores is not None:
        n = q.shape[0]
        if own_candidates.dim() != 2 or own_candidates.shape[0] != n or own_candidates.dtype != torch.long:
            raise ValueError(f"own_candidates must be an ({n}, 1 + K) long tensor, got {tuple(own_candidates.shape)} "
                             f"{own_candidates.dtype}")
        if judge_scores.shape != own_candidates.shape or not judge_scores.is_floating_point():
            raise ValueError(f"judge_scores must be a float tensor shaped like own_candidates "
                             f"{tuple(own_candidates.shape)}, got {tuple(judge_scores.shape)} {judge_scores.dtype}")
        if own_candidates.device.type == "cpu":  # free on the CPU only, as targets' range above
            if not torch.isfinite(judge_scores).all():
                raise ValueError("judge_scores must be finite")
            if own_candidates.min() < 0 or own_candidates.max() >= c.shape[0]:
                raise ValueError(f"own_candidates must index the local candidates, 0 <= index < {c.shape[0]}")
            if not torch.equal(own_candidates[:, 0], targets):
                raise ValueError("own_candidates[:, 0] must be each query's positive, its target")


def query_weights(weighting, gamma, confidence, cos, positive):
    """(N,) a_i of each query, before normalisation (the formulas are in the file docstring). confidence: (N,)
    p_i of eq. (4); cos: (N, world * M) cosines; positive: (N, world * M) bool, True at each query's positive."""
    if weighting == "focal":
        return (1.0 - confidence).pow(gamma)  # eq. (5); 0^0 = 1, so gamma = 0 gives ones
    if weighting == "random":
        return torch.rand(confidence.shape, device=confidence.device)
    if weighting == "query_positive":
        return ((1.0 - cos[positive]) / 2).pow(gamma)  # cos[positive]: (N,), one positive a row
    hardest_negative = cos.masked_fill(positive, -1.0).amax(dim=1)  # (N,)
    return ((1.0 + hardest_negative) / 2).pow(gamma)


def alignment_terms(logits, *, own_candidates, judge_scores, judge_temperature, floor=0.0):
    """(N,) A_i of eq. (U3), or with floor > 0 of UniME-V2's (U3'). logits: (N, world * M) s / tau of eq. (3);
    own_candidates: (N, 1 + K) indices into its columns, the positive first; judge_scores: (N, 1 + K) the judge's
    scores of those candidates."""
    log_q = logits.gather(1, own_candidates).log_softmax(dim=-1)  # (N, 1 + K) log Q_i, eq. (U2)
    log_p = (judge_scores.float() / judge_temperature).log_softmax(dim=-1)  # (N, 1 + K) log P_i, eq. (U1): constant
    q, p = log_q.exp(), log_p.exp()
    reference_q, reference_p = ((q + floor).log(), (p + floor).log()) if floor else (log_q, log_p)  # (U3') or (U3)
    return 0.5 * ((p * (log_p - reference_q)).sum(-1) + (q * (log_q - reference_p)).sum(-1))  # (N,)


def pace_loss(q, c, targets, similarity="cos", temperature=0.1, focal_gamma=2.0, focal_temperature=0.1,
              weighting="focal", judge_scores=None, own_candidates=None, judge_temperature=0.02, alignment_weight=1.0,
              infonce_weight=1.0, alignment_floor=0.0, matryoshka_dims=()):
    """Focal Embedding Loss, eqs. (3)-(7). q: (N, D) local queries, c: (M, D) local candidates, targets: (N,)
    positive index in the local c. With judge_scores (N, 1 + K), the judge's scores of each query's own positive
    and K hard negatives, and own_candidates (N, 1 + K), their indices in the local c (positive first), UniME-V2's
    alignment joins it, eqs. (U1)-(U4), at judge_temperature tau_j, weights infonce_weight mu and alignment_weight
    lambda, and alignment_floor eps (U3'). matryoshka_dims: the prefix dimensions l_i averages over. -> LossTerms"""
    check_inputs(q, c, targets, weighting, judge_scores, own_candidates)
    rank, world = rank_and_world()
    all_c = gather_candidates(c)  # (world * M, D)
    targets = targets + rank * c.shape[0]  # (N,) index into all_c
    positive = F.one_hot(targets, all_c.shape[0]).bool()  # (N, world * M)
    logits = similarity_matrix(q, all_c, similarity) / temperature  # (N, world * M) float32
    nll = -logits.log_softmax(dim=-1)[positive]  # (N,) l_i = -log pi_i, eq. (3)
    prefixes = [d for d in matryoshka_dims if d < q.shape[1]]  # MRL: eq. (3) at each prefix too, then their mean
    for d in prefixes:
        nll = nll + -(similarity_matrix(q[:, :d], all_c[:, :d], similarity) / temperature).log_softmax(dim=-1)[positive]
    nll = nll / (1 + len(prefixes))  # (N,)
    with torch.no_grad():
        cos = similarity_matrix(q, all_c, "cos")  # (N, world * M), eq. (1)
        confidence = (cos / focal_temperature).softmax(dim=-1)[positive]  # (N,) p_i, eq. (4): always cosine
        weights = query_weights(weighting, focal_gamma, confidence, cos, positive)  # (N,) a_i, eq. (5)
        # eqs. (6)-(7)'s normaliser and the global N of (U4): one all-reduce of two numbers
        totals = torch.stack([weights.sum().double(), torch.full((), float(len(q)), dtype=torch.float64, device=q.device)])
        if world > 1:
            dist.all_reduce(totals)
        weight_sum, queries = totals.clamp_min(1e-30).float()  # a batch whose every a_i is 0 gives 0, not 0/0
    # Why world * (local numerator) / (global denominator) gives the right gradient: the full-batch loss is
    # L = sum_r L_r with L_r = sum_{i on rank r} a_i l_i / sum_global a. Every rank backpropagates its L_r.
    # q_r enters only L_r, so rank r gets dL/dq_r. Rank r's candidates enter every L_r', and the all-gather's
    # backward sums each rank's gradient for them back to rank r, so rank r gets dL/dc_r. Rank r's parameter
    # gradient is then its share of dL/dtheta, and the shares sum to dL/dtheta. FSDP averages gradients over
    # ranks (divides by world), which the factor world undoes. In one process this is exactly L.
    alignment = None
    if judge_scores is None:
        loss, infonce_weight = world * (weights * nll).sum() / weight_sum, 1.0
    else:  # eq. (U4): each rank adds world * (its A_i) / N, by the same argument with 1 / N in place of a_i / sum a
        alignment = alignment_terms(logits, own_candidates=own_candidates + rank * c.shape[0], judge_scores=judge_scores,
                                    judge_temperature=judge_temperature, floor=alignment_floor)  # (N,), eq. (U3)
        loss = world * (infonce_weight * (weights * nll).sum() / weight_sum + alignment_weight * alignment.sum() / queries)
    return LossTerms(loss, logits.detach(), cos, targets, nll.detach(), confidence, weights,
                     q.detach().float().norm(dim=-1), c.detach().float().norm(dim=-1),
                     None if alignment is None else alignment.detach(), alignment_weight, infonce_weight)


def rerank_loss(scores, temperature=1.0):
    """The reranker's loss, eq. (R2). scores: (N, 1 + K) this rank's queries' scores of their own positive (column 0)
    and K hard negatives. Each rank's share is its mean over its N queries: every rank holds as many, and FSDP2's
    average of the ranks' gradients is then the gradient of the global mean. -> LossTerms (no cosines, no norms)"""
    logits = scores.float() / temperature  # (N, 1 + K)
    nll = -logits.log_softmax(dim=-1)[:, 0]  # (N,) -log of the positive's share
    with torch.no_grad():
        confidence = logits.softmax(dim=-1)[:, 0]  # (N,)
        targets = torch.zeros(len(scores), dtype=torch.long, device=scores.device)
    return LossTerms(nll.mean(), logits.detach(), scores.detach().float(), targets, nll.detach(), confidence,
                     torch.ones_like(nll), None, None, None, 1.0, 1.0)


def logit_spread(terms):
    """() the widest range of one local query's logits over its candidates: about 0 when the embeddings collapsed
    (all to zero, or all to one vector), where every logit of a query is the same, the loss is ln(candidates) and
    the gradient 0, so training cannot recover by itself."""
    return (terms.logits.amax(dim=1) - terms.logits.amin(dim=1)).max()


def collapse_flag(terms):
    """() 1.0 when the embeddings collapsed (logit_spread under COLLAPSE_SPREAD), else 0.0: a float tensor on the
    loss's device, so train.py sums it over the ranks in its one all-reduce of the step."""
    return (logit_spread(terms) < COLLAPSE_SPREAD).float()


def statistics(terms):
    """What the log line and log.jsonl report, over the global batch, with one all-reduce: the loss L (and with a
    judge its two terms), the means of pi (eq. 3), p (eq. 4) and the norms, positive and negative cosines, the
    range of a_i and logit_spread. -> {name: float}, the same on every rank."""
    rank, world = rank_and_world()
    positive = F.one_hot(terms.targets, terms.logits.shape[1]).bool()  # (N, world * M)
    one = torch.ones((), device=terms.logits.device)
    norms = terms.query_norms is not None  # a reranker's terms have scores, no vectors
    compared = "cos" if norms else "score"  # what terms.cos holds: cosines (eq. 1), or a reranker's scores (R1)
    sums = {"weighted_nll": (terms.weights * terms.nll).sum(), "weight_sum": terms.weights.sum(),
            "pos_prob": torch.exp(-terms.nll).sum(), "focal_confidence": terms.confidence.sum(),
            "query_norm": terms.query_norms.sum() if norms else 0 * one, "queries": one * len(terms.nll),
            "candidate_norm": terms.candidate_norms.sum() if norms else 0 * one,
            "candidates": one * len(terms.candidate_norms) if norms else one,
            "pos_cos": terms.cos[positive].sum(), "neg_cos": terms.cos[~positive].sum(), "negatives": (~positive).sum(),
            "alignment": terms.alignment.sum() if terms.alignment is not None else 0 * one}
    maxima = {"weight_max": terms.weights.max(), "minus_weight_min": -terms.weights.min(),
              "logit_spread": logit_spread(terms)}
    # one all-reduce: each rank fills its own row, so the sum hands every rank every rank's row
    rows = torch.zeros(world, len(sums) + len(maxima), dtype=torch.float64, device=terms.logits.device)
    rows[rank] = torch.stack([v.double() for v in list(sums.values()) + list(maxima.values())])
    if world > 1:
        dist.all_reduce(rows)
    totals = dict(zip(sums, rows[:, :len(sums)].sum(0).tolist()))
    totals.update(zip(maxima, rows[:, len(sums):].amax(0).tolist()))
    stats = {"loss": totals["weighted_nll"] / max(totals["weight_sum"], 1e-30),
             "pos_prob": totals["pos_prob"] / totals["queries"],  # mean pi_i, eq. (3)
             "focal_confidence": totals["focal_confidence"] / totals["queries"],  # mean p_i, eq. (4)
             "weight_min": -totals["minus_weight_min"], "weight_max": totals["weight_max"],  # a_i, eq. (5)
             f"pos_{compared}": totals["pos_cos"] / totals["queries"],
             f"neg_{compared}": totals["neg_cos"] / max(totals["negatives"], 1.0), "logit_spread": totals["logit_spread"]}
    if norms:
        stats.update(query_norm=totals["query_norm"] / totals["queries"],
                     candidate_norm=totals["candidate_norm"] / totals["candidates"])
    if terms.alignment is not None:  # eq. (U4): L is mu times InfoNCE plus lambda times the mean A_i
        stats["infonce"], stats["alignment"] = stats["loss"], totals["alignment"] / totals["queries"]
        stats["loss"] = terms.infonce_weight * stats["infonce"] + terms.alignment_weight * stats["alignment"]
    return stats
