#!/bin/sh
# Optimizer state in host memory (optimizer.offload=host): test_offload.sh NAME NP [key=value ...]
# trains the tiny config for 20 steps on NP ranks with the given layout, without offload and
# with each engine (offload_update cpu and gpu) at offload_fraction 1 and 0.5 (20 KiB buckets,
# so the half is several buckets on each side), and checks that every loss and every final
# parameter and moment agree with the run without offload to TRAINER_OFFLOAD_RTOL (default 0:
# on CPU ranks both engines run the reference AdamW on the same values, so the runs are bitwise
# equal; on GPUs, scripts/validate/test_gpu.sh, the cpu engine's host arithmetic may round differently
# from the GPU kernel's, and the script states its tolerance). Then bitwise resume with
# offload, and a resume that switches offload off (and on) at the checkpoint; the cpu engine's
# update finished layer by layer in the next forward (offload_layer_wait) against the whole
# update in its step; then the delayed update (offload_delay=1). With the gpu engine, that the
# host state is only this rank's part: the pinned bytes the run reports, and those --dry-run plans.
. "$(dirname "$0")/lib.sh"
name=$1; np=$2; shift 2
make_corpus
rtol=${TRAINER_OFFLOAD_RTOL:-0}
# The parts the host state is cut into: dp with the optimizer's state sharded, else 1.
parts=1
case " $* " in
  *" parallel.shard=optimizer "* | *" parallel.shard=grads "* | *" parallel.shard=weights "*) parts=$(printf '%s\n' "$@" | sed -n 's/^parallel\.dp=//p') ;;
esac
# host_bytes RUN FRACTION: the pinned host memory the run reports at start-up (the sum of its own
# allocations) is the master weights and both moments of rank 0's part of the host share: 12 bytes
# a parameter times the share (FRACTION of the buckets, rounded to whole ones: within a fifth)
# over the parts. A master kept whole on every rank would add 4 bytes a parameter, 4 - 4 / dp of
# the host share more. The gpu engine pins nothing else (the cpu engine adds its copy slots).
host_bytes() {
  python3 - "$WORK/$1/log" "$2" "$parts" <<'PY'
import re, sys
text, fraction, parts = open(sys.argv[1]).read(), float(sys.argv[2]), int(sys.argv[3])
m = re.search(r"^offload: (\d+) bytes of pinned host memory for the optimizer state of rank 0's (\d+) parameters",
              text, re.M)
if not m:
    sys.exit("no offload line in the log")
per, want = int(m.group(1)) / int(m.group(2)), 12 * fraction / parts
print("pinned host memory: %.4f bytes a parameter, expected about %.4f" % (per, want))
sys.exit(0 if abs(per - want) <= (0.001 if fraction == 1 else 0.2) * want else 1)
PY
}
base="train.steps=20 train.warmup_steps=4 parallel.bucket_mb=0.02 checkpoint.every=10"
# shellcheck disable=SC2086
run reference "$np" $base "$@" || fail "run without offload: $(tail -5 "$WORK/reference/log")"
for engine in cpu gpu; do
  for fraction in 1 0.5; do
    run="${engine}_$(echo "$fraction" | tr . _)"
    # shellcheck disable=SC2086
    if run "$run" "$np" $base "$@" optimizer.offload=host optimizer.offload_update=$engine \
      optimizer.offload_fraction=$fraction; then
      pass "$name: offload_update=$engine offload_fraction=$fraction trains on $np ranks"
    else
      fail "$name: offload_update=$engine fraction $fraction: $(tail -5 "$WORK/$run/log")"
    fi
    same_losses reference "$run" "$rtol" && pass "$run losses equal the run without offload (rtol $rtol)" \
      || fail "$run losses differ"
    "$BUILD/ckpt_compare" "$WORK/reference/ckpt/ckpt_00000020.h5" "$WORK/$run/ckpt/ckpt_00000020.h5" --rtol "$rtol" \
      --prefix "" && pass "$run weights and moments equal the run without offload" || fail "$run checkpoints differ"
    if [ "$engine" = gpu ]; then
      host_bytes "$run" "$fraction" && pass "$run pins 12 bytes a parameter of its part ($parts) of the host share" \
        || fail "$run pins other than its part of the host share: $(grep '^offload:' "$WORK/$run/log")"
    fi
  done
done
# --dry-run counts the same for the 7B shape on 8 ranks (gpu engine: no copy slots): 12 bytes a
# parameter of the rank, over dp 8 with parallel.shard=optimizer, whole without it.
for shard in optimizer none; do
  "$TRAINER" "$SRC/configs/7b.yaml" --dry-run --world-size 8 parallel.dp=8 parallel.shard=$shard \
    optimizer.offload=host optimizer.offload_update=gpu > "$WORK/plan_$shard.txt" 2>&1
  python3 - "$WORK/plan_$shard.txt" "$shard" <<'PY' && pass "dry run: pinned host memory, parallel.shard=$shard" \
    || fail "dry run: pinned host memory with parallel.shard=$shard: $(grep '^offload' "$WORK/plan_$shard.txt")"
import re, sys
text, dp = open(sys.argv[1]).read(), 8 if sys.argv[2] == "optimizer" else 1
n = float(re.search(r"^  0 +0 .* ([0-9.]+)M ", text, re.M).group(1)) * 1e6
gib = float(re.search(r"^offload: .* up to ([0-9.]+) GiB per rank", text, re.M).group(1))
print("dry run: %.2f GiB per rank, expected %.2f" % (gib, 12 * n / dp / 2**30))
sys.exit(0 if abs(gib - 12 * n / dp / 2**30) < 0.01 else 1)
PY
done
# Bitwise resume with offload (the host share's moments saved and loaded), and from a
# checkpoint of the run with offload into one without it, and the other way round.
off="optimizer.offload=host optimizer.offload_fraction=0.5"
# shellcheck disable=SC2086
run split "$np" $base "$@" $off train.stop_at=10 || fail "first half: $(tail -5 "$WORK/split/log")"
mv "$WORK/split/metrics.jsonl" "$WORK/split/first.jsonl"
cp -r "$WORK/split" "$WORK/to_none"
# shellcheck disable=SC2086
run split "$np" $base "$@" $off checkpoint.resume=auto || fail "second half: $(tail -5 "$WORK/split/log")"
# shellcheck disable=SC2086
run to_none "$np" $base "$@" checkpoint.resume=auto || fail "second half without offload"
# shellcheck disable=SC2086
run from_none "$np" $base "$@" "checkpoint.resume=$WORK/reference/ckpt/ckpt_00000010.h5" $off \
  || fail "second half with offload from a run without"
# The same engine on both sides of the checkpoint: bitwise on any device; offload switched at it:
# within rtol (the engines' arithmetic may differ on GPUs).
for r in split to_none from_none; do
  tol=$rtol; [ "$r" = split ] && tol=0
  grep -q "resumed from .*ckpt_00000010.h5 at step 10" "$WORK/$r/log" && pass "$r resumed at step 10" \
    || fail "$r did not resume"
  same_losses cpu_0_5 "$r" "$tol" && pass "$r: losses after resume equal the uninterrupted run (rtol $tol)" \
    || fail "$r: losses after resume differ"
  "$BUILD/ckpt_compare" "$WORK/cpu_0_5/ckpt/ckpt_00000020.h5" "$WORK/$r/ckpt/ckpt_00000020.h5" --rtol "$tol" \
    --prefix "" && pass "$r: final checkpoint equals the uninterrupted run" || fail "$r: final checkpoints differ"
done
# offload_layer_wait (on by default, so the cpu engine's runs and the resume above use it with
# one rank): the host update of a step finishes in the next forward, each bucket before the first
# layer that reads it, against the whole update before the next step: the same arithmetic, so
# bitwise on any device, here with an evaluation every 5 steps (its forward finishes the update),
# checkpoints at steps 10 and 20 (they finish it first) and a skipped non-finite step (7). It is
# in force with one data-parallel rank only (the run's offload line says so).
wait_args="optimizer.offload=host optimizer.offload_fraction=0.5 log.eval_every=5 train.skip_nonfinite=1"
for wait in true false; do
  # shellcheck disable=SC2086
  TRAINER_TEST_NAN_AT_STEP=7 run "wait_$wait" "$np" $base "$@" $wait_args "optimizer.offload_layer_wait=$wait" \
    || fail "offload_layer_wait=$wait: $(tail -5 "$WORK/wait_$wait/log")"
  # In FP8 each layer's weight copies are remade after its buckets' update, in the forward.
  # shellcheck disable=SC2086
  run "wait_fp8_$wait" "$np" $base "$@" $wait_args train.precision=fp8 "optimizer.offload_layer_wait=$wait" \
    || fail "offload_layer_wait=$wait in FP8: $(tail -5 "$WORK/wait_fp8_$wait/log")"
done
grep -q "warning: step 7: .*update skipped" "$WORK/wait_true/log" && pass "offload_layer_wait: step 7 skipped" \
  || fail "offload_layer_wait: step 7 was not skipped"
in_force=$([ "$np" = 1 ] && echo 1 || echo 0)
for v in wait wait_fp8; do
  [ "$(grep -c '^offload: .*layer by layer' "$WORK/${v}_true/log")" = "$in_force" ] \
    && [ "$(grep -c '^offload: .*layer by layer' "$WORK/${v}_false/log")" = 0 ] \
    && pass "$v: offload_layer_wait in force on $np rank(s): $in_force" \
    || fail "$v: offload_layer_wait: $(grep '^offload:' "$WORK/${v}_true/log")"
  python3 - "$WORK/${v}_false/metrics.jsonl" "$WORK/${v}_true/metrics.jsonl" <<'PY' \
    && pass "$v: every loss, gradient norm and validation loss bitwise equal" || fail "$v: the runs differ"
import json, sys
keys = ("loss", "grad_norm", "val_loss")
a, b = ([{k: repr(o.get(k)) for k in keys} for o in map(json.loads, open(p)) if "step" in o] for p in sys.argv[1:])
n_val = sum(r["val_loss"] != "None" for r in b)
print("compared %d steps, %d with a validation loss" % (len(b), n_val))
sys.exit(0 if a == b and len(b) == 20 and n_val == 4 else 1)
PY
  for at in 00000010 00000020; do
    "$BUILD/ckpt_compare" "$WORK/${v}_false/ckpt/ckpt_$at.h5" "$WORK/${v}_true/ckpt/ckpt_$at.h5" --rtol 0 --prefix "" \
      && pass "$v: checkpoint $at bitwise equal" || fail "$v: checkpoints $at differ"
  done
done
# The one-step delayed update (offload_delay=1): step 2 is the first whose weights lack an update
# (step 1's runs beside it), so the losses of step 1 agree with the reference and later ones
# differ; the run still learns; a checkpoint completes the update in flight, so a run resumed
# from it continues bitwise.
delay="optimizer.offload=host optimizer.offload_delay=1"
# shellcheck disable=SC2086
run delay "$np" $base "$@" $delay || fail "delayed update: $(tail -5 "$WORK/delay/log")"
python3 - "$WORK/reference/metrics.jsonl" "$WORK/delay/metrics.jsonl" <<'PY' && pass "delayed update: step 1 as without delay, then other losses, and it learns" || fail "delayed update: unexpected losses"
import json, sys
a, b = ({o["step"]: o["loss"] for o in map(json.loads, open(p)) if "step" in o} for p in sys.argv[1:])
print("without delay", [round(a[s], 4) for s in (1, 2, 20)], "with delay", [round(b[s], 4) for s in (1, 2, 20)])
sys.exit(0 if a[1] == b[1] and a[3] != b[3] and b[20] < b[1] - 0.5 else 1)
PY
# A checkpoint after every step completes each update before the next step: the delayed engine
# then gives the run without delay bit for bit (its host update, copies back and norms are right),
# here beside a device share that is not delayed (offload_fraction 0.5).
# shellcheck disable=SC2086
run delay_every "$np" $base "$@" $delay optimizer.offload_fraction=0.5 checkpoint.every=1 checkpoint.keep=2 \
  || fail "delayed update, checkpoint.every=1: $(tail -5 "$WORK/delay_every/log")"
same_losses reference delay_every "$rtol" && pass "delayed update flushed every step equals the run without delay" \
  || fail "delayed update flushed every step differs from the run without delay"
"$BUILD/ckpt_compare" "$WORK/reference/ckpt/ckpt_00000020.h5" "$WORK/delay_every/ckpt/ckpt_00000020.h5" --rtol "$rtol" \
  --prefix "" && pass "delayed update flushed every step: final checkpoint equals the run without delay" \
  || fail "delayed update flushed every step: final checkpoint differs"
# shellcheck disable=SC2086
run delay_split "$np" $base "$@" $delay train.stop_at=10 || fail "delayed update, first half"
mv "$WORK/delay_split/metrics.jsonl" "$WORK/delay_split/first.jsonl"
# shellcheck disable=SC2086
run delay_split "$np" $base "$@" $delay checkpoint.resume=auto || fail "delayed update, second half"
same_losses delay delay_split 0 && pass "delayed update: losses after resume are bitwise equal" \
  || fail "delayed update: losses after resume differ"
"$BUILD/ckpt_compare" "$WORK/delay/ckpt/ckpt_00000020.h5" "$WORK/delay_split/ckpt/ckpt_00000020.h5" --rtol 0 --prefix "" \
  && pass "delayed update: final checkpoints bitwise equal" || fail "delayed update: final checkpoints differ"
summary
