#!/usr/bin/env bash
# bench/gpu.sh: the GPU run in one command on a fresh H100 / H200 machine, at most 8 minutes in all.
#
#   bash bench/gpu.sh              # every Gated DeltaNet path checked, then 0.8B and 2B on the fastest right one
#   bash bench/gpu.sh --fallback   # 0.8B alone on deltanet.py's PyTorch path, nothing unpacked: at most 4 minutes
#   bash bench/gpu.sh --dry-run    # print the flow and each step's time limit, run nothing (any machine)
#
# Before: `bash bench/wheels.sh` where pip has network makes bench/out/gpu_site.tar.xz (fla-core, tilelang,
# flash-qla, transformers 5.24: what the machine lacks, at most 64 MiB); the device call carries it.
# Set BENCH_COMMIT=$(git rev-parse --short HEAD) where the copy has no .git. Writes into $OUT (bench/gpu_<date>
# when unset): environment.txt (GPU, software, the check's table), fla_check.txt, path.env (the winner's
# environment), and for each shape <shape>.txt, <shape>.json (rewritten after every row: a run cut short keeps
# what it did) and <shape>_profile.txt (the profiler's ten costliest ops of one step of each stage).
#   1. unpack the archive into /tmp/pace_site, on PYTHONPATH from then on;
#   2. bench/fla_check.py: each path (flash-qla, fla with TileLang, fla's Triton alone, fla's forward with
#      deltanet.py's backward, deltanet.py's) against transformers' reference, in processes side by side; the
#      fastest that agrees forward and backward is exported (PACE_DELTANET, FLA_FLASH_QLA, FLA_TILELANG, and
#      PACE_FUSED_NORM=0 where fla's fused gated norm disagrees);
#   3. 0.8B: section gdn (a layer's rule by path; Stage I's and Stage II's steps on deltanet.py's path, on the
#      chosen one and on it with the gated norm unfused: tokens/s, MFU, peak memory, the profile), then section step
#      (every step row over its floor, the reranker's, rerank.py, among them);
#   4. 2B: section gdn.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
OUT=${OUT:-bench/gpu_$(date -u +%Y-%m-%d)}
SITE=/tmp/pace_site
ARCHIVE=bench/out/gpu_site.tar.xz
PY=$(command -v python3 || command -v python)
export PYTHONUNBUFFERED=1
UNPACK="import shutil, sys, tarfile; shutil.rmtree(sys.argv[2], ignore_errors=True); \
tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data'); print('unpacked', *sys.argv[1:])"
LIMITS=0  # the sum of the steps' time limits, for the dry run

step() {  # seconds, name, command...: run it under its time limit, its output into $OUT/<name>.txt
  local seconds=$1 name=$2
  shift 2
  LIMITS=$((LIMITS + seconds))
  if [ "$MODE" = "--dry-run" ]; then
    echo "[${seconds} s] $name: $*"
    return 0
  fi
  timeout "$seconds" "$@" 2>&1 | grep --line-buffered -v -e "Warning" -e "warnings.warn" | tee "$OUT/$name.txt"
  echo "exit status ${PIPESTATUS[0]} (124: cut at $seconds s)" | tee -a "$OUT/$name.txt"
}

bench() {  # seconds, shape, bench.py flags: one shape's rows
  step "$1" "$2" "$PY" -m bench.bench --shape="$2" --out="$OUT/$2.json" --num_workers="$WORKERS" "${@:3}"
}

[ "$MODE" = "--dry-run" ] || mkdir -p "$OUT"
if [ "$MODE" != "--dry-run" ]; then
  {
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    df -h /dev/shm  # DataLoader workers hand their batches over through it
  } 2>&1 | tee "$OUT/environment.txt"
fi
# 8 DataLoader workers (config/stage1.py) where /dev/shm has room for their batches, else loading in-process
SHM_MB=$(df -m --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
WORKERS=$([ "${SHM_MB:-0}" -ge 4096 ] 2>/dev/null && echo 8 || echo 0)

if [ "$MODE" = "--fallback" ]; then
  export PACE_DELTANET=pytorch
  bench 200 qwen3.5-0.8b --sections=gdn,step --iters=2 --warmup=1 --grad_cache_batch=64
  exit 0
fi
if [ -f "$ARCHIVE" ] || [ "$MODE" = "--dry-run" ]; then
  step 40 unpack "$PY" -c "$UNPACK" "$ARCHIVE" "$SITE"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
else
  echo "no $ARCHIVE (bash bench/wheels.sh makes it): only the machine's packages" | tee -a "$OUT/environment.txt"
fi
[ "$MODE" = "--dry-run" ] || "$PY" -c 'import importlib.util as u, sys, torch, triton, transformers
print(f"python {sys.version.split()[0]} | torch {torch.__version__} (CUDA {torch.version.cuda}) | triton",
      triton.__version__, "| transformers", transformers.__version__, "| importable:",
      {m: u.find_spec(m) is not None for m in ("fla", "tilelang", "flash_qla", "causal_conv1d")})' \
  2>&1 | tee -a "$OUT/environment.txt"

step 140 fla_check "$PY" -m bench.fla_check --timeout=125 --env_out="$OUT/path.env"
if [ -f "$OUT/path.env" ]; then
  . "$OUT/path.env"
else
  export PACE_DELTANET=pytorch  # no path agreed or the check did not finish: deltanet.py's own
fi
[ "$MODE" = "--dry-run" ] || echo "training path: PACE_DELTANET=${PACE_DELTANET:-auto}" | tee -a "$OUT/environment.txt"

bench 170 qwen3.5-0.8b --sections=gdn,step --iters=2 --warmup=1 --grad_cache_batch=64
bench 120 qwen3.5-2b --sections=gdn --iters=2 --warmup=1
[ "$MODE" = "--dry-run" ] && echo "time limits: $LIMITS s in all (the machine gives 480 s to this run)"
exit 0
