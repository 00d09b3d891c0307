#!/bin/bash
# The 8-GPU validation in one call on an 8-GPU host, as two studies (scripts/study/study.py) and
# commbench:
#  1. the five 8-GPU layouts of the 7B model (configs/studies/7b_layouts_8gpu.yaml: configs/7b_tp2_dp4,
#     7b_tp2_pp2_dp2, 7b_tp4_dp2, 7b_dp8_distopt, 7b_pp4_vpp2), STEPS steps each on the same data
#     and seed, no checkpoints; each loss curve against tp2 dp4's (bf16 tolerance,
#     TRAINER_VALIDATE_RTOL, default 2e-2), the loss falling, and each run's tokens/s per GPU, MFU,
#     exposed communication, pipeline bubble and peak memory per rank;
#  2. commbench over the 8 GPUs (NCCL, f32, 8 B to 1 GiB);
#  3. DP weak scaling on the 1b shape, 1 -> 2 -> 4 -> 8 GPUs, with the distributed optimizer
#     and the micro-batch of one GPU on every GPU (configs/studies/dp_weak_1b.yaml).
# Logs, metrics and the layouts' report (report.md, report.json, plots) under runs/validate8, the
# weak-scaling study's under runs/validate8/weak; the summary ends with the targets (7B MFU >= 55%
# on the best layout, DP weak scaling at 8 GPUs >= 95%). Exits non-zero when a run fails, a
# curve disagrees or a loss does not fall.
#   scripts/validate/validate_8gpu.sh [BIN_DIR (default build)] [STEPS (default 50)] [PART ...]
# PARTs (default: all) run a share of it where one command may not take the whole (about 10
# minutes on 8 H200s): layout names, `commbench`, `weak`; the summary then covers every run
# found under the log folder, and `summary` alone runs nothing and needs them all, e.g.
#   validate_8gpu.sh .gpu 50 7b_tp2_dp4 7b_tp2_pp2_dp2 7b_tp4_dp2
#   validate_8gpu.sh .gpu 50 7b_dp8_distopt 7b_pp4_vpp2 commbench weak
#   validate_8gpu.sh .gpu 50 summary
# TRAINER_VALIDATE_CPU=1 runs the same layouts on 8 CPU ranks with a tiny model of the same
# layout rules (6 steps by default): it checks this script and the layouts, not the figures
# (tests/e2e/test_validate_8gpu.sh). TRAINER_VALIDATE_SHARED=1 runs that tiny model on the GPUs of
# a host with fewer than 8, the 8 ranks sharing them over the staged MPI communicator
# (parallel.gpu_comm=mpi): the CUDA backend under the 8-GPU layouts, again not the figures.
# TRAINER_VALIDATE_OUT moves the logs, TRAINER_VALIDATE_DATA sets data.train for every run.
set -uo pipefail
cd "$(dirname "$0")/../.."
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
# --bind-to none: Open MPI would otherwise bind small jobs' ranks to one core each (README)
mpi="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
study=(python3 scripts/study/study.py --trainer "$bin/trainer")
small=()
[ -n "${TRAINER_VALIDATE_DATA:-}" ] && small=("data.train=$TRAINER_VALIDATE_DATA")
tiny=0
[ "${TRAINER_VALIDATE_CPU:-0}" = 1 ] && tiny=1 && small+=(train.device=cpu)
[ "${TRAINER_VALIDATE_SHARED:-0}" = 1 ] && tiny=1 && small+=(train.device=cuda parallel.gpu_comm=mpi)
if [ "$tiny" = 1 ]; then
  steps=${2:-6}
  export OMP_NUM_THREADS=1
  mpi="$mpi --oversubscribe -x OMP_NUM_THREADS ${TRAINER_MPIRUN_ARGS:-}"
  study+=(--warmup 1 --env OMP_NUM_THREADS=1 "--mpirun-args=--oversubscribe ${TRAINER_MPIRUN_ARGS:-}")
  small+=(train.warmup_steps=1 model.dim=64 model.n_layers=8 model.n_heads=4 model.n_kv_heads=4 model.ffn_dim=128
         model.vocab_size=256 model.seq_len=32)
else
  steps=${2:-50}
fi
study+=(--steps "$steps")
for kv in "${small[@]}"; do study+=(--set "$kv"); done
failed=0
only=(); for l in $layouts; do want "$l" && only+=("$l"); done
if [ ${#only[@]} -gt 0 ]; then
  "${study[@]}" configs/studies/7b_layouts_8gpu.yaml --out "$out" --loss-rtol "${TRAINER_VALIDATE_RTOL:-2e-2}" \
    --only "${only[@]}" < /dev/null || failed=1
fi
if want commbench && [ -x "$bin/commbench" ]; then
  echo "== commbench on 8 ranks"
  if [ "$tiny" = 1 ]; then cb=(--backend mpi --max-bytes 65536); else cb=(--max-bytes 1073741824); fi
  $mpi -np 8 "$bin/commbench" "${cb[@]}" > "$out/commbench.txt" 2>&1 < /dev/null || { tail -5 "$out/commbench.txt"; failed=1; }
fi
[ -f "$out/commbench.txt" ] && { want commbench || want summary; } &&
  grep -E "^(op|all_reduce|all_gather|reduce_scatter|broadcast|sendrecv|all_to_all) " "$out/commbench.txt" | tail -12
if want weak; then
  "${study[@]}" configs/studies/dp_weak_1b.yaml --out "$out/weak" < /dev/null || failed=1
fi
if want summary; then  # every run must be there: the studies' reports from all of them
  for d in "$out" "$out/weak"; do
    python3 scripts/study/study.py --collect "$d" > "$d/collect.txt" 2>&1 ||
      { grep -E "^study|FAIL|error" "$d/collect.txt"; failed=1; }
  done
fi
# The summary in one table per part, from the studies' report.json.
python3 - "$out" "$layouts" <<'PY'
import json, os, sys
out, layouts = sys.argv[1], sys.argv[2].split()
def variants(folder):
    try:
        return {v["name"]: v for v in json.load(open(os.path.join(folder, "report.json")))["variants"]}
    except (OSError, ValueError):
        return {}
def fig(v, k):
    return (v["figures"].get(k) or {}).get("value")
def missing(v, folder, name):
    return "(not run yet)" if v is None or v["status"] == "not run" else f"(no report: see {folder}/{name}.log)"
lay = variants(out)
print(f"\n{'layout':16s} {'tok/s/GPU':>10s} {'MFU':>6s} {'mem GiB':>8s} {'exposed':>8s} {'bubble':>7s} "
      f"{'theory':>7s} {'loss first -> last':>20s} {'worst rel. diff to ' + layouts[0]:>30s}")
best_mfu = 0.0
for name in layouts:
    v = lay.get(name)
    if v is None or v["status"] != "ok":
        print(f"{name:16s} {missing(v, out, name)}")
        continue
    best_mfu = max(best_mfu, fig(v, "mfu") or 0.0)
    pct = lambda k: f"{fig(v, k):6.1f}%" if fig(v, k) is not None else "      -"
    worst = 0.0 if name == layouts[0] else (v["loss_check"] or {}).get("max_rel_diff", float("nan"))
    (s0, l0), (s1, l1) = v["losses"][0], v["losses"][-1]
    print(f"{name:16s} {fig(v, 'tokens_per_s_per_device'):10.0f} {100 * (fig(v, 'mfu') or 0):5.1f}% "
          f"{fig(v, 'report_peak_mem_gib'):8.1f} {fig(v, 'report_exposed_comm_pct'):7.1f}% {pct('report_bubble_pct')} "
          f"{pct('report_bubble_theory_pct')} {l0:9.4f} -> {l1:8.4f} {worst:29.2e}")
weak = variants(os.path.join(out, "weak"))
print(f"\n{'1b, dp with ZeRO':16s} {'tok/s/GPU':>10s} {'weak scaling':>13s}")
eff8 = None
for n in (1, 2, 4, 8):
    v = weak.get(f"1b_dp{n}")
    if v is None or v["status"] != "ok":
        print(f"{n:2d} GPU(s)        {missing(v, out + '/weak', f'1b_dp{n}')}")
        continue
    eff = 100 * v["efficiency"]["value"] if v.get("efficiency") else float("nan")
    eff8 = eff if n == 8 else eff8
    print(f"{n:2d} GPU(s)         {fig(v, 'tokens_per_s_per_device'):10.0f} {eff:12.1f}%")
print(f"\ntargets: best 7B MFU {100 * best_mfu:.1f}% (>= 55%), DP weak scaling at 8 GPUs "
      f"{eff8 if eff8 is not None else float('nan'):.1f}% (>= 95%); reports: {out}/report.md, {out}/weak/report.md")
PY
[ "$failed" = 0 ] && echo "validate_8gpu: all runs finished and the curves agree" || echo "validate_8gpu: FAILED (see above)"
exit "$failed"
