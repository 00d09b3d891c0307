#!/bin/bash
# Optimizer state in host memory on one GPU, beside the on-GPU optimizer in the same run: the 1b
# shape without offload and with each engine (optimizer.offload_update cpu and gpu), with 8
# micro-batches of accumulation and with 1 (the cpu engine also with its whole update before the
# next step, optimizer.offload_layer_wait=false, and delayed), then the full 7B shape
# (configs/7b.yaml), which fits only with offload, with each engine. Prints tokens/s, MFU, the
# step split (compute; exposed optimizer time, which with offload holds the exposed copies and
# host update, and with the layer wait the host's time in the update inside forward:
# parallel/comm/timing.h) and peak device memory, as means over the steps after the first two.
#   scripts/bench/bench_offload.sh [BIN_DIR (default build)] [STEPS (default 10)] [extra trainer overrides]
# OMP_NUM_THREADS sets the cores of the cpu engine's AdamW (default: all of the host's);
# BENCH_OFFLOAD_SHAPES="1b 7b" the shapes (default both).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}; steps=${2:-10}; shift $(( $# > 2 ? 2 : $# ))
mkdir -p runs/bench_offload
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
echo "host: $(nproc) cores, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, $(grep MemAvailable /proc/meminfo)"
one() {  # NAME CONFIG overrides...
  local name=$1 config=$2
  shift 2
  "$bin/trainer" "$config" "train.steps=$steps" train.warmup_steps=1 log.every=1 checkpoint.dir= \
    "log.metrics=runs/bench_offload/$name.jsonl" "$@" > "runs/bench_offload/$name.log" 2>&1 ||
    { echo "$name: failed: $(grep -m1 error "runs/bench_offload/$name.log" || tail -1 "runs/bench_offload/$name.log")"; return 0; }
  python3 - "$name" "runs/bench_offload/$name.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
st = [r for r in rows if "step" in r and r["step"] > 2]
mean = lambda k: sum(r.get(k, 0) for r in st) / len(st)
print(f"{sys.argv[1]:24s} {mean('tokens_per_s'):10.0f} tok/s  MFU {100 * mean('mfu'):5.1f}%  step {mean('ms_per_step'):9.1f} ms"
      f" = compute {mean('ms_compute'):9.1f} + optimizer {mean('ms_optimizer'):8.1f} + other"
      f"  peak {max(r['mem_gib'] for r in st):5.1f} GiB")
PY
}
shapes=" ${BENCH_OFFLOAD_SHAPES:-1b 7b} "
for n_micro in 8 1; do
  [[ $shapes == *" 1b "* ]] || break
  batch="train.global_batch=$((4 * n_micro)) train.micro_batch=4"
  # shellcheck disable=SC2086
  one "1b_micro${n_micro}_gpu_optimizer" configs/1b.yaml $batch optimizer.offload=none "$@"
  for engine in cpu gpu; do
    # shellcheck disable=SC2086
    one "1b_micro${n_micro}_offload_$engine" configs/1b.yaml $batch optimizer.offload=host \
      "optimizer.offload_update=$engine" "$@"
  done
  # shellcheck disable=SC2086
  one "1b_micro${n_micro}_offload_cpu_whole_update" configs/1b.yaml $batch optimizer.offload=host \
    optimizer.offload_layer_wait=false "$@"
  # shellcheck disable=SC2086
  one "1b_micro${n_micro}_offload_cpu_delay" configs/1b.yaml $batch optimizer.offload=host optimizer.offload_delay=1 "$@"
done
[[ $shapes == *" 7b "* ]] || exit 0
for engine in cpu gpu; do one "7b_offload_$engine" configs/7b.yaml "optimizer.offload_update=$engine" "$@"; done
one "7b_no_offload" configs/7b.yaml optimizer.offload=none "$@"
