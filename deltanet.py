"""
deltanet.py: the Gated DeltaNet's chunked delta rule in plain PyTorch, and which code runs it in Qwen3.5's
linear-attention layers (Qwen3-VL has none): flash-linear-attention's kernels (fla) where they are right, this page
everywhere else; and the layers' gated RMSNorm, fla's fused kernel on a GPU.

    out, state = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    bind()                          # Qwen3.5's layers now call run_rule(), which picks the code per call, and
                                    # run_gated_norm() (fla's fused gated RMSNorm on a GPU; PACE_FUSED_NORM=0: off)
    print(paths(device).line)       # 'Gated DeltaNet: forward fla 0.6.0, backward PyTorch chunked (...)'
    PACE_DELTANET=pytorch python train.py ...    # force a path: auto (default), pytorch, fla, fla_forward, transformers

The rule (Yang, Kautz & Hatamizadeh, "Gated Delta Networks", 2024), per head, with a state S of d_k x d_v, token t's
query q_t and key k_t (d_k), value v_t (d_v), decay a_t = exp(g_t) in (0, 1] and write strength beta_t in (0, 1):

    S_t = a_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - a_t S_{t-1}^T k_t),   o_t = S_t^T q_t / sqrt(d_k)

u_t is what token t writes: the part of v_t its decayed state does not already predict (the delta rule). Token by
token that is T small steps; the chunked form below does C = 64 tokens at once with matmuls. Inside a chunk that
starts from state S, with gamma_i = g_1 + ... + g_i and G_ij = exp(gamma_i - gamma_j) for j <= i:

    (I + L) U = diag(beta) V - diag(beta e^gamma) K S,   L_ij = beta_i G_ij k_i . k_j  (j < i)      the chunk's writes
    O  = (Q * e^gamma) S + ((Q K^T) * G) U                                                          its outputs
    S' = e^gamma_C S + (K * e^(gamma_C - gamma))^T U                                                its final state

Triangular solves give U = U~ - W S for every chunk at once (U~ = A^-1 diag(beta) V, W = A^-1 diag(beta e^gamma) K,
A = I + L). Only the states S_n each chunk starts from are sequential: with K~ = K * e^(gamma_C - gamma) and
a = e^gamma_C, S_{n+1} = a S_n + K~^T (U~ - W S_n), three ops a chunk in a Python loop (class Recurrence, which
writes its backward out), everything else batched over chunks. transformers' torch_chunk_gated_delta_rule computes
the same with about 9 ops a chunk in its loop, and each x[:, :, i] there writes a whole-tensor zero gradient in
backward.
"""
import dataclasses
import functools
import importlib
import inspect
import os
import re

import torch
import torch.nn.functional as F

PATHS = ("auto", "pytorch", "fla", "fla_forward", "transformers")  # PACE_DELTANET's values (fla_forward: fla's
# forward, this page's backward)


def l2norm(x, eps=1e-6):  # as transformers' and fla's: x / sqrt(|x|^2 + eps) over the head dimension
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, **kwargs):
    """transformers' torch_chunk_gated_delta_rule, same arguments and results: query, key (B, T, H_k, d_k), value
    (B, T, H, d_v), g and beta (B, T, H), initial_state (B, H, d_k, d_v) -> (output (B, T, H, d_v) in query's dtype,
    the final state (B, H, d_k, d_v) or None). Computes in float32, or in float64 when given it."""
    if kwargs.get("cu_seqlens") is not None:
        raise ValueError("chunk_gated_delta_rule: packed sequences (cu_seqlens) need fla's kernels")
    batch, length, key_heads, d_k = key.shape
    heads, d_v = value.shape[-2:]
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    size, pad = chunk_size, -length % chunk_size
    chunks = (length + pad) // size

    def chunked(x, normalise=False):  # (B, T, H', ...) -> (B * H, N, C, ...), zero-padded: a pad token writes nothing
        x = x.to(dtype)
        if x.dim() == 4 and x.shape[2] != heads:  # grouped heads: a key head serves heads // key_heads value heads
            x = x.repeat_interleave(heads // key_heads, dim=2)
        x = l2norm(x) if normalise else x
        x = F.pad(x.transpose(1, 2), (0, 0, 0, pad) if x.dim() == 4 else (0, pad))  # (B, H, T + pad, ...)
        return x.reshape(batch * heads, chunks, size, *x.shape[3:])

    q = chunked(query, use_qk_l2norm_in_kernel) * d_k ** -0.5  # (BH, N, C, d_k)
    k = chunked(key, use_qk_l2norm_in_kernel)  # (BH, N, C, d_k)
    v, b = chunked(value), chunked(beta)  # (BH, N, C, d_v), (BH, N, C)
    gamma = chunked(g).cumsum(dim=-1)  # (BH, N, C): log of the decay from the chunk's start to each token
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()  # j <= i
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # G: (BH, N, C, C)

    # the chunk's writes: A = I + L is unit lower triangular (the solve reads L below the diagonal, ones on it)
    lower = (k @ k.transpose(-1, -2)) * decay * b[..., None]  # (BH, N, C, C)
    solve = functools.partial(torch.linalg.solve_triangular, lower, upper=False, unitriangular=True)
    u, w = solve(v * b[..., None]), solve(k * (b * gamma.exp())[..., None])  # U~ (BH, N, C, d_v), W (BH, N, C, d_k)

    # the state's recurrence, the one sequential part: three ops a chunk each way
    k_end = k * (gamma[..., -1:] - gamma).exp()[..., None]  # K~: each key decayed to the chunk's end, (BH, N, C, d_k)
    state = (torch.zeros(batch * heads, d_k, d_v, dtype=dtype, device=q.device) if initial_state is None
             else initial_state.to(dtype).reshape(batch * heads, d_k, d_v))
    u, entering, state = Recurrence.apply(u, w, k_end, gamma[..., -1].exp(), state)  # U, S_n (BH, N, d_k, d_v), S_N

    # every chunk's output at once: the state it starts from, read by the decayed queries, and its own writes
    out = (q * gamma.exp()[..., None]) @ entering + ((q @ k.transpose(-1, -2)) * decay) @ u  # (BH, N, C, d_v)
    out = out.reshape(batch, heads, chunks * size, d_v)[:, :, :length].transpose(1, 2)
    final = state.reshape(batch, heads, d_k, d_v) if output_final_state else None
    return out.to(query.dtype, memory_format=torch.contiguous_format), final


class Recurrence(torch.autograd.Function):
    """The chunks' state recurrence, with its backward written out. Per chunk n, from S_0 = the initial state:

        forward:   U_n = U~_n - W_n S_n                 S_{n+1} = a_n S_n + K~_n^T U_n
        backward:  dU_n += K~_n dS_{n+1}                dS_n += a_n dS_{n+1} - W_n^T dU_n     (n from the last)
                   then for every chunk at once: dU~ = dU, dW = -dU S^T, dK~ = U dS_{n+1}^T, da = <S_n, dS_{n+1}>

    Autograd through the loop would save and replay about a dozen ops a chunk; here each direction is three.
    u (BH, N, C, d_v), w and k_end (BH, N, C, d_k), a (BH, N), state (BH, d_k, d_v) -> U (BH, N, C, d_v), the
    state entering each chunk (BH, N, d_k, d_v), the final state (BH, d_k, d_v)."""

    @staticmethod
    def forward(ctx, u, w, k_end, a, state):
        writes, entering = [], []
        for n in range(u.shape[1]):
            entering.append(state)
            writes.append(torch.baddbmm(u[:, n], w[:, n], state, alpha=-1))  # U_n = U~_n - W_n S_n
            state = torch.baddbmm(state * a[:, n, None, None], k_end[:, n].transpose(-1, -2), writes[-1])
        writes, entering = torch.stack(writes, dim=1), torch.stack(entering, dim=1)
        ctx.save_for_backward(w, k_end, a, writes, entering)
        return writes, entering, state

    @staticmethod
    def backward(ctx, d_writes, d_entering, d_state):  # d_state: the final state's gradient, dS_N
        w, k_end, a, writes, entering = ctx.saved_tensors
        d_u, d_next = [None] * a.shape[1], [None] * a.shape[1]  # dU_n, dS_{n+1}
        for n in reversed(range(a.shape[1])):
            d_next[n] = d_state
            d_u[n] = torch.baddbmm(d_writes[:, n], k_end[:, n], d_state)
            d_state = torch.baddbmm(torch.addcmul(d_entering[:, n], a[:, n, None, None], d_state),
                                    w[:, n].transpose(-1, -2), d_u[n], alpha=-1)
        d_u, d_next = torch.stack(d_u, dim=1), torch.stack(d_next, dim=1)  # (BH, N, C, d_v), (BH, N, d_k, d_v)
        return (d_u, -d_u @ entering.transpose(-1, -2), writes @ d_next.transpose(-1, -2),
                (entering * d_next).sum(dim=(-1, -2)), d_state)

# -----------------------------------------------------------------------------
# which code runs the rule: fla's kernels where they are right, the page above elsewhere

@dataclasses.dataclass(frozen=True)
class Paths:  # the code a Gated DeltaNet call takes on one device, and why
    forward: str  # 'fla', 'pytorch' (chunk_gated_delta_rule above) or 'transformers' (its own binding)
    backward: str  # the same for a call whose inputs need gradients
    why: str

    @property
    def line(self):
        name = lambda path: {"pytorch": "PyTorch chunked (deltanet.py)", "transformers": "transformers' own binding"}.get(
            path) or f"fla {fla_version()}"  # noqa: E731
        both = (f"forward and backward {name(self.forward)}" if self.forward == self.backward
                else f"forward {name(self.forward)}, backward {name(self.backward)}")
        return f"Gated DeltaNet: {both} ({self.why})"


def version_tuple(text):  # '3.7.1+git1a2b' -> (3, 7, 1)
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def fla_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("fla-core")
    except PackageNotFoundError:
        return getattr(importlib.import_module("fla"), "__version__", "?")


def fla_backward_fault(capability, triton, tilelang):
    """Why fla's gated backward is wrong on this GPU, or None where it is right. On Hopper (sm_90) triton 3.4.0 to
    before 3.7.1 miscompiles its chunk_bwd_kernel_dqkwg: dg and dbeta come out about 4 % off (fla #640; fla 0.6.0
    refuses, fla <= 0.4.2 computes them silently). fla sends that kernel to TileLang by itself where tilelang
    imports and nvcc is found, and flash-qla's whole-layer TileLang kernels avoid it. capability (major, minor);
    triton a version tuple; tilelang: whether either TileLang route is on (a bool)."""
    if capability[0] == 9 and (3, 4, 0) <= triton < (3, 7, 1) and not tilelang:
        return (f"fla's backward is wrong on Hopper with triton {'.'.join(map(str, triton))} (< 3.7.1) and no tilelang: "
                "torch >= 2.12.1 brings triton 3.7.1")
    return None


@functools.lru_cache(maxsize=None)
def paths(device):
    """The Paths of a torch.device, from PACE_DELTANET (auto: the fastest correct) and what this machine has."""
    chosen = os.environ.get("PACE_DELTANET", "auto")
    if chosen not in PATHS:
        raise ValueError(f"PACE_DELTANET must be one of {', '.join(PATHS)}, got {chosen!r}")
    if chosen != "auto":
        if chosen.startswith("fla") and fla_rule() is None:
            raise ValueError(f"PACE_DELTANET={chosen}, but fla does not import here: pip install -r requirements-gpu.txt")
        return Paths(*(("fla", "pytorch") if chosen == "fla_forward" else (chosen, chosen)), "PACE_DELTANET")
    if device.type != "cuda":
        return Paths("pytorch", "pytorch", "fla's kernels are Triton, for a GPU")
    if fla_rule() is None:
        return Paths("pytorch", "pytorch", "fla does not import: pip install -r requirements-gpu.txt")
    import triton
    tilelang = fla_backend_on("common.backends.tilelang", "CommonTileLangBackend")  # its own dqkwg, on Hopper
    flash_qla = fla_backend_on("gated_delta_rule.backends.flash_qla", "FlashQLABackend")  # the whole layer
    fault = fla_backward_fault(torch.cuda.get_device_capability(device), version_tuple(triton.__version__),
                               tilelang or flash_qla)
    if fault:
        return Paths("fla", "pytorch", fault)
    extra = " with flash-qla" if flash_qla else " with TileLang" if tilelang else ""
    return Paths("fla", "fla", f"triton {triton.__version__}{extra}")


def fla_backend_on(module, name):
    """Whether fla would call its backend `name` (of fla.ops.<module>): installed, and not switched off by its
    environment variable (FLA_TILELANG=0, FLA_FLASH_QLA=0); TileLang's also needs nvcc."""
    try:
        backend = getattr(importlib.import_module(f"fla.ops.{module}"), name)
        return bool(backend.is_available() and backend().is_enabled())
    except Exception:  # noqa: BLE001 - an fla without this backend, or one whose import fails: not used
        return False


@functools.lru_cache(maxsize=None)
def fla_rule():
    """fla's chunk_gated_delta_rule and its parameter names, or None where fla does not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as kernel
    except Exception:  # noqa: BLE001 - any import failure means no fla, as transformers treats it
        return None
    return kernel, frozenset(inspect.signature(kernel).parameters)


def run_rule(query, key, value, g, beta, **kwargs):
    """What Qwen3.5's layers call once bound: fla's kernel or chunk_gated_delta_rule, as paths(device) says for a
    call whose inputs need gradients (backward) or not (forward: evaluation, mining, GradCache's no-grad pass)."""
    chosen = paths(query.device)
    backward = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value, g, beta))
    path = chosen.backward if backward else chosen.forward
    if path == "fla":
        kernel, names = fla_rule()
        return kernel(query, key, value, g=g, beta=beta, **{k: v for k, v in kwargs.items() if k in names})
    if path == "transformers":
        return transformers_rule(unwrapped=False)(query, key, value, g=g, beta=beta, **kwargs)
    return chunk_gated_delta_rule(query, key, value, g=g, beta=beta, **kwargs)


def run_gated_norm(norm, hidden_states, gate):
    """Qwen3_5RMSNormGated.forward once bound: RMSNorm(x) * weight * SiLU(gate) over the head dim, the layer's output
    norm. On a GPU with fla, fla's fused kernel (one pass forward and one backward, where transformers' ops are
    about eight each way); elsewhere, or with PACE_FUSED_NORM=0, transformers' own forward."""
    if fused_norm_on(hidden_states.device):
        return fla_gated_norm()(hidden_states, gate, norm.weight, None, activation="swish", eps=norm.variance_epsilon)
    return norm._transformers_forward(hidden_states, gate)


def fused_norm_on(device):
    """Whether run_gated_norm takes fla's fused kernel on this device."""
    return device.type == "cuda" and os.environ.get("PACE_FUSED_NORM", "1") != "0" and fla_gated_norm() is not None


@functools.lru_cache(maxsize=None)
def fla_gated_norm():
    """fla's rms_norm_gated(x, g, weight, bias, activation, ..., eps), or None where fla does not import."""
    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
    except Exception:  # noqa: BLE001 - as fla_rule
        return None
    return rms_norm_gated


def transformers_rule(unwrapped=True):
    """transformers' own torch_chunk_gated_delta_rule (unwrapped: its PyTorch code, not the kernel it bound)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    function = getattr(modeling_qwen3_5, "_transformers_chunk_rule", modeling_qwen3_5.torch_chunk_gated_delta_rule)
    return inspect.unwrap(function) if unwrapped else function


def bind():
    """Qwen3.5's Gated DeltaNet layers call run_rule in place of transformers' torch_chunk_gated_delta_rule (a
    module global their forward looks up at each call; transformers' own stays at _transformers_chunk_rule), and
    their gated RMSNorm run_gated_norm (its class's forward; transformers' stays at _transformers_forward)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    if modeling_qwen3_5.torch_chunk_gated_delta_rule is not run_rule:
        modeling_qwen3_5._transformers_chunk_rule = modeling_qwen3_5.torch_chunk_gated_delta_rule
        modeling_qwen3_5.torch_chunk_gated_delta_rule = run_rule
    norm = modeling_qwen3_5.Qwen3_5RMSNormGated
    if norm.forward is not run_gated_norm:
        norm._transformers_forward, norm.forward = norm.forward, run_gated_norm
