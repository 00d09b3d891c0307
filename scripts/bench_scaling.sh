#!/bin/bash
# Scaling figures on 2 GPUs, each layout against 1 GPU in the same run: DP2 on the 1b shape
# (same micro-batch per GPU; plain, and with the distributed optimizer at two bucket sizes, with
# fewer CTAs for the reductions that overlap backward, and with the reduction in bf16), and
# TP2 with SP, PP2 1F1B and PP2 interleaved (vpp 2) on the 7b-layers shape
# (same global batch of 16 sequences, 8 micro-batches of 2 through the pipeline; vpp2 also with
# the transfers in bf16, and both pipelines with the transfers overlapped, parallel.pp_overlap).
# Prints tokens/s per GPU, efficiency against 1 GPU, MFU, peak memory, the step split and the
# pipeline bubble (measured: mean over ranks and on the busiest stage; and theoretical), all
# read from each run's metrics report.
#   scripts/bench_scaling.sh [BIN_DIR (default build)] [STEPS (default 8)]
# The 1b runs take 30 steps (about 0.13 s each), the 7b-layers runs STEPS (16 sequences of 4096
# each, about 0.75 s on 2 GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}; steps=${2:-8}
out=runs/scaling; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (shared machines)
# --bind-to none: for np <= 2 Open MPI binds each rank to one core, leaving OpenMP one thread (README)
mpi="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
run() {  # name np config overrides...
  local name=$1 np=$2 config=$3 n=$steps; shift 3
  [ "$config" = 1b ] && n=30
  echo "== $name: $np GPU(s), $config $*"
  $mpi -np "$np" "$bin/trainer" "configs/$config.yaml" train.device=cuda "train.steps=$n" train.warmup_steps=1 \
    log.every=1 "log.metrics=$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1 < /dev/null || { tail -5 "$out/$name.log"; return 0; }
  grep -E "run report|step time" "$out/$name.log" || true
}
run 1b_1gpu 1 1b
run 1b_dp2 2 1b parallel.dp=2 train.global_batch=8
zero="parallel.dp=2 train.global_batch=8 parallel.distributed_optimizer=true"
run 1b_zero_b25 2 1b $zero parallel.bucket_mb=25
run 1b_zero_b100 2 1b $zero parallel.bucket_mb=100
run 1b_zero_b100_c16 2 1b $zero parallel.bucket_mb=100 parallel.dp_overlap_ctas=16
run 1b_zero_b100_bf16 2 1b $zero parallel.bucket_mb=100 parallel.grad_reduce_bf16=true
run 1b_zero_b100_c16_bf16 2 1b $zero parallel.bucket_mb=100 parallel.dp_overlap_ctas=16 parallel.grad_reduce_bf16=true
run 7b_1gpu 1 7b_layers train.global_batch=16
run 7b_tp2_sp 2 7b_layers parallel.tp=2 parallel.sequence_parallel=true train.global_batch=16
run 7b_pp2_1f1b 2 7b_layers parallel.pp=2 train.global_batch=16
run 7b_pp2_vpp2 2 7b_layers parallel.pp=2 parallel.vpp=2 train.global_batch=16
run 7b_pp2_vpp2_bf16 2 7b_layers parallel.pp=2 parallel.vpp=2 parallel.pp_comm_bf16=true train.global_batch=16
run 7b_pp2_1f1b_ovl 2 7b_layers parallel.pp=2 parallel.pp_overlap=true train.global_batch=16
run 7b_pp2_vpp2_ovl 2 7b_layers parallel.pp=2 parallel.vpp=2 parallel.pp_overlap=true train.global_batch=16
run 7b_pp2_vpp2_ovl_bf16 2 7b_layers parallel.pp=2 parallel.vpp=2 parallel.pp_overlap=true parallel.pp_comm_bf16=true \
  train.global_batch=16
# The last stage also runs the head and loss: 5 layers on the first stage, 3 on the last.
run 7b_pp2_last3 2 7b_layers parallel.pp=2 parallel.last_stage_layers=3 train.global_batch=16
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def report(name):
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path): return None
    rows = [json.loads(l) for l in open(path)]
    rep = [r for r in rows if r.get("report")]
    return rep[0] if rep else None
print(f"\n{'run':22s} {'tok/s/GPU':>10s} {'vs 1 GPU':>8s} {'MFU':>6s} {'mem GiB':>8s} {'exposed comm':>12s} "
      f"{'bubble mean':>11s} {'busiest':>7s} {'theory':>7s}   step split (ms)")
for base, names in (("1b_1gpu", ["1b_1gpu", "1b_dp2", "1b_zero_b25", "1b_zero_b100", "1b_zero_b100_c16",
                                 "1b_zero_b100_bf16", "1b_zero_b100_c16_bf16"]),
                    ("7b_1gpu", ["7b_1gpu", "7b_tp2_sp", "7b_pp2_1f1b", "7b_pp2_vpp2", "7b_pp2_vpp2_bf16",
                                 "7b_pp2_1f1b_ovl", "7b_pp2_vpp2_ovl", "7b_pp2_vpp2_ovl_bf16", "7b_pp2_last3"])):
    b = report(base)
    for n in names:
        r = report(n)
        if r is None:
            print(f"{n:22s} (no report: see {out}/{n}.log)"); continue
        eff = f"{100 * r['tokens_per_s_per_rank'] / b['tokens_per_s_per_rank']:7.1f}%" if b else "      -"
        split = " ".join(f"{k} {v:.1f}" for k, v in r["step_ms"].items())
        bub = (f"{r['bubble_pct']:10.1f}% {r['bubble_busiest_pct']:6.1f}%" if r.get("bubble_pct") is not None
               else f"{'-':>11s} {'-':>7s}")
        th = f"{r['bubble_theory_pct']:6.1f}%" if r.get("bubble_theory_pct") is not None else "      -"
        print(f"{n:22s} {r['tokens_per_s_per_rank']:10.0f} {eff:>8s} {100 * r.get('mfu', 0):5.1f}% "
              f"{r['peak_mem_gib']:8.1f} {r['exposed_comm_pct']:11.1f}% {bub} {th}   {split}")
PY
