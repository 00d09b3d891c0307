#!/bin/bash
# Where a training step's GPU time goes, kernel by kernel, with Nsight Compute (ncu): trains
# STEPS steps of CONFIG on one GPU with every kernel timed (gpu__time_duration, kernels run one
# at a time, caches and clocks left alone), then prints the kernels summed by name per step,
# largest first, with their share of the step's kernel time. Serialised kernels hide nothing
# behind each other, so the sum is an upper bound of the step's GPU time; use it to see which
# kernels matter, and scripts/bench/bench.sh for throughput.
#   scripts/profile/profile_kernels.sh [BIN_DIR (default build)] [CONFIG (default configs/124m.yaml)] [STEPS (default 2)] [overrides]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}; config=${2:-configs/124m.yaml}; steps=${3:-2}; shift $(( $# > 3 ? 3 : $# ))
out=runs/profile; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (shared machines)
name=$(basename "$config" .yaml)
# --bind-to none: for np <= 2 Open MPI binds each rank to one core, leaving OpenMP one thread (README)
mpirun --allow-run-as-root --bind-to none -np 1 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE \
  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$bin/trainer" "$config" train.device=cuda "train.steps=$steps" train.warmup_steps=1 log.every=1 checkpoint.dir= \
  log.metrics= data.val= "$@" < /dev/null > "$out/$name.csv" 2> "$out/$name.err" || { tail -5 "$out/$name.err"; exit 1; }
python3 - "$out/$name.csv" "$steps" <<'PY'
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]  # the trainer's own output is not quoted
t, n = collections.defaultdict(float), collections.Counter()
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    k = r["Kernel Name"].split("(")[0][:90]
    t[k] += float(r["Metric Value"].replace(",", "")); n[k] += 1
steps = int(sys.argv[2]); total = sum(t.values())
print(f"{len(t)} kernels, {sum(n.values())} launches, {total / steps / 1e6:.2f} ms of kernel time per step (mean of {steps} steps)")
print(f"{'ms/step':>9s} {'share':>6s} {'calls/step':>10s}  kernel")
for k, v in sorted(t.items(), key=lambda kv: -kv[1])[:30]:
    print(f"{v / steps / 1e6:9.3f} {100 * v / total:5.1f}% {n[k] / steps:10.1f}  {k}")
PY
