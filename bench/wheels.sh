#!/usr/bin/env bash
# bench/wheels.sh: what the GPU machine lacks, as one archive of at most 64 MiB, made on any machine where pip
# reaches the package registry (a CPU is enough: nothing is built or imported).
#
#   bash bench/wheels.sh            # -> bench/out/gpu_site.tar.xz, about 48 MiB (a few minutes: xz on every core)
#
# The GPU machine has python 3.12, torch 2.11 with triton 3.6, transformers 5.17, einops, numpy, tqdm and nvcc, and
# no network. The archive brings the rest, as cp312 manylinux wheels installed into one folder with --no-deps (the
# machine has the rest): fla-core (the Gated DeltaNet's kernels), tilelang and what it needs beyond the machine's
# (its backend for fla's guarded backward kernel), flash-qla (whole-layer TileLang kernels, an fla backend) and
# transformers 5.24 (5.17 lacks the activation checkpointing bench.py uses). Command-line tools
# (bin/: z3's 22 MB binary) are dropped: nothing imports them. bench/gpu.sh unpacks it into /tmp/pace_site and puts
# that on PYTHONPATH; the device call carries it (carry: bench/out/gpu_site.tar.xz).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
ARCHIVE=$OUT/gpu_site.tar.xz
LIMIT_MIB=64
PACKAGES=(
  fla-core==0.6.0 flash-qla==0.1.3 transformers==5.24.0
  tilelang==0.1.15 "apache-tvm-ffi>=0.1.11,<0.1.13" torch-c-dlpack-ext cloudpickle ml-dtypes psutil
  "z3-solver>=4.13.0,<4.15.5"   # tilelang's dependencies the machine lacks
)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux2010_x86_64)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
echo "wheels: downloading ${#PACKAGES[@]} packages for CPython 3.12 on x86_64 Linux"
python -m pip download --quiet --disable-pip-version-check --no-deps "${TARGET[@]}" -d "$WORK/wheels" "${PACKAGES[@]}"
ls -l "$WORK/wheels" | awk 'NR > 1 {printf "  %6.1f MB  %s\n", $5 / 1e6, $9}'
python -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile "${TARGET[@]}" \
  --target "$WORK/site" "$WORK"/wheels/*.whl
rm -rf "$WORK/site/bin"
echo "wheels: $(du -sm "$WORK/site" | cut -f1) MB installed; packing with xz"
tar -C "$WORK/site" -cf - . | xz -T0 -6 > "$ARCHIVE"
size=$(stat -c %s "$ARCHIVE")
echo "wheels: $ARCHIVE, $((size / 1048576)) MiB (a device call carries at most $LIMIT_MIB MiB)"
if [ "$size" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "wheels: over $LIMIT_MIB MiB: drop a package above (flash-qla) or split the archive" >&2
  exit 1
fi
