#!/bin/bash
# Issue 6 in one call on an 8-GPU host:
#  1. the five 8-GPU layouts of the 7B model (configs/7b_tp2_dp4, 7b_tp2_pp2_dp2, 7b_tp4_dp2,
#     7b_dp8_distopt, 7b_pp4_vpp2), STEPS steps each on the same data and seed, no checkpoints;
#     each loss curve against tp2 dp4's (bf16 tolerance, TRAINER_VALIDATE_RTOL, default 2e-2),
#     the loss falling, and each run's tokens/s per GPU, MFU, exposed communication, pipeline
#     bubble and peak memory per rank;
#  2. commbench over the 8 GPUs (NCCL, f32, 8 B to 1 GiB);
#  3. DP weak scaling on the 1b shape, 1 -> 2 -> 4 -> 8 GPUs, with the distributed optimizer
#     and the micro-batch of one GPU on every GPU.
# Logs and metrics under runs/validate8; the summary ends with issue 6's targets (7B MFU >= 55%
# on the best layout, DP weak scaling at 8 GPUs >= 95%). Exits non-zero when a run fails, a
# curve disagrees or a loss does not fall.
#   scripts/validate_8gpu.sh [BIN_DIR (default build)] [STEPS (default 50)] [PART ...]
# PARTs (default: all) run a share of it where one command may not take the whole (about 10
# minutes on 8 H200s): layout names, `commbench`, `weak`; the summary then covers every run
# found under the log folder, and `summary` alone runs nothing and needs them all, e.g.
#   validate_8gpu.sh .gpu 50 7b_tp2_dp4 7b_tp2_pp2_dp2 7b_tp4_dp2
#   validate_8gpu.sh .gpu 50 7b_dp8_distopt 7b_pp4_vpp2 commbench weak
#   validate_8gpu.sh .gpu 50 summary
# TRAINER_VALIDATE_CPU=1 runs the same layouts on 8 CPU ranks with a tiny model of the same
# layout rules (6 steps by default): it checks this script and the layouts, not the figures
# (tests/test_validate_8gpu.sh). TRAINER_VALIDATE_SHARED=1 runs that tiny model on the GPUs of
# a host with fewer than 8, the 8 ranks sharing them over the staged MPI communicator
# (parallel.gpu_comm=mpi): the CUDA backend under the 8-GPU layouts, again not the figures.
# TRAINER_VALIDATE_OUT moves the logs, TRAINER_VALIDATE_DATA sets data.train for every run.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}
layouts="7b_tp2_dp4 7b_tp2_pp2_dp2 7b_tp4_dp2 7b_dp8_distopt 7b_pp4_vpp2"
parts=" ${*:3} "; [ "$parts" = "  " ] && parts=" $layouts commbench weak "
for p in $parts; do
  case " $layouts commbench weak summary " in *" $p "*) ;; *)
    echo "validate_8gpu.sh: unknown part '$p'; parts are: $layouts commbench weak summary" >&2; exit 2;; esac
done
want() { case "$parts" in *" $1 "*) return 0;; *) return 1;; esac; }
out=${TRAINER_VALIDATE_OUT:-runs/validate8}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (shared machines)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
# --bind-to none: Open MPI would otherwise bind small jobs' ranks to one core each (README)
mpi="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
small=()
[ -n "${TRAINER_VALIDATE_DATA:-}" ] && small=("data.train=$TRAINER_VALIDATE_DATA")
tiny=0
[ "${TRAINER_VALIDATE_CPU:-0}" = 1 ] && tiny=1 && small+=(train.device=cpu)
[ "${TRAINER_VALIDATE_SHARED:-0}" = 1 ] && tiny=1 && small+=(train.device=cuda parallel.gpu_comm=mpi)
if [ "$tiny" = 1 ]; then
  steps=${2:-6}
  export OMP_NUM_THREADS=1
  mpi="$mpi --oversubscribe -x OMP_NUM_THREADS ${TRAINER_MPIRUN_ARGS:-}"
  small+=(train.warmup_steps=1 model.dim=64 model.n_layers=8 model.n_heads=4 model.n_kv_heads=4 model.ffn_dim=128
         model.vocab_size=256 model.seq_len=32)
else
  steps=${2:-50}
fi
failed=0
run() {  # name np config overrides...
  local name=$1 np=$2 config=$3; shift 3
  echo "== $name: $np ranks, $config $*"
  if ! $mpi -np "$np" "$bin/trainer" "configs/$config.yaml" "train.steps=$steps" log.every=1 checkpoint.dir= \
      data.val= "log.metrics=$out/$name.jsonl" "${small[@]}" "$@" > "$out/$name.log" 2>&1 < /dev/null; then
    tail -5 "$out/$name.log"
    failed=1
  fi
}
# configs/7b_tp2_dp4.yaml is laid out for 16 GPUs (tp2 pp2 dp4, two nodes); on 8 it runs as the
# 8-GPU tp2 dp4 layout: no pipeline, micro-batches of 2.
on8() { [ "$1" = 7b_tp2_dp4 ] && echo parallel.pp=1 parallel.vpp=1 train.micro_batch=2; }
for l in $layouts; do want "$l" && run "$l" 8 "$l" $(on8 "$l"); done
if want commbench && [ -x "$bin/commbench" ]; then
  echo "== commbench on 8 ranks"
  if [ "$tiny" = 1 ]; then cb=(--backend mpi --max-bytes 65536); else cb=(--max-bytes 1073741824); fi
  $mpi -np 8 "$bin/commbench" "${cb[@]}" > "$out/commbench.txt" 2>&1 < /dev/null || { tail -5 "$out/commbench.txt"; failed=1; }
fi
[ -f "$out/commbench.txt" ] && { want commbench || want summary; } &&
  grep -E "^(op|all_reduce|all_gather|reduce_scatter|broadcast|sendrecv|all_to_all) " "$out/commbench.txt" | tail -12
for n in 1 2 4 8; do
  want weak && run "1b_dp$n" "$n" 1b "parallel.dp=$n" "train.global_batch=$((4 * n))" train.micro_batch=4 \
    parallel.distributed_optimizer=true train.warmup_steps=1
done
python3 - "$out" "${TRAINER_VALIDATE_RTOL:-2e-2}" "$layouts" "$parts" <<'PY' || failed=1
import json, os, sys
out, rtol, layouts, parts = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
# A run missing from the log folder fails the summary only if this call ran it or asked for
# the whole summary; otherwise it belongs to another call.
def needed(part): return part in parts or "summary" in parts
def read(name):
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path): return None, None
    rows = [json.loads(l) for l in open(path)]
    steps = {r["step"]: r["loss"] for r in rows if "step" in r and "loss" in r}
    rep = [r for r in rows if r.get("report")]
    return steps, (rep[0] if rep else None)
bad = 0
ref, _ = read(layouts[0])
print(f"\n{'layout':16s} {'tok/s/GPU':>10s} {'MFU':>6s} {'mem GiB':>8s} {'exposed':>8s} {'bubble':>7s} "
      f"{'theory':>7s} {'loss first -> last':>20s} {'worst rel. diff to ' + layouts[0]:>30s}")
best_mfu = 0.0
for l in layouts:
    loss, r = read(l)
    if not loss or r is None:
        if needed(l): print(f"{l:16s} (no report: see {out}/{l}.log)"); bad = 1
        else: print(f"{l:16s} (not run yet)")
        continue
    worst = max((abs(loss[s] - ref[s]) / abs(ref[s]) for s in loss if ref and s in ref), default=float("nan"))
    first, last = loss[min(loss)], loss[max(loss)]
    falling = last < first
    # Without the reference run (another call's part) the curve is compared by `summary` later.
    ok = falling and (worst <= rtol or (not ref and not needed(layouts[0])))
    bad |= not ok
    best_mfu = max(best_mfu, r.get("mfu") or 0.0)
    bub = f"{r['bubble_pct']:6.1f}%" if r.get("bubble_pct") is not None else "      -"
    th = f"{r['bubble_theory_pct']:6.1f}%" if r.get("bubble_theory_pct") is not None else "      -"
    print(f"{l:16s} {r['tokens_per_s_per_rank']:10.0f} {100 * (r.get('mfu') or 0):5.1f}% {r['peak_mem_gib']:8.1f} "
          f"{r['exposed_comm_pct']:7.1f}% {bub} {th} {first:9.4f} -> {last:8.4f} {worst:29.2e}"
          f"{'' if ok else '  <- ' + ('loss not falling' if not falling else 'curve differs')}")
print(f"\n{'1b, dp with ZeRO':16s} {'tok/s/GPU':>10s} {'weak scaling':>13s}")
base = None
eff8 = None
for n in (1, 2, 4, 8):
    _, r = read(f"1b_dp{n}")
    if r is None:
        if needed("weak"): print(f"{n:2d} GPU(s)        (no report: see {out}/1b_dp{n}.log)"); bad = 1
        else: print(f"{n:2d} GPU(s)        (not run yet)")
        continue
    t = r["tokens_per_s_per_rank"]
    base = base or (t if n == 1 else None)
    eff = 100 * t / base if base else float("nan")
    if n == 8: eff8 = eff
    print(f"{n:2d} GPU(s)         {t:10.0f} {eff:12.1f}%")
print(f"\ntargets: best 7B MFU {100 * best_mfu:.1f}% (>= 55%), DP weak scaling at 8 GPUs "
      f"{eff8 if eff8 is not None else float('nan'):.1f}% (>= 95%); curves within {rtol:g} of {layouts[0]}")
sys.exit(bad)
PY
[ "$failed" = 0 ] && echo "validate_8gpu: all runs finished and the curves agree" || echo "validate_8gpu: FAILED (see above)"
exit "$failed"
