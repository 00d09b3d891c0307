#!/bin/bash
# Where a training step's wall time goes on the GPU, as it ran: trains STEPS steps of CONFIG on
# one GPU with a CUPTI recorder loaded (scripts/profile/timeline/cupti_timeline.c, built as
# libcupti_timeline.so beside the trainer), then prints the GPU's busy and idle time per step,
# the idle gaps by what surrounds them and the host call running meanwhile, and every kernel's
# time as it ran (scripts/profile/timeline/summary.py). Unlike scripts/profile/profile_kernels.sh (Nsight
# Compute, kernels replayed one at a time), nothing is serialised, so idle time shows.
#   scripts/profile/profile_timeline.sh [BIN_DIR (default build)] [CONFIG (default configs/1b.yaml)] [STEPS (default 6)] [overrides]
# NP=N runs N ranks, one GPU each, under mpirun (MPIRUN, default mpirun): each rank writes its own
# timeline (.rankR), and rank 0's is summarised, its collectives' kernels set beside the rest.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}; config=${2:-configs/1b.yaml}; steps=${3:-6}; shift $(( $# > 3 ? 3 : $# ))
lib=$(cd "$bin" && pwd)/libcupti_timeline.so
[ -f "$lib" ] || { echo "profile_timeline.sh: $lib not found (built with the CUDA toolkit's CUPTI)" >&2; exit 2; }
out=runs/profile; mkdir -p "$out"
name=$(basename "$config" .yaml)
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (shared machines)
np=${NP:-1}
launch=()
[ "$np" -gt 1 ] && launch=("${MPIRUN:-mpirun}" --allow-run-as-root --bind-to none -np "$np" -x LD_LIBRARY_PATH
  -x NCCL_NVLS_ENABLE -x CUDA_INJECTION64_PATH -x TRAINER_TIMELINE_OUT)
export CUDA_INJECTION64_PATH=$lib TRAINER_TIMELINE_OUT=$out/$name.timeline.csv
"${launch[@]}" "$bin/trainer" "$config" train.device=cuda "train.steps=$steps" train.warmup_steps=1 log.every=1 \
  checkpoint.dir= log.metrics= data.val= "$@" < /dev/null > "$out/$name.timeline.log" 2>&1 \
  || { tail -5 "$out/$name.timeline.log"; exit 1; }
unset CUDA_INJECTION64_PATH
grep -E "run report|step time" "$out/$name.timeline.log" || true
csv=$out/$name.timeline.csv
[ "$np" -gt 1 ] && csv=$csv.rank0
python3 scripts/profile/timeline/summary.py "$csv"
