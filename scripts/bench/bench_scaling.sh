#!/bin/bash
# Scaling figures on 2 GPUs, each layout against 1 GPU in the same call, as two studies
# (scripts/study/study.py):
#  - configs/studies/scaling_2gpu_1b.yaml: DP2 on the 1b shape (same micro-batch per GPU; plain,
#    and with the distributed optimizer at two bucket sizes, with fewer CTAs for the reductions
#    that overlap backward, and with the reduction in bf16), 30 steps each;
#  - configs/studies/scaling_2gpu_7b_layers.yaml: TP2 with SP, PP2 1F1B and PP2 interleaved
#    (vpp 2) on the 7b-layers shape (same global batch of 16 sequences, 8 micro-batches of 2
#    through the pipeline; vpp2 also with the transfers in bf16, both pipelines with the
#    transfers overlapped, parallel.pp_overlap, and 3 of the 8 layers on the last stage),
#    STEPS steps each (16 sequences of 4096, about 0.75 s a step on 2 GPUs).
# Each prints tokens/s per GPU, efficiency against 1 GPU, MFU, peak memory, the step split and
# the pipeline bubble (measured: mean over ranks and on the busiest stage; and theoretical), and
# writes its report (report.md, report.json, plots) under runs/scaling/1b and runs/scaling/7b_layers.
#   scripts/bench/bench_scaling.sh [BIN_DIR (default build)] [STEPS (default 8)]
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}; steps=${2:-8}
study=(python3 scripts/study/study.py --trainer "$bin/trainer")
rc=0
"${study[@]}" configs/studies/scaling_2gpu_1b.yaml --out runs/scaling/1b < /dev/null || rc=1
"${study[@]}" configs/studies/scaling_2gpu_7b_layers.yaml --out runs/scaling/7b_layers --steps "$steps" \
  --warmup $((steps > 4 ? 2 : steps > 1 ? 1 : 0)) < /dev/null || rc=1
exit "$rc"
