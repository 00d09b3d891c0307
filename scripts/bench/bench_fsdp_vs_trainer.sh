#!/bin/bash
# The trainer against the PyTorch FSDP2 baseline (scripts/bench/bench_fsdp.py) on N GPUs of one
# machine, in one call: the same shape, sequences per GPU (so the same tokens per step) and
# steps. Prints each one's tokens/s (whole job and per GPU), MFU, ms/step and peak memory, then
# the ratio trainer / FSDP2 of tokens/s.
#   scripts/bench/bench_fsdp_vs_trainer.sh [BIN_DIR (build)] [CONFIG (by shape)] [SHAPE (7b)]
#       [BATCH per GPU (2)] [STEPS (10)] [NGPU (4)] [trainer overrides key=value ...]
# Paths are relative to the repository root. CONFIG "" or "auto" takes the shape's config:
# 124m -> configs/124m.yaml, 1b -> configs/1b.yaml, 7b-layers -> configs/7b_layers.yaml,
# 7b -> configs/7b_dp4_sharded.yaml (parallel.shard=weights, gathers on the copy engines). The trainer runs data parallel over the NGPU ranks
# (parallel.dp=0 unless the overrides set it) with train.global_batch = BATCH x NGPU and
# train.micro_batch = BATCH, WARMUP + STEPS steps; the overrides come last and win.
# Environment:
#   BENCH_PRECISION  bf16 (default) or fp8: the trainer's train.precision; the baseline runs
#                    --mode compile, or compile_fp8 for fp8
#   FSDP_MODE        the baseline's --mode instead (eager, compile, compile_fp8)
#   FSDP_ARGS        more bench_fsdp.py arguments, e.g. "--no-reshard-after-forward". Without an
#                    --ac there, the baseline recomputes every block (--ac full) when the trainer's
#                    train.recompute is full (from the overrides, else the config), else none
#   WARMUP           untimed steps of each before the STEPS timed ones (default 3)
#   TORCHRUN         the launcher of the baseline (default torchrun, else python3 -m torch.distributed.run)
#   MPIRUN           the trainer's launcher (default mpirun, Open MPI)
#   OUT              folder of the logs and figures (default runs/bench_fsdp)
# The trainer reads its config's data (scripts/setup/get_corpus.sh), the baseline random tokens.
# Only the trainer's processes get BIN_DIR/lib in LD_LIBRARY_PATH (its libraries can upset
# Python's). NVLink multicast stays off in NCCL (NCCL_NVLS_ENABLE=0) unless already set.
# Trainer figures: the steps after WARMUP from its metrics file (docs/metrics.md): tokens/s =
# their tokens over their summed ms_per_step, MFU over the same time; its peak memory is the run
# report's peak_mem_gib (the fullest rank's device memory in use, cudaMemGetInfo, after each step),
# the baseline's torch.cuda.max_memory_allocated (the peak within the step), reserved, and its
# device memory in use after the timed steps (torch.cuda.mem_get_info): the last counts what the
# trainer's does (CUDA context, NCCL, every pool).
# Memory: the 7b shape with 2 sequences per GPU on 4 GPUs plans 55.6 GiB per rank in the trainer
# with its config's parallel.shard=weights and train.recompute=selective (60.4 GiB in use on an
# H200, docs/sharding.md), which fits 80 GB GPUs, and 99.8 GiB with parallel.shard=optimizer and
# recompute none (the plan is printed first). The baseline takes 57 GiB there (68 reserved, 69.5
# in use), 29 GiB with --ac full.
#   scripts/bench/bench_fsdp_vs_trainer.sh build "" 7b 2 10 4
#   scripts/bench/bench_fsdp_vs_trainer.sh build "" 7b 2 10 4 train.recompute=full
#       (the baseline then recomputes too, FSDP_ARGS="--ac none" keeps it from that)
#   scripts/bench/bench_fsdp_vs_trainer.sh build "" 1b 4 20 4
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
bin=${1:-build}; config=${2:-auto}; shape=${3:-7b}; batch=${4:-2}; steps=${5:-10}; ngpu=${6:-4}
shift $(( $# > 6 ? 6 : $# ))
warmup=${WARMUP:-3}; prec=${BENCH_PRECISION:-bf16}; out=${OUT:-runs/bench_fsdp}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

if [ "$config" = auto ] || [ -z "$config" ]; then
  case $shape in
    124m | 1b) config=configs/$shape.yaml ;;
    7b-layers) config=configs/7b_layers.yaml ;;
    7b) config=configs/7b_dp4_sharded.yaml ;;
    *) echo "no config for shape $shape: name one" >&2; exit 2 ;;
  esac
fi
case $prec in
  bf16) mode=compile ;;
  fp8) mode=compile_fp8 ;;
  *) echo "BENCH_PRECISION must be bf16 or fp8, not $prec" >&2; exit 2 ;;
esac
mode=${FSDP_MODE:-$mode}
for v in "$batch" "$steps" "$ngpu" "$warmup"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "BATCH, STEPS, NGPU and WARMUP must be whole numbers" >&2; exit 2; }
done
[ -f "$config" ] || { echo "no config $config" >&2; exit 2; }
[ -x "$bin/trainer" ] || { echo "no trainer at $bin/trainer" >&2; exit 2; }

# The baseline recomputes blocks where the trainer recomputes layers in full.
recompute=$(sed -n 's/^[[:space:]]*recompute:[[:space:]]*"\{0,1\}\([a-z]*\).*/\1/p' "$config" | tail -1)
tprec=$prec
for o in "$@"; do
  [[ $o == train.recompute=* ]] && recompute=${o#train.recompute=}
  [[ $o == train.precision=* ]] && tprec=${o#train.precision=}
done
read -r -a fsdp_args <<< "${FSDP_ARGS:-}"
if [[ " ${FSDP_ARGS:-} " != *" --ac"* ]]; then
  fsdp_args+=(--ac "$([ "${recompute:-none}" = full ] && echo full || echo none)")
fi
if [ "${recompute:-none}" = selective ]; then
  echo "note: the trainer recomputes selectively; the baseline has no such mode and keeps every activation"
fi

mkdir -p "$out"
rm -f "$out/fsdp.json" "$out/trainer.jsonl"
trainer_args=("$config" "train.steps=$((warmup + steps))" train.warmup_steps=1 "train.precision=$prec"
              "train.global_batch=$((batch * ngpu))" "train.micro_batch=$batch" parallel.dp=0 log.every=1
              "log.metrics=$out/trainer.jsonl" checkpoint.dir= "$@")
with_libs() { LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
echo "# $shape, $batch sequences per GPU on $ngpu GPUs, $warmup + $steps steps; trainer $config $tprec" \
     "${*:-}; FSDP2 --mode $mode ${fsdp_args[*]}"
if plan=$(with_libs "$bin/trainer" "${trainer_args[@]}" --dry-run --world-size "$ngpu" --gpus-per-node "$ngpu" 2>&1); then
  sed -n '/^plan:/p;/^model:/p;/^memory per rank/,/^(GiB/p;/^offload:/p' <<< "$plan"
else
  echo "$plan" | tail -5
fi

if [ -n "${TORCHRUN:-}" ]; then read -r -a torchrun <<< "$TORCHRUN"
elif command -v torchrun > /dev/null; then torchrun=(torchrun)
else torchrun=(python3 -m torch.distributed.run); fi
rc=0
PYTHONUNBUFFERED=1 "${torchrun[@]}" --standalone --nproc-per-node "$ngpu" scripts/bench/bench_fsdp.py --shape "$shape" \
  --batch "$batch" --steps "$steps" --warmup "$warmup" --mode "$mode" --json "$out/fsdp.json" "${fsdp_args[@]}" \
  2>&1 | tee "$out/fsdp.log" || { rc=1; echo "FSDP2 baseline failed: $out/fsdp.log" >&2; }

with_libs "${MPIRUN:-mpirun}" --allow-run-as-root --bind-to none -np "$ngpu" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE \
  "$bin/trainer" "${trainer_args[@]}" 2>&1 | tee "$out/trainer.log" ||
  { rc=1; echo "trainer failed: $out/trainer.log" >&2; }

python3 - "$out" "$warmup" "$ngpu" "$shape" "$tprec" "$mode" <<'PY' || rc=1
import json, os, sys
out, warmup, ngpu, shape, prec, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
fsdp = trainer = None
try:
    with open(os.path.join(out, "fsdp.json")) as f:
        fsdp = json.load(f)
except (OSError, ValueError):
    pass
try:
    rows = []
    for line in open(os.path.join(out, "trainer.jsonl")):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut short by a crash
    steps = [r for r in rows if "step" in r and r["step"] > warmup and r.get("ms_per_step")]
    rep = [r for r in rows if r.get("report")]
    if steps:
        ms = sum(r["ms_per_step"] for r in steps)
        tokens = sum(r["tokens_per_s"] * r["ms_per_step"] / 1e3 for r in steps)
        trainer = {"tokens_per_s": tokens / ms * 1e3, "tokens_per_step": tokens / len(steps),
                   "mfu": sum(r.get("mfu", 0) * r["ms_per_step"] for r in steps) / ms,
                   "ms_per_step": ms / len(steps), "steps": len(steps),
                   "peak_mem_gib": rep[-1]["peak_mem_gib"] if rep else None,
                   "peak_held_gib": rep[-1].get("peak_held_gib") if rep else None, "loss": steps[-1]["loss"]}
except OSError:
    pass
print()
if fsdp:
    print(f"fsdp2    {shape:9s} {mode:11s} {fsdp['tokens_per_s']:12.0f} tok/s  {fsdp['tokens_per_s_per_gpu']:10.0f} "
          f"tok/s/GPU  MFU {100 * fsdp['mfu']:5.1f}%  {fsdp['ms_per_step']:8.1f} ms/step  peak mem "
          f"{fsdp['peak_mem_allocated_gib']:6.1f} GiB allocated, {fsdp['peak_mem_reserved_gib']:.1f} reserved, "
          f"{fsdp.get('mem_in_use_gib', float('nan')):.1f} in use on the device  "
          f"loss {fsdp['loss']:.3f}")
else:
    print("fsdp2    no figures")
if trainer:
    mem, held = trainer["peak_mem_gib"], trainer["peak_held_gib"]
    mem_s = "n/a" if mem is None else f"{mem:6.1f} GiB"
    held_s = "n/a" if held is None else f"{held:.1f} GiB"
    print(f"trainer  {shape:9s} {prec:11s} {trainer['tokens_per_s']:12.0f} tok/s  "
          f"{trainer['tokens_per_s'] / ngpu:10.0f} tok/s/GPU  MFU {100 * trainer['mfu']:5.1f}%  "
          f"{trainer['ms_per_step']:8.1f} ms/step  peak mem {mem_s} in use on the device ({held_s} its own buffers)  "
          f"loss {trainer['loss']:.3f}")
else:
    print("trainer  no figures")
ratio = trainer["tokens_per_s"] / fsdp["tokens_per_s"] if fsdp and trainer else None
if ratio is not None and abs(trainer["tokens_per_step"] / fsdp["tokens_per_step"] - 1) > 0.01:
    print(f"warning: tokens per step differ, trainer {trainer['tokens_per_step']:.0f} and fsdp2 "
          f"{fsdp['tokens_per_step']}: does the config hold the shape {shape}?")
if ratio is not None:
    print(f"trainer / fsdp2 tokens/s: {ratio:.3f}")
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"shape": shape, "gpus": ngpu, "precision": prec, "fsdp_mode": mode, "fsdp": fsdp,
               "trainer": trainer, "ratio_tokens_per_s": ratio}, f, indent=1)
    f.write("\n")
sys.exit(0 if ratio is not None else 1)
PY
exit "$rc"
