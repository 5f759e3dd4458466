"""
Tests of loss.py: pace_loss against a slow loop over eqs. (1)-(7), InfoNCE at gamma = 0, the
stop-gradient on the focal weight (eq. 5), no radial gradient under cosine (eq. 8), UniME-V2's judge
alignment (eqs. U1-U4) against a float64 loop, and two gloo ranks against one process
(tests/dist_loss_check.py).

    python -m pytest -q tests/test_loss.py
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

from loss import COLLAPSE_SPREAD, collapse_flag, logit_spread, pace_loss, similarity_matrix, statistics
from tests import dist_loss_check
from tests.toyrun import torchrun

FOCAL_TEMPERATURE = 0.1


def loss_and_stats(*args, **kwargs):
    """pace_loss's loss to backpropagate, and statistics() of the same terms."""
    terms = pace_loss(*args, **kwargs)
    return terms.loss, statistics(terms)


def reference_loss(q, c, targets, similarity, temperature, focal_gamma, focal_temperature, dims=()):
    """Eqs. (1)-(7) written out one query and one candidate at a time; with Matryoshka's dims, l_i the mean of eq. (3)
    over the whole vectors and their prefixes of dims. Returns (L, a)."""
    def cosine(u, v):
        return torch.dot(u, v) / (u.norm() * v.norm())  # eq. (1)

    def score(u, v):
        return cosine(u, v) if similarity == "cos" else torch.dot(u, v)  # eq. (1) or (2)

    nlls, weights = [], []
    for i in range(q.shape[0]):
        t, terms = int(targets[i]), []
        for d in list(dims) + [q.shape[1]]:  # a prefix q[:d], c[:d] is a vector of its own
            exps = [torch.exp(score(q[i, :d], c[j, :d]) / temperature) for j in range(c.shape[0])]
            terms.append(-torch.log(exps[t] / sum(exps)))  # l_i = -log pi_i, eq. (3)
        nlls.append(sum(terms) / len(terms))
        with torch.no_grad():
            cos_exps = [torch.exp(cosine(q[i], c[j]) / focal_temperature) for j in range(c.shape[0])]
            p = cos_exps[t] / sum(cos_exps)  # eq. (4)
            weights.append((1 - p) ** focal_gamma)  # eq. (5)
    total = sum(a * l for a, l in zip(weights, nlls))
    return total / sum(weights), torch.stack(weights)  # eqs. (6), (7)


def random_batch(similarity, temperature, seed=0, n=5, hard_negatives=3, dim=12):
    """q: (n, dim), c: (n*(1+hard_negatives), dim) float64 leaves; positives first.
    Norms vary by row and are scaled so logits s/tau are O(10) (norm^2 ~ 10 tau for dot)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, dim, generator=g, dtype=torch.float64)
    c = torch.cat([q + 2.0 * torch.randn(n, dim, generator=g, dtype=torch.float64),
                   torch.randn(n * hard_negatives, dim, generator=g, dtype=torch.float64)])
    target_norm = 1.0 if similarity == "cos" else (10 * temperature) ** 0.5
    for x in (q, c):
        norms = target_norm * (0.5 + torch.rand(x.shape[0], 1, generator=g, dtype=torch.float64))  # (rows, 1)
        x *= norms / x.norm(dim=-1, keepdim=True)
    targets = torch.arange(n)
    return q.requires_grad_(), c.requires_grad_(), targets


SETTINGS = [(s, tau, gamma) for s, tau in [("cos", 0.1), ("dot", 0.1), ("dot", 100.0)] for gamma in (0.0, 2.0)]


@pytest.mark.parametrize("similarity,temperature,focal_gamma", SETTINGS)
def test_matches_loop_reference(similarity, temperature, focal_gamma):
    q, c, targets = random_batch(similarity, temperature)
    loss, stats = loss_and_stats(q, c, targets, similarity, temperature, focal_gamma, FOCAL_TEMPERATURE)
    grad_q, grad_c = torch.autograd.grad(loss, (q, c))
    expected, weights = reference_loss(q, c, targets, similarity, temperature, focal_gamma, FOCAL_TEMPERATURE)
    expected_grad_q, expected_grad_c = torch.autograd.grad(expected, (q, c))
    assert 0.5 < expected.item() < 10  # logits in a sensible range, so the comparison means something
    assert torch.allclose(loss.double(), expected, rtol=1e-5, atol=1e-6)
    scale = expected_grad_q.abs().max().item()  # pace_loss computes in float32
    assert torch.allclose(grad_q, expected_grad_q, rtol=1e-4, atol=1e-5 * scale)
    assert torch.allclose(grad_c, expected_grad_c, rtol=1e-4, atol=1e-5 * scale)
    assert stats["loss"] == pytest.approx(loss.item(), rel=1e-6)
    # a_i = (1 - p_i)^gamma cancels when p_i is near 1: absolute tolerance, float32 scale
    assert stats["weight_min"] == pytest.approx(weights.min().item(), abs=1e-6)
    assert stats["weight_max"] == pytest.approx(weights.max().item(), abs=1e-6)
    if focal_gamma > 0:  # the focal weights really vary, or the weighted tests prove little
        assert weights.max() / weights.min() > 2


@pytest.mark.parametrize("similarity,temperature", [("cos", 0.1), ("dot", 0.1)])
def test_matryoshka_prefixes_match_the_loop_reference(similarity, temperature):
    # the loss at each prefix beside the whole vector, averaged; the focal weight stays the whole vector's cosine
    q, c, targets = random_batch(similarity, temperature)
    loss, stats = loss_and_stats(q, c, targets, similarity, temperature, 2.0, FOCAL_TEMPERATURE, matryoshka_dims=(3, 6))
    expected, weights = reference_loss(q, c, targets, similarity, temperature, 2.0, FOCAL_TEMPERATURE, dims=(3, 6))
    assert torch.allclose(loss.double(), expected, rtol=1e-5, atol=1e-6) and stats["loss"] == pytest.approx(loss.item(), rel=1e-6)
    grad_q, expected_grad_q = torch.autograd.grad(loss, q)[0], torch.autograd.grad(expected, q)[0]
    assert torch.allclose(grad_q, expected_grad_q, rtol=1e-4, atol=1e-5 * expected_grad_q.abs().max().item())
    assert stats["weight_max"] == pytest.approx(weights.max().item(), abs=1e-6)  # eq. (5): the whole vector's
    whole, _ = reference_loss(q, c, targets, similarity, temperature, 2.0, FOCAL_TEMPERATURE)
    assert abs(whole.item() - expected.item()) > 1e-3  # the prefixes change the loss


@pytest.mark.parametrize("similarity,temperature", [("cos", 0.1), ("dot", 100.0)])
def test_gamma_zero_is_infonce(similarity, temperature):
    q, c, targets = random_batch(similarity, temperature, seed=1)
    loss, stats = loss_and_stats(q, c, targets, similarity, temperature, focal_gamma=0.0)
    logits = similarity_matrix(q, c, similarity) / temperature
    assert torch.allclose(loss, F.cross_entropy(logits, targets), rtol=1e-6, atol=1e-7)
    assert stats["weight_min"] == stats["weight_max"] == 1.0


@pytest.mark.parametrize("similarity,temperature", [("cos", 0.1), ("dot", 100.0)])
def test_focal_weight_carries_no_gradient(similarity, temperature):
    q, c, targets = random_batch(similarity, temperature, seed=2)
    loss, _ = loss_and_stats(q, c, targets, similarity, temperature, 2.0, FOCAL_TEMPERATURE)
    grad_q, grad_c = torch.autograd.grad(loss, (q, c))

    def weighted_loss(detach):  # eq. (7) with a_i of eq. (5) as constants, or differentiated
        nll = F.cross_entropy(similarity_matrix(q, c, similarity) / temperature, targets, reduction="none")
        cos_logits = similarity_matrix(q, c, "cos") / FOCAL_TEMPERATURE
        p = cos_logits.softmax(-1).gather(1, targets[:, None]).squeeze(1)
        a = (1 - p) ** 2.0
        a = a.detach() if detach else a
        return (a * nll).sum() / a.sum()

    constant_grad_q, constant_grad_c = torch.autograd.grad(weighted_loss(detach=True), (q, c))
    assert torch.allclose(grad_q, constant_grad_q, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad_c, constant_grad_c, rtol=1e-5, atol=1e-6)
    # the check can tell: differentiating through a_i gives a clearly different gradient
    through_grad_q, _ = torch.autograd.grad(weighted_loss(detach=False), (q, c))
    assert not torch.allclose(grad_q, through_grad_q, rtol=1e-2, atol=1e-3)


def radial_fraction(x, grad):
    """(rows,) |x . grad| / (|x| |grad|): the radial share of each row's gradient."""
    return (x * grad).sum(-1).abs() / (x.norm(dim=-1) * grad.norm(dim=-1))


def test_cosine_has_no_radial_gradient():
    # eq. (8): the cosine objective only moves directions; the dot objective also moves norms
    q, c, targets = random_batch("cos", 0.1, seed=3)
    loss, _ = loss_and_stats(q, c, targets, "cos", 0.1, 2.0)
    grad_q, grad_c = torch.autograd.grad(loss, (q, c))
    assert radial_fraction(q, grad_q).max() < 1e-5
    assert radial_fraction(c, grad_c).max() < 1e-5
    q, c, targets = random_batch("dot", 100.0, seed=3)
    loss, _ = loss_and_stats(q, c, targets, "dot", 100.0, 2.0)
    grad_q, grad_c = torch.autograd.grad(loss, (q, c))
    assert radial_fraction(q, grad_q).mean() > 0.05
    assert radial_fraction(c, grad_c).mean() > 0.05


def test_stats():
    q, c, targets = random_batch("dot", 100.0, seed=4)
    loss, stats = loss_and_stats(q, c, targets, "dot", 100.0, 2.0)
    nll = F.cross_entropy(similarity_matrix(q, c, "dot") / 100.0, targets, reduction="none")
    cos = similarity_matrix(q, c, "cos")
    p = (cos / FOCAL_TEMPERATURE).softmax(-1).gather(1, targets[:, None]).squeeze(1)
    positive = F.one_hot(targets, c.shape[0]).bool()
    expected = {"loss": loss.item(), "pos_prob": torch.exp(-nll).mean().item(), "focal_confidence": p.mean().item(),
                "query_norm": q.norm(dim=-1).mean().item(), "candidate_norm": c.norm(dim=-1).mean().item(),
                "pos_cos": cos[positive].mean().item(), "neg_cos": cos[~positive].mean().item()}
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert all(isinstance(v, float) for v in stats.values())


def test_bfloat16_inputs_give_float32_logits():
    q, c, targets = random_batch("dot", 100.0, seed=5)
    assert similarity_matrix(q.bfloat16(), c.bfloat16(), "dot").dtype == torch.float32
    loss, _ = loss_and_stats(q.detach().bfloat16().requires_grad_(), c.detach().bfloat16(), targets, "dot", 100.0)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_bad_arguments_raise():
    q, c, targets = random_batch("cos", 0.1, seed=6)
    with pytest.raises(ValueError, match="similarity"):
        pace_loss(q, c, targets, similarity="l2")
    with pytest.raises(ValueError, match="q must be"):
        pace_loss(q[0], c, targets)
    with pytest.raises(ValueError, match=r"one D.*\(5, 12\).*\(20, 11\)"):
        pace_loss(q, c[:, :-1], targets)
    with pytest.raises(ValueError, match="targets must be"):
        pace_loss(q, c, targets[:-1])
    with pytest.raises(ValueError, match="targets must index"):
        pace_loss(q, c, targets + c.shape[0])


def reference_weights(weighting, q, c, targets, gamma):
    """Figure 6(b)'s weightings written out in float64 one query at a time (formulas: loss.py's docstring)."""
    weights = []
    for i in range(q.shape[0]):
        cos = [F.cosine_similarity(q[i], c[j], dim=0) for j in range(c.shape[0])]
        t = int(targets[i])
        if weighting == "query_positive":
            weights.append(((1 - cos[t]) / 2) ** gamma)
        else:
            weights.append(((1 + max(cos[j] for j in range(c.shape[0]) if j != t)) / 2) ** gamma)
    return torch.stack(weights).detach()


@pytest.mark.parametrize("weighting", ["query_positive", "query_negative", "random"])
@pytest.mark.parametrize("similarity,temperature", [("cos", 0.1), ("dot", 100.0)])
def test_figure_6b_weightings_are_detached_and_normalised_like_the_focal_weight(weighting, similarity, temperature):
    q, c, targets = random_batch(similarity, temperature, seed=7)
    torch.manual_seed(3)
    loss, stats = loss_and_stats(q, c, targets, similarity, temperature, 2.0, FOCAL_TEMPERATURE, weighting)
    if weighting == "random":
        torch.manual_seed(3)
        weights = torch.rand(q.shape[0], dtype=torch.float32).double()  # the same draws: U(0, 1) a query
    else:
        weights = reference_weights(weighting, q, c, targets, 2.0)
    nll = F.cross_entropy(similarity_matrix(q, c, similarity).double() / temperature, targets, reduction="none")
    expected = (weights * nll).sum() / weights.sum()  # eqs. (6)-(7) with these a_i, constants
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for got, want in zip(torch.autograd.grad(loss, (q, c)), torch.autograd.grad(expected, (q, c))):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-6)  # no gradient through a_i
    assert stats["weight_min"] == pytest.approx(weights.min().item(), abs=1e-6)
    assert stats["weight_max"] == pytest.approx(weights.max().item(), abs=1e-6)
    assert weights.max() / weights.min() > 1.2  # the weights differ between queries, or the test proves little
    focal, _ = loss_and_stats(q, c, targets, similarity, temperature, 2.0, FOCAL_TEMPERATURE)
    assert focal.item() != pytest.approx(loss.item(), rel=1e-4)  # and they are not the focal weights


def test_collapsed_embeddings_are_told_apart_from_healthy_ones():
    q, c, targets = random_batch("dot", 100.0, seed=8)
    direction = torch.randn(q.shape[1], dtype=torch.float64)
    cases = {"healthy": (q, c, False), "all zero": (q * 0, c * 0, True),
             "all one vector": (direction.expand_as(q), direction.expand_as(c), True),
             "one direction, norms differ": (direction * torch.rand(len(q), 1, dtype=torch.float64) + 0 * q,
                                             direction * torch.rand(len(c), 1, dtype=torch.float64) + 0 * c, None)}
    for name, (queries, candidates, expected) in cases.items():
        for similarity, temperature in [("cos", 0.1), ("dot", 0.1)]:
            terms = pace_loss(queries, candidates, targets, similarity, temperature)
            spread = logit_spread(terms).item()
            # one direction with varying norms carries no signal for cosine, but does for the dot product
            want = (similarity == "cos") if expected is None else expected
            assert (spread < COLLAPSE_SPREAD) == want == bool(collapse_flag(terms)), (name, similarity, spread)
            assert statistics(terms)["logit_spread"] == pytest.approx(spread)  # the log's figure is the same


def own_candidates_of(n, hard_negatives):
    """(n, 1 + K) indices of each query's own candidates in random_batch's c: its positive i, then its K negatives
    n + i * K + k."""
    return torch.cat([torch.arange(n)[:, None], n + torch.arange(n)[:, None] * hard_negatives
                      + torch.arange(hard_negatives)], dim=1)


HAND_JUDGE = torch.tensor([[0.97, 0.10, 0.55, 0.30], [0.80, 0.85, 0.05, 0.20], [0.60, 0.02, 0.03, 0.90],
                           [0.99, 0.50, 0.49, 0.51], [0.40, 0.00, 1.00, 0.25]], dtype=torch.float64)  # (5, 1 + 3)


def reference_alignment(q, c, own, judge, similarity, temperature, judge_temperature):
    """Eqs. (U1)-(U3) of loss.py written out one query and one candidate at a time, float64. -> (N,) A_i"""
    def score(u, v):
        return torch.dot(u, v) / (u.norm() * v.norm()) if similarity == "cos" else torch.dot(u, v)

    terms = []
    for i in range(q.shape[0]):
        logits = torch.stack([score(q[i], c[int(j)]) for j in own[i]]) / temperature
        model = torch.exp(logits) / torch.exp(logits).sum()  # Q_i, eq. (U2)
        labels = torch.exp(judge[i] / judge_temperature) / torch.exp(judge[i] / judge_temperature).sum()  # P_i, (U1)
        kl_pq = sum(labels[k] * torch.log(labels[k] / model[k]) for k in range(len(labels)))
        kl_qp = sum(model[k] * torch.log(model[k] / labels[k]) for k in range(len(labels)))
        terms.append(0.5 * (kl_pq + kl_qp))  # eq. (U3)
    return torch.stack(terms)


@pytest.mark.parametrize("similarity,temperature,focal_gamma", [("cos", 0.1, 2.0), ("dot", 100.0, 0.0)])
def test_judge_alignment_matches_loop_reference(similarity, temperature, focal_gamma):
    q, c, targets = random_batch(similarity, temperature, seed=9)
    own = own_candidates_of(5, 3)
    loss, stats = loss_and_stats(q, c, targets, similarity, temperature, focal_gamma, FOCAL_TEMPERATURE,
                            judge_scores=HAND_JUDGE, own_candidates=own, judge_temperature=0.05,
                            alignment_weight=0.7)
    focal, _ = reference_loss(q, c, targets, similarity, temperature, focal_gamma, FOCAL_TEMPERATURE)
    alignment = reference_alignment(q, c, own, HAND_JUDGE, similarity, temperature, 0.05)
    expected = focal + 0.7 * alignment.mean()  # eq. (U4)
    assert alignment.min() > 0.05  # the term is really there, for every query
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    got, want = torch.autograd.grad(loss, (q, c)), torch.autograd.grad(expected, (q, c), retain_graph=True)
    without = torch.autograd.grad(focal, (q, c))
    for g, w, plain in zip(got, want, without):
        scale = w.abs().max().item()
        assert torch.allclose(g.double(), w, rtol=1e-4, atol=1e-5 * scale)
        assert not torch.allclose(w, plain, rtol=1e-2, atol=1e-3 * scale)  # and it moves the gradient
    assert stats["alignment"] == pytest.approx(alignment.mean().item(), rel=1e-5)
    assert stats["infonce"] == pytest.approx(focal.item(), rel=1e-5)
    assert stats["loss"] == pytest.approx(loss.item(), rel=1e-6)


def test_judge_alignment_is_zero_when_the_judge_agrees_and_off_by_default():
    q, c, targets = random_batch("cos", 0.1, seed=10)
    own = own_candidates_of(5, 3)
    plain, plain_stats = loss_and_stats(q, c, targets, "cos", 0.1, 2.0)
    plain_grads = torch.autograd.grad(plain, (q, c))
    # lambda = 0: the plain focal loss and gradient, bit for bit
    zero, _ = loss_and_stats(q, c, targets, "cos", 0.1, 2.0, judge_scores=HAND_JUDGE,
                        own_candidates=own, alignment_weight=0.0)
    assert zero.item() == plain.item()
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(zero, (q, c)), plain_grads))
    assert "alignment" not in plain_stats
    # a judge whose scores / tau_j are the model's logits (up to a shift) leaves nothing to align
    agreeing = (similarity_matrix(q, c, "cos").gather(1, own) / 0.1 * 0.05 + 0.3).detach()
    loss, stats = loss_and_stats(q, c, targets, "cos", 0.1, 2.0, judge_scores=agreeing,
                            own_candidates=own, judge_temperature=0.05)
    assert stats["alignment"] == pytest.approx(0.0, abs=1e-6)
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)


def test_judge_arguments_are_checked():
    q, c, targets = random_batch("cos", 0.1, seed=11)
    own = own_candidates_of(5, 3)
    for wrong in ({"judge_scores": HAND_JUDGE}, {"own_candidates": own}):  # one without the other
        with pytest.raises(ValueError, match="judge_scores.*own_candidates"):
            pace_loss(q, c, targets, **wrong)
    with pytest.raises(ValueError, match="own_candidates\\[:, 0\\]"):  # the positive must come first
        pace_loss(q, c, targets, judge_scores=HAND_JUDGE, own_candidates=own.flip(1))
    with pytest.raises(ValueError, match=r"judge_scores.*\(5, 4\).*\(5, 3\)"):  # the shapes it has and needs
        pace_loss(q, c, targets, judge_scores=HAND_JUDGE[:, :3], own_candidates=own)
    with pytest.raises(ValueError, match=rf"own_candidates.*< {c.shape[0]}"):  # an index past the local c
        pace_loss(q, c, targets, judge_scores=HAND_JUDGE, own_candidates=torch.cat([own[:, :1], own[:, 1:] + 100], 1))
    with pytest.raises(ValueError, match="judge_scores must be finite"):
        pace_loss(q, c, targets, judge_scores=HAND_JUDGE.clone().index_fill_(1, torch.tensor([2]), math.nan),
                  own_candidates=own)



def test_two_gloo_ranks_equal_one_process(tmp_path):
    code, output = torchrun(2, "-m", "tests.dist_loss_check", str(tmp_path), timeout=90)
    assert code == 0, output[-6000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    world = ranks[0]["world"]

    # the same batch in one process: no process group here, so nothing is gathered
    encoder = torch.nn.Linear(*ranks[0]["encoder_state"]["weight"].shape[::-1])
    encoder.load_state_dict(ranks[0]["encoder_state"])
    query_inputs, candidate_inputs = ranks[0]["query_inputs"], ranks[0]["candidate_inputs"]
    queries_per_rank, candidates_per_rank = query_inputs.shape[1], candidate_inputs.shape[1]
    targets = torch.cat([torch.arange(queries_per_rank) + r * candidates_per_rank for r in range(world)])
    own = torch.cat([dist_loss_check.own_candidates() + r * candidates_per_rank for r in range(world)])  # global c
    for key, case0 in ranks[0]["cases"].items():
        similarity, temperature, focal_gamma, weighting, soft_labels, dims = key
        cases = [rank["cases"][key] for rank in ranks]
        encoder.zero_grad()
        q = encoder(query_inputs.flatten(0, 1))  # (world*Q, D)
        c = encoder(candidate_inputs.flatten(0, 1))  # (world*M, D)
        extra = dist_loss_check.judge_args(soft_labels, ranks[0]["judge_scores"].flatten(0, 1))
        extra.update({"own_candidates": own} if extra else {})
        loss, stats = loss_and_stats(q, c, targets, similarity, temperature, focal_gamma, FOCAL_TEMPERATURE, weighting,
                                     matryoshka_dims=dims, **extra)
        loss.backward()
        label = f"{similarity} tau={temperature} gamma={focal_gamma} {weighting} soft_labels={soft_labels} dims={dims}"
        if soft_labels != "none":  # the alignment term is really there, and differs by rank
            assert stats["alignment"] > 1e-3 and {"infonce", "alignment"} <= case0["stats"].keys(), label
        # rank r returns world * its share of L, so the ranks' mean is L
        assert sum(case["loss"] for case in cases) / world == pytest.approx(loss.item(), rel=1e-5), label
        for case in cases:
            for key, value in stats.items():  # every stat is global: the same on each rank as here
                assert case["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (label, key)
            for name, param in encoder.named_parameters():
                assert torch.allclose(case["grads"][name], param.grad, rtol=1e-5, atol=1e-5), (label, name)
        if focal_gamma > 0:
            assert stats["weight_max"] / stats["weight_min"] > 1.5, label  # focal weights matter here
    for rank in ranks:
        assert "same candidate shape" in rank["mismatch_error"] and "(9, 16)" in rank["mismatch_error"]
        # a step's loss: one all-reduce (the global sum of a_i and N) and one all-gather, the candidates' own (a shape
        # checked once is not gathered again)
        assert rank["hot_path"] == {"all_reduce": 1, "all_gather": 1}
        assert rank["with_statistics"] == {"all_reduce": 2, "all_gather": 1}  # the statistics: one all-reduce more
        assert (9, 16) in rank["checked_shapes"]


UNIME_V2_EXAMPLE = torch.tensor([0.7216, 0.4408, 0.2332, 0.0172, 0.0846, 0.2551, 0.0172, 0.0943, 0.0153])  # (1 + 8,)


def released_unime_v2(q, c, own, judge, temperature=0.02, eps=1e-8):
    """UniME-V2's released loss restated (its Embedding/src/loss.py): cosine scores of each query's own 1 + K
    candidates, both softmaxes at one temperature, F.kl_div both ways on log(x + eps), batchmean, halved."""
    scores = torch.einsum("nd,nkd->nk", F.normalize(q, dim=-1), F.normalize(c, dim=-1)[own])  # (N, 1 + K)
    labels, model = F.softmax(judge / temperature, dim=-1), F.softmax(scores / temperature, dim=-1)
    kl_pq = F.kl_div(torch.log(model + eps), labels, reduction="batchmean", log_target=False)
    kl_qp = F.kl_div(torch.log(labels + eps), model, reduction="batchmean", log_target=False)
    return 0.5 * (kl_pq + kl_qp)


def test_unime_v2_config_is_the_released_loss_in_its_own_setting():
    # config/unime_v2.py's objective (the alignment alone, tau = tau_j = 0.02 on cosine, the 1e-8 floor) against the
    # released loss, on UniME-V2's example judge scores with 8 hard negatives: value and gradient to 1e-6
    from configurator import configure
    settings = {"temperature": 0.1, "judge_temperature": 0.5, "infonce_weight": 1.0, "alignment_weight": 0.5,
                "alignment_floor": 0.0, "similarity": "cos", "focal_gamma": 2.0, "soft_labels": "none", "out_dir": "",
                "train_data": []}
    config = configure(settings, [os.path.join(os.path.dirname(__file__), "..", "config", "unime_v2.py")])
    n, k = 6, 8
    g = torch.Generator().manual_seed(3)
    q = torch.randn(n, 16, generator=g).requires_grad_()
    c = torch.cat([q.detach() + 0.8 * torch.randn(n, 16, generator=g), torch.randn(n * k, 16, generator=g)]).requires_grad_()
    own = own_candidates_of(n, k)
    judge = torch.stack([UNIME_V2_EXAMPLE[torch.randperm(1 + k, generator=g)] if i else UNIME_V2_EXAMPLE for i in range(n)])
    args = {key: config[key] for key in ("temperature", "judge_temperature", "infonce_weight", "alignment_weight",
                                         "alignment_floor", "similarity", "focal_gamma")}
    assert config["soft_labels"] == "judge" and args["temperature"] == args["judge_temperature"] == 0.02
    loss, stats = loss_and_stats(q, c, torch.arange(n), judge_scores=judge, own_candidates=own, **args)
    released = released_unime_v2(q, c, own, judge)
    assert loss.item() == pytest.approx(released.item(), abs=1e-6) and stats["loss"] == pytest.approx(released.item(), abs=1e-6)
    for got, want in zip(torch.autograd.grad(loss, (q, c)), torch.autograd.grad(released, (q, c))):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # at this temperature the floor sets the value: the exact KL (the hybrid's) is another number
    exact, _ = loss_and_stats(q, c, torch.arange(n), judge_scores=judge, own_candidates=own, **dict(args, alignment_floor=0.0))
    assert abs(exact.item() - released.item()) > 0.05


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_rerank_loss_matches_a_float64_loop_and_reports_scores(temperature):
    """Eq. (R2): the mean over queries of -log softmax_k(s_ik / tau_r) at the positive (k = 0), its gradient, and the
    statistics a reranker's log line reads (mean scores of positives and negatives, no norms)."""
    from loss import rerank_loss
    torch.manual_seed(3)
    scores = (3 * torch.randn(5, 4)).requires_grad_()  # 5 queries, a positive and 3 negatives each
    terms = rerank_loss(scores, temperature)
    terms.loss.backward()
    exact = scores.detach().double().requires_grad_()
    total = 0.0
    for row in exact:  # one query at a time: -log(e^{s_0 / tau} / sum_k e^{s_k / tau})
        total = total - (row[0] / temperature - torch.log(sum(torch.exp(s / temperature) for s in row)))
    (total / len(exact)).backward()
    assert terms.loss.item() == pytest.approx((total / len(exact)).item(), rel=1e-6)
    assert torch.allclose(scores.grad.double(), exact.grad, atol=1e-6)
    stats = statistics(terms)
    assert stats["loss"] == pytest.approx(terms.loss.item(), rel=1e-6)
    assert stats["pos_score"] == pytest.approx(scores[:, 0].mean().item(), rel=1e-5)
    assert stats["neg_score"] == pytest.approx(scores[:, 1:].mean().item(), rel=1e-5)
    assert "query_norm" not in stats and "pos_cos" not in stats
    assert collapse_flag(rerank_loss(torch.ones(5, 4))) == 1.0  # every candidate alike: no signal
