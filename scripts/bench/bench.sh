#!/bin/bash
# Throughput benchmark on one GPU: the trainer on the 124m, 1b and 7b-layers shapes in each
# precision asked for, then the PyTorch baseline of the same model (eager, torch.compile, and
# torch.compile with FP8 linears) in the same run, on the same GPU.
#   scripts/bench/bench.sh [BIN_DIR (default build)] [STEPS (default 12)] [extra trainer overrides]
# BENCH_PRECISION="bf16 fp8" picks the trainer's train.precision values (default bf16);
# BENCH_TORCH the PyTorch modes: none, both (eager and compile, the default), or a comma list of
# eager, compile, compile_fp8; BENCH_SHAPES="124m 1b 7b_layers" the shapes.
# Trainer figures are the mean over the steps after the first two (warm-up excluded).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}; steps=${2:-12}; shift $(( $# > 2 ? 2 : $# ))
mkdir -p runs/bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
for shape in ${BENCH_SHAPES:-124m 1b 7b_layers}; do
  for prec in ${BENCH_PRECISION:-bf16}; do
    name=${shape}_$prec
    "$bin/trainer" "configs/$shape.yaml" "train.steps=$steps" train.warmup_steps=1 log.every=1 \
      "train.precision=$prec" "log.metrics=runs/bench/$name.jsonl" "$@" > "runs/bench/$name.log" 2>&1 ||
      { tail -5 "runs/bench/$name.log"; continue; }
    python3 - "$shape" "$prec" "runs/bench/$name.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[3])]
steps = [r for r in rows if "step" in r and r["step"] > 2]
rep = [r for r in rows if r.get("report")][0]
tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
tf = sum(r["tflops_per_rank"] for r in steps) / len(steps)
mfu = sum(r.get("mfu", 0) for r in steps) / len(steps)
print(f"trainer {sys.argv[1]:10s} {sys.argv[2]:5s} {tps:12.0f} tok/s  {tf:7.1f} TFLOP/s  MFU {100 * mfu:5.1f}%  "
      f"peak mem {rep['peak_mem_gib']:6.1f} GiB  loss {steps[-1]['loss']:.3f}")
PY
  done
done
mode=${BENCH_TORCH:-both}
shapes=$(echo "${BENCH_SHAPES:-124m 1b 7b_layers}" | tr _ -)
if [ "$mode" != none ]; then
  for s in $shapes; do python3 scripts/bench/bench_torch.py --shape "$s" --mode "$mode" --steps 10 --warmup 3; done
fi
