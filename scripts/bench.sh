#!/bin/bash
# Throughput benchmark on one GPU: the trainer on the 124m, 1b and 7b-layers shapes, then the
# PyTorch baseline of the same model (eager and torch.compile) in the same run, on the same GPU.
#   scripts/bench.sh [BIN_DIR (default build)] [STEPS (default 12)] [extra trainer overrides]
# BENCH_TORCH=compile|eager|both|none picks the PyTorch modes (default both).
# Trainer figures are the mean over the steps after the first two (warm-up excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}; steps=${2:-12}; shift $(( $# > 2 ? 2 : $# ))
mkdir -p runs/bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
for shape in 124m 1b 7b_layers; do
  "$bin/trainer" "configs/$shape.yaml" "train.steps=$steps" train.warmup_steps=1 log.every=1 \
    "log.metrics=runs/bench/$shape.jsonl" "$@" > "runs/bench/$shape.log" 2>&1 || { tail -5 "runs/bench/$shape.log"; continue; }
  python3 - "$shape" "runs/bench/$shape.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
steps = [r for r in rows if "step" in r and r["step"] > 2]
rep = [r for r in rows if r.get("report")][0]
tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
tf = sum(r["tflops_per_rank"] for r in steps) / len(steps)
mfu = sum(r.get("mfu", 0) for r in steps) / len(steps)
print(f"trainer {sys.argv[1]:10s} {tps:12.0f} tok/s  {tf:7.1f} TFLOP/s  MFU {100 * mfu:5.1f}%  "
      f"peak mem {rep['peak_mem_gib']:6.1f} GiB  loss {steps[-1]['loss']:.3f}")
PY
done
mode=${BENCH_TORCH:-both}
[ "$mode" = none ] || python3 scripts/bench_torch.py --shape all --mode "$mode" --steps 10 --warmup 3
