"""
bench/fla_check.py: does flash-linear-attention's chunk_gated_delta_rule agree with transformers' PyTorch
reference, forward and backward, at Qwen3.5's real head shape? bench/gpu.sh runs it before trusting fla.

    PYTHONPATH=/tmp/pace_wheels python3 bench/fla_check.py      # exit status 0: it agrees; else it does not

The inputs are a Gated DeltaNet layer's under bf16 autocast (transformers' Qwen3_5GatedDeltaNet.forward): q, k,
v bf16 with 16 heads of 128 (both released sizes), g float32 log decays below 0, beta bf16 in (0, 1), and
use_qk_l2norm_in_kernel=True, for 2 sequences of 300 tokens (not a multiple of the 64-token chunk). The reference
is transformers' own torch_chunk_gated_delta_rule: its decorator (use_kernel_func_from_hub_with_fallback) binds
fla's kernel in its place when fla is importable, and keeps the PyTorch function as __wrapped__
(functools.wraps), which inspect.unwrap reaches. Measure: the relative error ||x - ref|| / ||ref|| of the output
and of the gradients of q, k, v, g and beta. bf16 keeps about 3 significant digits, so fla's bf16 kernels differ
from the float32 reference by well under 1 %; a wrong kernel (a layout or a sign) differs by about 100 %.
"""
import inspect
import sys

import torch
import torch.nn.functional as F

TOLERANCE = 0.02  # the largest relative error allowed (bf16 through a few hundred steps of recurrence)
HEADS, HEAD_DIM = 16, 128  # Qwen3.5-0.8B and 2B: 16 key and 16 value heads of 128 in every Gated DeltaNet layer
NAMES = ("output", "grad q", "grad k", "grad v", "grad g", "grad beta")


def reference(name="torch_chunk_gated_delta_rule"):
    """transformers' PyTorch implementation `name`, whichever kernel its decorator bound in its place."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    function = inspect.unwrap(getattr(modeling_qwen3_5, name))
    if function.__code__.co_filename != modeling_qwen3_5.__file__:
        raise RuntimeError(f"{name} did not unwrap to transformers' PyTorch code: {function.__code__.co_filename}")
    return function


def inputs(device, tokens, seed=0):
    """(q, k, v, g, beta) and the output gradient, seeded, as the layer makes them."""
    generator = torch.Generator(device).manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=generator, device=device)  # noqa: E731
    q, k, v = (randn(2, tokens, HEADS, HEAD_DIM).bfloat16() for _ in range(3))
    g = F.logsigmoid(randn(2, tokens, HEADS))  # float32, < 0: the state decays by exp(g) a token
    beta = randn(2, tokens, HEADS).sigmoid().bfloat16()
    return (q, k, v, g, beta), randn(2, tokens, HEADS, HEAD_DIM).bfloat16()


def forward_backward(function, tensors, grad_output):
    """function's output on fresh leaves of `tensors`, then the leaves' gradients. -> [output, 5 gradients]"""
    q, k, v, g, beta = leaves = [x.detach().clone().requires_grad_() for x in tensors]
    output, _ = function(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    output.backward(grad_output)
    return [output] + [x.grad for x in leaves]


def check(candidate, device, tokens=300):
    """{output or gradient: relative error of candidate against transformers' chunked reference}; inf where
    candidate gives a non-finite value."""
    tensors, grad_output = inputs(device, tokens)
    expected = forward_backward(reference(), tensors, grad_output)
    got = forward_backward(candidate, tensors, grad_output)
    error = lambda x, ref: ((x.double() - ref.double()).norm() / ref.double().norm()).item()  # noqa: E731
    return {name: error(x, ref) if torch.isfinite(x).all() else float("inf")
            for name, x, ref in zip(NAMES, got, expected)}


def main():
    if not torch.cuda.is_available():
        print("fla check: no CUDA device, nothing to check")
        return 1
    import fla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    errors = check(chunk_gated_delta_rule, "cuda")
    agrees = max(errors.values()) <= TOLERANCE
    print(f"fla {fla.__version__} chunk_gated_delta_rule against transformers' reference ({HEADS} heads of {HEAD_DIM}, "
          f"bf16, 2 x 300 tokens), relative error: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
          + f" -> {'agrees' if agrees else 'DISAGREES'} (tolerance {TOLERANCE})")
    return 0 if agrees else 1


if __name__ == "__main__":
    sys.exit(main())
