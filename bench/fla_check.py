"""
bench/fla_check.py: which Gated DeltaNet path is right on this machine, and which of the right ones is fastest.
bench/gpu.sh runs it before the bench rows and hands the winner's environment to them.

    python -m bench.fla_check                          # every path, each in a process of its own, at once: a table
    python -m bench.fla_check --env_out=bench/out/path.env    # also write the fastest right path as shell exports
    python -m bench.fla_check --path=fla_forward       # one path, one JSON line (what each of those processes runs)

The paths (CHECKS) are the ways Qwen3.5's layers can run the rule once deltanet.bind() has bound it, each chosen by
its environment: PACE_DELTANET for deltanet.py, FLA_FLASH_QLA and FLA_TILELANG for fla, which reads them at every
call. A path whose package is missing is not tried; without CUDA only deltanet.py's own is. Each is called through
deltanet.run_rule, as the layers call it, and compared with transformers' own torch_chunk_gated_delta_rule (its
PyTorch code, computing in float32: inspect.unwrap passes the decorator that binds fla in its place).

The inputs are a layer's under bf16 autocast (Qwen3_5GatedDeltaNet.forward): q, k, v bf16 with 16 heads of 128
(both released sizes), g float32 log decays below 0, beta bf16 in (0, 1), use_qk_l2norm_in_kernel=True, 2 sequences
of 300 tokens (not a multiple of the 64-token chunk). Measured: the relative error ||x - ref|| / ||ref|| of the
output and of the gradients of q, k, v, g and beta, and of the output without gradients (evaluation's call). bf16
keeps about 3 significant digits, so a right bf16 kernel differs from the float32 reference by well under 1 %; a
wrong one (fla #640's dg and dbeta on Hopper with triton < 3.7.1: about 4 %; a layout or a sign: about 100 %) by
more than TOLERANCE. On CUDA also the time: the first call (Triton's or TileLang's compile and autotune), the first
call at a new batch and length (a kernel whose tuning keys on the length tunes again there: fla #1147), then the
median of 5 forward + backward calls and of 5 forward calls at 2 x 2,048 tokens. Where fla imports on a GPU, also
the layer's gated RMSNorm, fla's fused kernel (deltanet.run_gated_norm) against transformers' Qwen3_5RMSNormGated,
forward and backward; where it disagrees, the exports switch it off (PACE_FUSED_NORM=0).
"""
import inspect
import json
import os
import subprocess
import sys
import time
import traceback

import torch

import common
import deltanet
from bench.gdn import HEADS, HEAD_DIM, NAMES, forward_backward, layer_inputs, relative_errors
from configurator import configure

TOLERANCE = 0.02  # the largest relative error allowed (bf16 through a few hundred steps of recurrence)
CHECKS = {  # name: (what runs, the packages it needs, its environment)
    "flash-qla": ("fla with flash-qla's whole-layer TileLang kernels", ("fla", "flash_qla", "tilelang"),
                  {"PACE_DELTANET": "fla", "FLA_FLASH_QLA": "1"}),
    "fla+tilelang": ("fla's Triton kernels, its guarded backward kernel in TileLang", ("fla", "tilelang"),
                     {"PACE_DELTANET": "fla", "FLA_FLASH_QLA": "0", "FLA_TILELANG": "1"}),
    "fla": ("fla's Triton kernels alone", ("fla",), {"PACE_DELTANET": "fla", "FLA_FLASH_QLA": "0", "FLA_TILELANG": "0"}),
    "fla_forward": ("fla's Triton forward, deltanet.py's backward", ("fla",),
                    {"PACE_DELTANET": "fla_forward", "FLA_FLASH_QLA": "0", "FLA_TILELANG": "0"}),
    "pytorch": ("deltanet.py's PyTorch chunked rule", (), {"PACE_DELTANET": "pytorch"}),
}
# -----------------------------------------------------------------------------
# config (--key=value)
path = ""  # check one path of CHECKS in this process and print its JSON line; empty: every path, a process each
tokens = 300  # tokens a sequence in the comparison (2 sequences)
timeout = 240  # seconds each path's process may take (its first call compiles kernels)
env_out = ""  # write the fastest right path's environment here as `export KEY=value` lines (bench/gpu.sh reads it)
# -----------------------------------------------------------------------------


def reference(name="torch_chunk_gated_delta_rule"):
    """transformers' PyTorch implementation `name` (its own, whatever deltanet.bind() or its decorator bound)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    function = deltanet.transformers_rule() if name == "torch_chunk_gated_delta_rule" else getattr(modeling_qwen3_5, name)
    function = inspect.unwrap(function)
    if function.__code__.co_filename != modeling_qwen3_5.__file__:
        raise RuntimeError(f"{name} did not unwrap to transformers' PyTorch code: {function.__code__.co_filename}")
    return function


def check(candidate, device, tokens=300):
    """{output or gradient: relative error of candidate against transformers' chunked reference}; inf where
    candidate gives a non-finite value."""
    tensors, grad_output = layer_inputs(2, tokens, torch.device(device), torch.bfloat16)
    expected = forward_backward(reference(), tensors, grad_output)
    got = forward_backward(candidate, tensors, grad_output)
    errors = relative_errors(got, expected)
    return {name: errors[name] if torch.isfinite(x).all() else float("inf") for name, x in zip(NAMES, got)}


def seconds_of(function, device, rounds=1):
    """The median wall time of `rounds` calls, synchronised on a GPU."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        start = time.perf_counter()
        function()
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check_one(name, device, tokens):
    """One path in this process (its environment already set): its errors, its time, or why it did not run."""
    result = {"path": name, "line": deltanet.paths(device).line}
    try:
        tensors, _ = layer_inputs(2, tokens, device, torch.bfloat16)
        expected = forward_backward(reference(), tensors)[0]
        result["forward"] = relative_errors(forward_backward(deltanet.run_rule, tensors), [expected])["output"]
        result["errors"] = check(deltanet.run_rule, device, tokens)
    except Exception as error:  # noqa: BLE001 - fla's refusal (a RuntimeError) or a kernel that fails to build
        result["failed"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        traceback.print_exc(file=sys.stderr)
    if device.type == "cuda" and "forward" in result:  # the timings, where at least its forward runs
        long, grad_output = layer_inputs(2, 2048, device, torch.bfloat16)
        other, other_grad = layer_inputs(3, 1000, device, torch.bfloat16, seed=1)
        backward = "failed" not in result
        call = lambda x, g: lambda: forward_backward(deltanet.run_rule, x, g if backward else None)  # noqa: E731
        result["first_call_s"] = seconds_of(call(long, grad_output), device)
        result["new_shape_first_call_s"] = seconds_of(call(other, other_grad), device)
        result["forward_ms"] = 1e3 * seconds_of(lambda: forward_backward(deltanet.run_rule, long), device, 5)
        if backward:
            result["forward_backward_ms"] = 1e3 * seconds_of(call(long, grad_output), device, 5)
    if device.type == "cuda" and deltanet.fused_norm_on(device):  # the layer's gated RMSNorm, fla's fused kernel
        try:
            result["norm"] = check_norm(device, tokens)
        except Exception as error:  # noqa: BLE001 - a kernel that fails to build
            result["norm"] = {"failed": f"{type(error).__name__}: {error}"[:300]}
    result["agrees"] = "errors" in result and max(result["errors"].values()) <= TOLERANCE
    result["forward_agrees"] = result.get("forward", float("inf")) <= TOLERANCE
    return result


def check_norm(device, tokens):
    """{output or gradient: relative error} of deltanet.run_gated_norm (fla's fused kernel) against transformers'
    Qwen3_5RMSNormGated on a layer's (2 x tokens x 16 heads, 128) bf16 input and gate, float32 weight (autocast's)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated
    generator = torch.Generator(device).manual_seed(2)
    randn = lambda *shape: torch.randn(*shape, generator=generator, device=device)  # noqa: E731
    norm = Qwen3_5RMSNormGated(HEAD_DIM, eps=1e-6).to(device)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * randn(HEAD_DIM))
    x, gate, grad_output = (randn(2 * tokens * HEADS, HEAD_DIM).bfloat16() for _ in range(3))
    deltanet.bind()  # Qwen3_5RMSNormGated.forward is run_gated_norm from here; transformers' own kept beside it
    found = []
    for forward in (deltanet.run_gated_norm, Qwen3_5RMSNormGated._transformers_forward):
        leaves = [t.clone().requires_grad_() for t in (x, gate)]
        norm.weight.grad = None
        output = forward(norm, *leaves)
        output.backward(grad_output)
        found.append([output.detach()] + [t.grad for t in leaves] + [norm.weight.grad])
    relative = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    return {name: relative(a, b) for name, a, b in zip(("output", "grad x", "grad gate", "grad weight"), *found)}


def describe(result):
    """One table line of a path's result."""
    if "skipped" in result:
        return f"  {result['path']:<13} not tried: {result['skipped']}"
    verdict = "agrees" if result["agrees"] else "forward agrees only" if result["forward_agrees"] else "DISAGREES"
    parts = [f"  {result['path']:<13} {verdict:<20} forward alone {result.get('forward', float('nan')):.1e}"]
    if "errors" in result:
        parts.append(", ".join(f"{key} {value:.1e}" for key, value in result["errors"].items()))
    if "failed" in result:
        parts.append(f"failed: {result['failed']}")
    if "norm" in result:
        parts.append("fused gated RMSNorm " + ", ".join(f"{key} {value:.1e}" if isinstance(value, float) else value
                                                        for key, value in result["norm"].items()))
    if "forward_ms" in result:
        timing = f"forward {result['forward_ms']:.2f} ms"
        timing += f", forward + backward {result['forward_backward_ms']:.2f} ms" if "forward_backward_ms" in result else ""
        parts.append(f"{timing} at 2 x 2,048 | first call {result['first_call_s']:.1f} s, at a new batch and length "
                     f"{result['new_shape_first_call_s']:.2f} s")
    return " | ".join(parts)


def fastest(results):
    """The right path to train with: the fastest of those that agree forward and backward (deltanet.py's own where
    nothing was timed, as on a CPU), or None."""
    right = [r for r in results if r.get("agrees")]
    timed = [r for r in right if "forward_backward_ms" in r]
    if timed:
        return min(timed, key=lambda r: r["forward_backward_ms"])
    return next((r for r in right if r["path"] == "pytorch"), right[0] if right else None)


def check_all(device, tokens, seconds, env_out):
    """Every path in a process of its own, all at once (their compiles run on the CPU's cores side by side)."""
    from importlib.util import find_spec
    print(f"fla check: each Gated DeltaNet path against transformers' reference ({HEADS} heads of {HEAD_DIM}, bf16, "
          f"2 x {tokens} tokens, tolerance {TOLERANCE}), each in a process of its own", flush=True)
    running, results = {}, []
    for name, (_, packages, environment) in CHECKS.items():
        missing = [package for package in packages if find_spec(package) is None]
        if device.type != "cuda" and name != "pytorch":
            results.append({"path": name, "skipped": "no CUDA device"})
        elif missing:
            results.append({"path": name, "skipped": f"{', '.join(missing)} not installed"})
        else:
            running[name] = subprocess.Popen(
                [sys.executable, "-m", "bench.fla_check", f"--path={name}", f"--tokens={tokens}"],
                env={**os.environ, **environment}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds
    for name, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [line for line in stdout.splitlines() if line.startswith("{")]
            result = json.loads(lines[-1]) if lines else {
                "path": name, "agrees": False, "forward_agrees": False,
                "failed": f"exit status {process.returncode}: {(stderr.strip().splitlines() or [''])[-1][:300]}"}
        except subprocess.TimeoutExpired:
            process.kill()
            result = {"path": name, "agrees": False, "forward_agrees": False, "failed": f"timed out after {seconds} s"}
        results.append(result)
    for result in sorted(results, key=lambda r: list(CHECKS).index(r["path"])):
        print(describe(result), flush=True)
    best = fastest(results)
    if best is None:
        print("fla check: no path agrees with transformers' reference")
        return 1
    environment = dict(CHECKS[best["path"]][2])
    norm = best.get("norm", {})
    if norm and not all(isinstance(value, float) and value <= TOLERANCE for value in norm.values()):
        environment["PACE_FUSED_NORM"] = "0"  # fla's fused gated RMSNorm is wrong or fails here: transformers' ops
    print(f"fla check: train with {best['path']} ({CHECKS[best['path']][0]}): "
          + " ".join(f"{key}={value}" for key, value in environment.items()), flush=True)
    if env_out:
        with open(env_out, "w") as f:
            f.write("".join(f"export {key}={value}\n" for key, value in environment.items()))
    return 0


def main(argv):
    configure(globals(), argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if path:
        if path not in CHECKS:
            raise common.UserError(f"--path must be one of {', '.join(CHECKS)}, got {path!r}")
        print(json.dumps(check_one(path, device, tokens)), flush=True)
        return 0
    return check_all(device, tokens, timeout, env_out)


if __name__ == "__main__":
    common.install_error_hook()
    sys.exit(main(sys.argv[1:]))
