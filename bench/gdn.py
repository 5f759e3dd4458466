"""
bench/gdn.py: bench.py's section gdn, the Gated DeltaNet's chunked rule on its own: deltanet.py's PyTorch code
against transformers' own (and fla's, on a GPU where it imports), then the training step under each path.

    python -m bench.bench --sections=gdn            # CPU: about 2 minutes on 2 idle cores

1. A layer: one Gated DeltaNet layer's rule, forward and backward, at 2 x 2,048 and 11 x 256 tokens with 16 heads
   of 128 (Qwen3.5-0.8B's and 2B's), inputs as the layer makes them (q, k, v and beta in the compute dtype, g
   float32, use_qk_l2norm_in_kernel): the time over transformers' (median of side-by-side rounds), the largest
   relative error |x - ref| / |ref| of the output and the gradients of q, k, v, g and beta, and the ops one layer
   dispatches at 2 x 4,096 tokens. The ops are counted by a TorchDispatchMode on meta tensors (shapes only, no
   arithmetic): every aten op that is not a view, as each is a kernel launch on a GPU.
2. A step: bench.py's Stage I (LoRA, cos) and Stage II (full, dot) steps with each path bound (PACE_DELTANET), side
   by side; on a GPU with tokens/s, MFU and peak memory; then the profiler's ten costliest ops of one step of each.
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import common
import deltanet
from bench.timing import paired_ratio, side_by_side

HEADS, HEAD_DIM = 16, 128  # Qwen3.5-0.8B's and 2B's Gated DeltaNet heads
SHAPES = ((2, 2048), (11, 256))  # (sequences, tokens): two long ones, and a batch of short items
NAMES = ("output", "grad q", "grad k", "grad v", "grad g", "grad beta")


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, views apart (a view launches nothing)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view
        return func(*args, **(kwargs or {}))


def layer_inputs(sequences, tokens, device, dtype, seed=0):
    """(q, k, v, g, beta) and the output's gradient, seeded, as Qwen3_5GatedDeltaNet.forward makes them."""
    generator = torch.Generator(device).manual_seed(seed) if device.type != "meta" else None
    randn = lambda *shape: torch.randn(*shape, generator=generator, device=device)  # noqa: E731
    q, k, v = (randn(sequences, tokens, HEADS, HEAD_DIM).to(dtype) for _ in range(3))
    g = F.logsigmoid(randn(sequences, tokens, HEADS))  # float32, < 0
    beta = randn(sequences, tokens, HEADS).sigmoid().to(dtype)
    return (q, k, v, g, beta), randn(sequences, tokens, HEADS, HEAD_DIM).to(dtype)


def forward_backward(function, tensors, grad_output=None):
    """[output, the gradients of q, k, v, g, beta] of function on fresh leaves; [output] alone, without a graph,
    where grad_output is None."""
    leaves = [x.detach().clone().requires_grad_(grad_output is not None) for x in tensors]
    q, k, v, g, beta = leaves
    with torch.set_grad_enabled(grad_output is not None):
        output, _ = function(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    if grad_output is None:
        return [output]
    output.backward(grad_output)
    return [output] + [x.grad for x in leaves]


def relative_errors(got, expected):  # {name: |x - ref| / |ref|}
    return {name: ((x.double() - ref.double()).norm() / ref.double().norm()).item()
            for name, x, ref in zip(NAMES, got, expected)}


def ops_per_layer(function, sequences=2, tokens=4096):
    """Non-view aten ops of one layer's forward and backward at this shape, on meta tensors."""
    tensors, grad_output = layer_inputs(sequences, tokens, torch.device("meta"), torch.float32)
    with OpCount() as count:
        forward_backward(function, tensors, grad_output)
    return count.ops


def measure_layers(results, device, dtype, iters, warmup):
    """Section gdn, part 1: a row per shape (forward + backward; on a GPU with fla, also its forward alone, for the
    calls without gradients), and the ops per layer."""
    functions = {"transformers": deltanet.transformers_rule(), "pytorch": deltanet.chunk_gated_delta_rule}
    fla = deltanet.fla_rule() if device.type == "cuda" else None
    trusted = fla is not None and deltanet.paths(device).backward == "fla"  # else its backward fails or is wrong here
    print(f"gdn. one Gated DeltaNet layer's rule, {HEADS} heads of {HEAD_DIM}, {dtype}: each path's time over "
          f"transformers' (median of {iters} rounds after {warmup}), its largest relative error against it", flush=True)
    for sequences, tokens in SHAPES:
        tensors, grad_output = layer_inputs(sequences, tokens, device, dtype)
        for backward in (True, False) if fla else (True,):
            paths = dict(functions, **({"fla": fla[0]} if fla and (trusted or not backward) else {}))
            cotangent = grad_output if backward else None
            expected = forward_backward(functions["transformers"], tensors, cotangent)
            row = {"name": f"{sequences} x {tokens}" + ("" if backward else ", forward alone"), "backward": backward}
            times, seconds = side_by_side({path: lambda f=f: forward_backward(f, tensors, cotangent)
                                           for path, f in paths.items()}, device, iters, warmup)
            parts = []
            for path in paths:
                errors = relative_errors(forward_backward(paths[path], tensors, cotangent), expected)
                worst = max(errors, key=errors.get)
                row[path] = {"s": seconds[path], "ratio": paired_ratio(times[path], times["transformers"]),
                             "largest_error": errors[worst], "largest_error_of": worst}
                parts.append(f"{path} {seconds[path] * 1e3:8.1f} ms ({row[path]['ratio']:.3f}; {worst} {errors[worst]:.1e})")
            results.add("gdn", row, f"  {row['name']:<26} " + " | ".join(parts))
    counts = {path: ops_per_layer(f) for path, f in functions.items()}  # fla's kernels need a GPU, not meta tensors
    row = {"name": "ops per layer, 2 x 4096", **counts, "share": counts["pytorch"] / counts["transformers"]}
    results.add("gdn", row, f"  ops one layer dispatches, forward + backward at 2 x 4,096 tokens: transformers "
                            f"{counts['transformers']:,}, pytorch {counts['pytorch']:,} ({row['share']:.2f} of them)")


def measure_step_paths(results, steps, device, iters, warmup, peak_flops=None, profile=""):
    """Section gdn, part 2: each stage's step under each path, side by side: on a CPU transformers' against
    deltanet.py's; on a GPU deltanet.py's, the one the environment chose (where that is another), and that one with
    the gated RMSNorm unfused (where fla fuses it). steps: [(name, step_once, real tokens, FLOPs a step)], step_once()
    taking one step as bench.py's train_step_once. On a GPU also tokens/s, MFU and peak memory per path; then the
    profiler's ten costliest ops of one step on the chosen path, printed, and written to `profile` where given."""
    switches = ("PACE_DELTANET", "PACE_FUSED_NORM")
    before, tables = {key: os.environ.get(key) for key in switches}, []
    chosen = deltanet.paths(device)  # the environment's: PACE_DELTANET as bench/gpu.sh exports it, or auto
    label = before["PACE_DELTANET"] or "auto"
    variants = {"transformers": {"PACE_DELTANET": "transformers"}, "pytorch": {"PACE_DELTANET": "pytorch"}}
    if device.type == "cuda":  # {name: the environment it runs under}
        variants = {"pytorch": {"PACE_DELTANET": "pytorch"}} | (
            {label: {"PACE_DELTANET": label}} if chosen.forward != "pytorch" else {})
        if deltanet.fused_norm_on(device):
            variants[f"{list(variants)[-1]}, unfused norm"] = {**variants[list(variants)[-1]], "PACE_FUSED_NORM": "0"}
    names, fastest = list(variants), [name for name in variants if "unfused" not in name][-1]

    def under(name, step_once, peaks):
        def run():
            os.environ.pop("PACE_FUSED_NORM", None)
            os.environ.update(variants[name])
            deltanet.paths.cache_clear()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            step_once()
            if device.type == "cuda":
                peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device) / 2**30)
        return run
    try:
        for name, step_once, real_tokens, flops in steps:
            peaks = {}
            times, seconds = side_by_side({path: under(path, step_once, peaks) for path in names}, device, iters,
                                          warmup)
            row = {"name": f"{name} by path", "ratio": paired_ratio(times[fastest], times[names[0]])}
            parts = []
            for path in names:
                row[path] = {"step_s": seconds[path], "tokens_per_s": real_tokens / seconds[path]}
                parts.append(f"{path} {seconds[path] * 1e3:.1f} ms, {row[path]['tokens_per_s']:,.0f} tok/s")
                if device.type == "cuda":
                    row[path].update(peak_memory_gb=peaks[path], mfu=flops / seconds[path] / peak_flops if peak_flops
                                     else None)
                    parts[-1] += (f", MFU {format(row[path]['mfu'], '.1%') if peak_flops else '-'}, peak "
                                  f"{peaks[path]:.1f} GB")
            line = f"  {name + ':':<22} " + " | ".join(parts) + f" | {fastest} / {names[0]} {row['ratio']:.3f}"
            if names[-1] != fastest:  # what the fused gated RMSNorm saves
                row["fused_norm_ratio"] = paired_ratio(times[fastest], times[names[-1]])
                line += f" | fused norm / unfused {row['fused_norm_ratio']:.3f}"
            results.add("gdn", row, line + (f" ({chosen.line})" if device.type == "cuda" else ""))
            tables.append(top_ops(name, under(fastest, step_once, {}), device))
    finally:
        for key, value in before.items():
            os.environ.pop(key, None) if value is None else os.environ.update({key: value})
        deltanet.paths.cache_clear()
    print("\n".join(tables), flush=True)
    if profile:
        with open(profile, "w") as f:
            f.write("\n".join(tables) + "\n")


def top_ops(name, step, device, count=10):
    """The profiler's table of one step's `count` costliest ops (self time on the GPU, else on the CPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * (device.type == "cuda")
    with torch.profiler.profile(activities=activities) as profiler:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return (f"{name}: one step's {count} costliest ops by {sort}\n"
            + profiler.key_averages().table(sort_by=sort, row_limit=count, max_name_column_width=60))


if __name__ == "__main__":  # a library: it says what it is and what runs it
    common.library_help(__doc__, sys.argv[1:])
