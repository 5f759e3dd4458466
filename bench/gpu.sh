#!/usr/bin/env bash
# bench/gpu.sh: bench.py's GPU half in one go on a fresh H100 / H200 machine, at most 8 minutes in all.
#
#   BENCH_COMMIT=$(git rev-parse --short HEAD) bash bench/gpu.sh               # from the repository root
#   BENCH_COMMIT=$(git rev-parse --short HEAD) bash bench/gpu.sh --fallback    # 0.8B only, no fla: at most 4 minutes
#
# Writes 7 files into $OUT (bench/out when unset): environment.txt (GPU, driver, /dev/shm, software, the fla
# check), then <run>.txt and <run>.json for qwen3.5-0.8b, qwen3.5-0.8b-fsdp (train.py's 8-GPU code path, FSDP2,
# on one rank) and qwen3.5-2b. Each run has its own time limit (`timeout`) and bench.py rewrites its JSON after
# every row, so a run cut short keeps the rows it finished. Nothing is fetched: the machine's python3 (torch,
# triton, einops, transformers) runs it, with the wheels found in bench/out/wheels installed offline into
# /tmp/pace_wheels and put on PYTHONPATH. Fetch them beforehand where there is network (requirements-gpu.txt):
#
#   python3 -m pip download --no-deps --only-binary=:all: -d bench/out/wheels -r requirements-gpu.txt
#
# fla (flash-linear-attention's Gated DeltaNet kernels) stays only if bench/fla_check.py finds its forward and
# backward equal to transformers' PyTorch reference at Qwen3.5's head shape; else it is removed and transformers'
# fallback runs. The tables' kernels line says which ran. --fallback skips the wheels (transformers' PyTorch
# kernels, nothing to compile) and runs 0.8B alone with fewer rounds: for a machine where the full run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
SITE=/tmp/pace_wheels
PY=$(command -v python3 || command -v python)
FALLBACK=$([ "${1:-}" = "--fallback" ] && echo 1 || echo 0)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

machine() {
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  df -h /dev/shm  # DataLoader workers hand their batches over through it
}

install_wheels() {  # into $SITE, afresh; then fla is checked, and removed if it fails the check
  rm -rf "$SITE"
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" bench/out/wheels/*.whl
  if [ -d "$SITE/fla" ] && ! PYTHONPATH=$SITE timeout 100 "$PY" bench/fla_check.py 2>&1 | tail -3; then
    echo "fla: the check failed or disagreed (above): removed, transformers' PyTorch fallback runs"
    rm -rf "$SITE"/fla "$SITE"/fla_core-*
  fi
}

machine 2>&1 | tee "$OUT/environment.txt"
if [ "$FALLBACK" = 0 ] && ls bench/out/wheels/*.whl >/dev/null 2>&1; then
  install_wheels 2>&1 | tee -a "$OUT/environment.txt"
fi
[ "$FALLBACK" = 0 ] && [ -d "$SITE" ] && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c 'import importlib.util as u, sys, torch, transformers
print(f"python {sys.version.split()[0]} | torch {torch.__version__} (CUDA {torch.version.cuda}) | transformers",
      transformers.__version__, "| importable:", {m: u.find_spec(m) is not None for m in ("fla", "causal_conv1d")})' \
  2>&1 | tee -a "$OUT/environment.txt"
# 8 DataLoader workers (config/stage1.py) where /dev/shm has room for their batches, else loading in-process
SHM_MB=$(df -m --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
WORKERS=$([ "${SHM_MB:-0}" -ge 4096 ] 2>/dev/null && echo 8 || echo 0)
echo "/dev/shm: ${SHM_MB:-?} MB free -> --num_workers=$WORKERS" | tee -a "$OUT/environment.txt"

run() {  # name, time limit in seconds, bench.py flags
  timeout "$2" "$PY" -m bench.bench --out="$OUT/$1.json" --num_workers="$WORKERS" "${@:3}" 2>&1 \
    | grep --line-buffered -v -e "Warning" -e "warnings.warn" | tee "$OUT/$1.txt"
  echo "exit status ${PIPESTATUS[0]} (124: cut at $2 s)" | tee -a "$OUT/$1.txt"
}

# The paper's batch (32 queries, 5 hard negatives a GPU) and GradCache at one GPU's share of the global 1,024 on
# 8 GPUs (128 queries); the FSDP2 run and 2B take fewer rounds and a GradCache batch of 64 to fit the time.
if [ "$FALLBACK" = 1 ]; then
  run qwen3.5-0.8b 140 --shape=qwen3.5-0.8b --sections=step,cut --iters=2 --warmup=1 --grad_cache_batch=64
  run qwen3.5-0.8b-fsdp 70 --shape=qwen3.5-0.8b --fsdp=True --sections=step --iters=2 --warmup=1 --grad_cache_batch=32
else
  run qwen3.5-0.8b 170 --shape=qwen3.5-0.8b --sections=step,cut,lora,data,eval --iters=3 --warmup=1
  run qwen3.5-0.8b-fsdp 80 --shape=qwen3.5-0.8b --fsdp=True --sections=step --iters=2 --warmup=1 --grad_cache_batch=64
  run qwen3.5-2b 120 --shape=qwen3.5-2b --sections=step,lora --iters=2 --warmup=1 --grad_cache_batch=64
fi
