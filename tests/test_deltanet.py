"""
deltanet.py's Gated DeltaNet rule against transformers' torch_chunk_gated_delta_rule (float32, output and the
gradients of q, k, v, g, beta and the initial state) and against the rule token by token in float64; Qwen3.5's
layers run it once an Embedder is built; the path it takes on each stack.

    python -m pytest -q tests/test_deltanet.py
"""
import pytest
import torch
import torch.nn.functional as F

import deltanet

CASES = [  # (sequences, tokens, key heads, value heads, d_k, d_v, l2norm, initial state)
    (2, 150, 2, 4, 16, 8, True, False),  # a partial last chunk (150 = 2 * 64 + 22), grouped heads, Qwen3.5's l2norm
    (2, 150, 2, 4, 16, 8, True, True),  # the same from a given state
    (1, 64, 3, 3, 8, 16, False, True),  # one whole chunk, keys not normalised in the kernel
    (3, 5, 1, 2, 8, 8, False, False),  # shorter than a chunk
]


def inputs(sequences, tokens, key_heads, heads, d_k, d_v, l2norm, with_state, dtype, seed=0):
    """Seeded leaves (q, k, v, g, beta, initial state or None), as the layer makes them. Without the kernel's l2norm
    the keys are short (|k| about 1, as the layer's are after it): the rule is stable for beta |k|^2 < 2."""
    generator = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=dtype)  # noqa: E731
    scale = 1.0 if l2norm else d_k ** -0.5
    q, k = randn(sequences, tokens, key_heads, d_k), randn(sequences, tokens, key_heads, d_k) * scale
    v, g = randn(sequences, tokens, heads, d_v), F.logsigmoid(randn(sequences, tokens, heads) + 2)
    beta, state = randn(sequences, tokens, heads).sigmoid(), randn(sequences, heads, d_k, d_v) * 0.5
    return [x.requires_grad_() for x in (q, k, v, g, beta)] + [state.requires_grad_() if with_state else None]


def results(function, leaves, l2norm):
    """[output, final state, gradients of q, k, v, g, beta (and the initial state)] for a fixed random cotangent."""
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in leaves]
    q, k, v, g, beta, state = leaves
    output, final = function(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                             use_qk_l2norm_in_kernel=l2norm)
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(output.shape, generator=generator, dtype=output.dtype)
    ((output * weights).sum() + (final * final).sum()).backward()
    return [output, final] + [x.grad for x in leaves if x is not None]


def token_by_token(query, key, value, g, beta, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False):
    """The rule as written, one token at a time, in the inputs' dtype (transformers' recurrent form without its
    float32 casts): S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T q / sqrt(d_k)."""
    heads, d_v = value.shape[2:]
    query, key = (x.repeat_interleave(heads // x.shape[2], dim=2) for x in (query, key))
    if use_qk_l2norm_in_kernel:
        query, key = deltanet.l2norm(query), deltanet.l2norm(key)
    query = query * query.shape[-1] ** -0.5
    state = initial_state if initial_state is not None else value.new_zeros(value.shape[0], heads, key.shape[-1], d_v)
    outputs = []
    for t in range(value.shape[1]):
        state = state * g[:, t].exp()[..., None, None]  # (B, H, d_k, d_v)
        write = beta[:, t, :, None] * (value[:, t] - torch.einsum("bhkv,bhk->bhv", state, key[:, t]))  # (B, H, d_v)
        state = state + key[:, t, :, :, None] * write[:, :, None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, query[:, t]))
    return torch.stack(outputs, dim=1), state if output_final_state else None


def relative(x, reference):
    return ((x.double() - reference.double()).norm() / reference.double().norm()).item()


@pytest.mark.parametrize("case", CASES)
def test_float32_matches_transformers_forward_and_backward(case):
    leaves = inputs(*case, dtype=torch.float32)
    ours = results(deltanet.chunk_gated_delta_rule, leaves, case[6])
    theirs = results(deltanet.transformers_rule(), leaves, case[6])
    assert len(ours) == len(theirs) == 7 + case[7]
    errors = [relative(x, ref) for x, ref in zip(ours, theirs)]
    assert max(errors) < 1e-5, errors
    assert ours[0].dtype == torch.float32 and ours[0].shape == theirs[0].shape


@pytest.mark.parametrize("case", CASES)
def test_float64_matches_the_rule_token_by_token(case):
    leaves = inputs(*case, dtype=torch.float64)
    ours = results(deltanet.chunk_gated_delta_rule, leaves, case[6])
    exact = results(token_by_token, leaves, case[6])
    errors = [relative(x, ref) for x, ref in zip(ours, exact)]
    assert max(errors) < 1e-12, errors
    assert ours[0].dtype == torch.float64  # kept: transformers' functions would compute it in float32


def test_the_recurrences_written_backward_is_its_gradient():
    # Recurrence.backward by hand against autograd's finite differences, in float64, every input (the state too)
    generator = torch.Generator().manual_seed(3)
    u, w, k_end = (torch.randn(2, 3, 4, d, generator=generator, dtype=torch.float64) for d in (5, 6, 6))
    a = torch.rand(2, 3, generator=generator, dtype=torch.float64)
    state = torch.randn(2, 6, 5, generator=generator, dtype=torch.float64)
    leaves = [x.requires_grad_() for x in (u, w * 0.3, k_end * 0.3, a, state)]
    assert torch.autograd.gradcheck(deltanet.Recurrence.apply, leaves)


def test_a_wrong_rule_is_caught():
    # the comparison can fail: a rule that forgets the chunk's state decay differs by far more than the tolerance
    leaves = inputs(*CASES[1], dtype=torch.float64)
    exact = results(token_by_token, leaves, True)
    undecayed = lambda q, k, v, g, **kw: deltanet.chunk_gated_delta_rule(q, k, v, g=g * 0.5, **kw)  # noqa: E731
    assert relative(results(undecayed, leaves, True)[0], exact[0]) > 1e-2


def test_qwen35_layers_run_it(tiny_embedder, preprocessor, monkeypatch):
    calls = []
    rule = deltanet.chunk_gated_delta_rule
    monkeypatch.setattr(deltanet, "chunk_gated_delta_rule", lambda *a, **kw: calls.append(1) or rule(*a, **kw))
    batch = preprocessor.collate([preprocessor("a red circle"), preprocessor("two blue squares, one small")])
    with torch.no_grad():
        ours = tiny_embedder(**batch)
    layers = tiny_embedder.model.config.text_config.layer_types
    assert len(calls) == layers.count("linear_attention") > 0
    monkeypatch.setenv("PACE_DELTANET", "transformers")  # transformers' own code, for the same vectors
    deltanet.paths.cache_clear()
    try:
        with torch.no_grad():
            theirs = tiny_embedder(**batch)
    finally:
        deltanet.paths.cache_clear()
    assert len(calls) == layers.count("linear_attention")  # not called this time
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("capability, triton, tilelang, faulty", [
    ((9, 0), (3, 6, 0), False, True),  # Hopper, torch 2.11's triton: fla #640
    ((9, 0), (3, 4, 0), False, True),
    ((9, 0), (3, 6, 0), True, False),  # fla sends the guarded kernel to TileLang
    ((9, 0), (3, 7, 1), False, False),  # torch >= 2.12.1's triton
    ((9, 0), (3, 3, 1), False, False),  # before the miscompilation
    ((8, 0), (3, 6, 0), False, False),  # Ampere: not affected
    ((10, 0), (3, 6, 0), False, False),  # Blackwell: not affected
])
def test_fla_backward_is_refused_exactly_where_it_is_wrong(capability, triton, tilelang, faulty):
    fault = deltanet.fla_backward_fault(capability, triton, tilelang)
    assert (fault is not None) == faulty
    if faulty:
        assert "3.7.1" in fault and ".".join(map(str, triton)) in fault


def test_versions_parse_as_their_numbers():
    assert deltanet.version_tuple("3.7.1") == (3, 7, 1) > deltanet.version_tuple("3.6.0+git9f3e2b1") == (3, 6, 0)


def test_the_path_per_call_follows_paths(monkeypatch):
    used = []
    fake_fla = lambda q, k, v, g, beta, initial_state=None, **kw: (used.append("fla") or v.clone(), None)  # noqa: E731
    monkeypatch.setattr(deltanet, "fla_rule", lambda: (fake_fla, frozenset({"initial_state"})))
    monkeypatch.setattr(deltanet, "paths", lambda device: deltanet.Paths("fla", "pytorch", "a test"))
    q, k, v, g, beta, _ = inputs(1, 8, 1, 1, 4, 4, True, False, dtype=torch.float32)
    with torch.no_grad():  # evaluation, GradCache's first pass: fla's forward
        deltanet.run_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, position_ids=None)
    out, _ = deltanet.run_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)  # a training call: ours
    assert used == ["fla"] and out.grad_fn is not None
    with torch.no_grad():
        frozen = [x.detach() for x in (q, k, v, g, beta)]
    deltanet.run_rule(*frozen[:3], g=frozen[3], beta=frozen[4])  # grad mode on, nothing needs a gradient: fla
    assert used == ["fla", "fla"]


def test_paths_on_a_cpu_and_the_override(monkeypatch):
    deltanet.paths.cache_clear()
    cpu = deltanet.paths(torch.device("cpu"))
    assert (cpu.forward, cpu.backward) == ("pytorch", "pytorch") and "deltanet.py" in cpu.line
    monkeypatch.setenv("PACE_DELTANET", "fast")
    deltanet.paths.cache_clear()
    with pytest.raises(ValueError, match="PACE_DELTANET must be one of auto, pytorch, fla, fla_forward, transformers, "
                                         "got 'fast'"):
        deltanet.paths(torch.device("cpu"))
    monkeypatch.setenv("PACE_DELTANET", "fla_forward")
    deltanet.paths.cache_clear()
    monkeypatch.setattr(deltanet, "fla_rule", lambda: (None, frozenset()))  # as if fla imported
    chosen = deltanet.paths(torch.device("cpu"))
    assert (chosen.forward, chosen.backward, chosen.why) == ("fla", "pytorch", "PACE_DELTANET")
    monkeypatch.setenv("PACE_DELTANET", "fla")
    deltanet.paths.cache_clear()
    monkeypatch.setattr(deltanet, "fla_rule", lambda: None)
    with pytest.raises(ValueError, match="requirements-gpu.txt"):
        deltanet.paths(torch.device("cpu"))
    deltanet.paths.cache_clear()


def test_the_gated_norm_is_transformers_own_off_a_gpu_and_flas_fused_kernel_on_one(tiny_embedder, monkeypatch):
    from transformers.models.qwen3_5 import modeling_qwen3_5
    norm_class = modeling_qwen3_5.Qwen3_5RMSNormGated
    assert norm_class.forward is deltanet.run_gated_norm  # bound when the tiny Embedder was built
    norm = norm_class(8, eps=1e-6)
    x, gate = torch.randn(5, 8), torch.randn(5, 8)
    torch.testing.assert_close(norm(x, gate), norm_class._transformers_forward(norm, x, gate), rtol=0, atol=0)
    calls = []
    monkeypatch.setattr(deltanet, "fla_gated_norm", lambda: lambda *args, **kw: calls.append((args, kw)) or args[0])
    assert not deltanet.fused_norm_on(torch.device("cpu"))  # fla's kernels are Triton: never on a CPU
    assert deltanet.fused_norm_on(torch.device("cuda"))  # a torch.device, no GPU needed
    monkeypatch.setenv("PACE_FUSED_NORM", "0")
    assert not deltanet.fused_norm_on(torch.device("cuda"))
    monkeypatch.setattr(deltanet, "fused_norm_on", lambda device: True)
    norm(x, gate)
    (args, kw), = calls  # fla's rms_norm_gated(x, g, weight, bias, activation=..., eps=...)
    assert args[0] is x and args[1] is gate and args[2] is norm.weight and args[3] is None
    assert kw == {"activation": "swish", "eps": 1e-6}
