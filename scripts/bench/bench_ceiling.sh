#!/bin/bash
# The GEMM + attention floor of a training step on one GPU for the 124m, 1b and 7b-layers shapes:
# each GEMM and attention call of one layer and of the head timed through the CUDA backend, the
# sum as a step-time floor, and the tokens/s and MFU ceilings it gives (scripts/bench/bench_ceiling.c);
# then, for 7b-layers, what splitting the GEMMs of tp 2, 4 and 8 into row blocks (SP overlap) costs.
# With `fp8`, instead: for each shape the layer's four projections in all three roles as bf16
# GEMMs and as FP8 GEMMs (gemm_fp8), the FP8 casts, and the layer's totals both ways.
#   scripts/bench/bench_ceiling.sh [BIN_DIR (default build)] [fp8]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}
mode=${2:-}
if [ -n "$mode" ] && [ "$mode" != fp8 ]; then
  echo "usage: scripts/bench/bench_ceiling.sh [BIN_DIR] [fp8]" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (shared machines)
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}  # one GPU
if [ "$mode" = fp8 ]; then
  for shape in 124m 1b 7b-layers; do
    echo "== $shape, FP8 against bf16"
    "$bin/bench_ceiling" "$shape" fp8
  done
  exit 0
fi
for shape in 124m 1b 7b-layers; do
  echo "== $shape"
  "$bin/bench_ceiling" "$shape"
done
for tp in tp2 tp4 tp8; do
  echo "== 7b-layers, the GEMMs $tp with SP splits by rows"
  "$bin/bench_ceiling" 7b-layers $tp
done
