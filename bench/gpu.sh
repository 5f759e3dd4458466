#!/usr/bin/env bash
# bench/gpu.sh: bench.py's GPU half in one shot on a fresh H100 / H200 machine, about 8 minutes in all.
#
#   BENCH_COMMIT=$(git rev-parse --short HEAD) bash bench/gpu.sh     # from the repository root
#
# Writes environment.txt, then qwen3.5-0.8b.{txt,json} and qwen3.5-2b.{txt,json} into $OUT (bench/out/ when
# $OUT is unset). Each shape runs under its own time limit; bench.py rewrites its JSON after every row, so a
# shape cut short still leaves the rows it finished. Nothing is fetched from a registry: the machine's own
# python3 (with torch, triton, transformers) runs it. Wheels placed beforehand in bench/out/wheels/, e.g.
#
#   pip download --no-deps -d bench/out/wheels transformers==5.24.0 flash-linear-attention fla-core
#
# (and carried to the machine with that folder), are installed into /tmp/pace_wheels first; flash-linear-
# attention stays only if one of its kernels runs here. The table's "Gated DeltaNet kernels" line says whether
# its kernels or transformers' PyTorch fallback ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
PY=$(command -v python3 || command -v python)

FLA_CHECK='
import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
q, k, v = (torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
g, beta = -torch.rand(1, 128, 4, device="cuda"), torch.rand(1, 128, 4, device="cuda", dtype=torch.bfloat16)
out, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
assert torch.isfinite(out).all()
print("flash-linear-attention: chunk_gated_delta_rule runs here")
'
ENVIRONMENT='
import importlib.util, sys
import torch, transformers
print(f"python {sys.version.split()[0]} | torch {torch.__version__} (CUDA {torch.version.cuda}) | "
      f"transformers {transformers.__version__} from {transformers.__file__}")
print("importable:", {m: importlib.util.find_spec(m) is not None
                      for m in ("fla", "causal_conv1d", "flash_attn", "triton", "kernels")})
'

{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  if ls bench/out/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --no-deps --no-index --target /tmp/pace_wheels bench/out/wheels/*.whl
    if [ -d /tmp/pace_wheels/fla ] && ! PYTHONPATH=/tmp/pace_wheels "$PY" -c "$FLA_CHECK" 2>&1 | tail -2; then
      echo "flash-linear-attention failed here: removed, transformers' PyTorch fallback will run"
      rm -rf /tmp/pace_wheels/fla /tmp/pace_wheels/fla_core-* /tmp/pace_wheels/flash_linear_attention-*
    fi
  fi
} 2>&1 | tee "$OUT/environment.txt"
[ -d /tmp/pace_wheels ] && export PYTHONPATH=/tmp/pace_wheels${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "$ENVIRONMENT" 2>&1 | tee -a "$OUT/environment.txt"

shape() {  # name, time limit in seconds, extra bench.py flags
  timeout "$2" "$PY" bench.py --shape="$1" --out="$OUT/$1.json" "${@:3}" 2>&1 \
    | grep --line-buffered -v -e "Warning" -e "warnings.warn" | tee "$OUT/$1.txt"
  echo "exit status ${PIPESTATUS[0]} (124: cut at $2 s)" | tee -a "$OUT/$1.txt"
}

# The paper's batch (32 queries, 5 hard negatives per GPU) and GradCache at one GPU's share of the global 1,024
# on 8 GPUs (128 queries); the 2B shape takes fewer rounds and a smaller GradCache batch to fit the time.
shape qwen3.5-0.8b 200 --iters=3 --warmup=1
shape qwen3.5-2b 250 --iters=2 --warmup=1 --grad_cache_batch=64
