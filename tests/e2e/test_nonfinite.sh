#!/bin/sh
# A non-finite gradient never reaches the weights or a checkpoint: the gradient of one step is
# made NaN (the TRAINER_TEST_NAN_AT_STEP hook); the run stops at that step with one line, and
# every checkpoint it wrote holds only finite values. With train.skip_nonfinite=1 the step is
# skipped with a warning and the run finishes, on one rank and under dp2 with ZeRO. The same for a
# non-finite FP8 amax (the TRAINER_TEST_FP8_INF_AT_STEP hook), naming the tensor, and for an update
# that would make the weights non-finite from a finite gradient (TRAINER_TEST_INF_LR_AT_STEP).
. "$(dirname "$0")/lib.sh"
make_corpus
PY=$(numpy_python) || { echo "numpy and h5py are needed (scripts/setup/setup.sh)"; exit 1; }

# all_finite NAME: every floating-point dataset of every checkpoint of the run is finite.
all_finite() {
  "$PY" - "$WORK/$1/ckpt" <<'PYEOF'
import glob, sys, h5py, numpy as np
files = sorted(glob.glob(sys.argv[1] + "/*.h5"))
bad, n = [], 0
def visit(name, obj):
    global n
    if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f":
        n += 1
        if not np.isfinite(obj[()]).all(): bad.append(name)
for f in files:
    with h5py.File(f, "r") as h: h.visititems(visit)
print("%d checkpoints, %d float datasets, non-finite: %s" % (len(files), n, bad))
sys.exit(1 if bad or not files else 0)
PYEOF
}

# A run that stopped at step 4 (exit status $2): a plain error exit, not a signal; an error line
# matching $3; checkpoints up to step 3 and none of step 4; every checkpoint finite.
check_stopped() {
  name=$1
  if [ "$2" != 0 ] && [ "$2" -lt 128 ]; then pass "$name: exit $2"; else fail "$name: exit $2"; fi
  grep -q "$3" "$WORK/$name/log" && pass "$name: $(grep -m1 'error:' "$WORK/$name/log" | cut -c1-110)..." \
    || { fail "$name: no error line"; cat "$WORK/$name/log"; }
  [ -f "$WORK/$name/ckpt/ckpt_00000003.h5" ] && [ ! -e "$WORK/$name/ckpt/ckpt_00000004.h5" ] \
    && pass "$name: checkpoints up to step 3, none of step 4" || fail "$name: checkpoints $(ls "$WORK/$name/ckpt")"
  all_finite "$name" && pass "$name: every checkpoint is finite" || fail "$name: a checkpoint holds NaN or Inf"
}

# A run that skipped step 4 (the caller sets the hook): it finishes, warns once with $2 as the
# cause, and every checkpoint is finite. skipped NAME CAUSE NP ARGS...
skipped() {
  name=$1 cause=$2 np=$3
  shift 3
  if run "$name" "$np" train.skip_nonfinite=1 "$@"; then pass "$name: the run finishes"; else
    fail "$name: exit $?"; cat "$WORK/$name/log"; fi
  grep -q "warning: step 4: $cause: update skipped (1 of train.skip_nonfinite = 1)" "$WORK/$name/log" \
    && pass "$name: one warning" || { fail "$name: no warning"; cat "$WORK/$name/log"; }
  all_finite "$name" && pass "$name: every checkpoint is finite" || fail "$name: a checkpoint holds NaN or Inf"
}

for layout in "1" "2 parallel.dp=2 parallel.shard=optimizer parallel.bucket_mb=0.01"; do
  set -- $layout
  np=$1; shift
  name=stop_np$np
  set +e
  TRAINER_TEST_NAN_AT_STEP=4 run "$name" "$np" checkpoint.every=1 checkpoint.keep=0 "$@"
  status=$?
  set -e
  check_stopped "$name" "$status" "error: step 4: the gradient norm is nan.*weights of step 3.*lower train.lr or check the data"

  TRAINER_TEST_NAN_AT_STEP=4 skipped "skip_np$np" "the gradient norm is nan" "$np" checkpoint.every=1 checkpoint.keep=0 "$@"
  [ -f "$WORK/skip_np$np/ckpt/ckpt_00000006.h5" ] && pass "skip_np$np: checkpoint of step 6" || fail "skip_np$np: no final checkpoint"
done

# The skipped step left the weights as they were: checkpoints 3 and 4 hold the same weights.
"$BUILD/ckpt_compare" "$WORK/skip_np1/ckpt/ckpt_00000003.h5" "$WORK/skip_np1/ckpt/ckpt_00000004.h5" --rtol 0 \
  > "$WORK/cmp" 2>&1 && pass "skipped step 4 left the weights of step 3" || { fail "weights changed at step 4"; cat "$WORK/cmp"; }
grep -q '"step": 4, .*"grad_norm": null.*"skipped": true' "$WORK/skip_np1/metrics.jsonl" \
  && pass "metrics mark step 4 skipped" || fail "metrics of step 4: $(grep '"step": 4' "$WORK/skip_np1/metrics.jsonl")"

# A finite gradient whose update would make the weights non-finite (the TRAINER_TEST_INF_LR_AT_STEP
# hook: that step's learning rate is Inf). With train.skip_nonfinite the update is tried on copies
# of the state first and refused: the step is skipped as a NaN gradient's is, so the run's final
# checkpoint is bitwise the one of a run whose step 4 had a NaN gradient (1 rank; dp2 with the
# weights sharded, whose trial runs on each rank's part). Once the skips are spent (a NaN gradient
# at step 2 spends the one allowed) the refusal stops the run, naming the update.
for layout in "1" "2 parallel.dp=2 parallel.shard=weights"; do
  set -- $layout
  np=$1; shift
  name=upd_skip_np$np
  TRAINER_TEST_INF_LR_AT_STEP=4 skipped "$name" \
    "the update, tried first on copies of the optimizer's state, would have made weights or moments non-finite" \
    "$np" checkpoint.every=6 "$@"
  TRAINER_TEST_NAN_AT_STEP=4 run "nan_$name" "$np" checkpoint.every=6 train.skip_nonfinite=1 "$@" \
    || fail "nan_$name: exit $?"
  "$BUILD/ckpt_compare" "$WORK/$name/ckpt/ckpt_00000006.h5" "$WORK/nan_$name/ckpt/ckpt_00000006.h5" --rtol 0 --prefix "" \
    > "$WORK/cmp" 2>&1 && pass "$name: final checkpoint bitwise that of a NaN gradient's skip" \
    || { fail "$name: the refused update left a trace"; cat "$WORK/cmp"; }
done
name=upd_stop
set +e
TRAINER_TEST_NAN_AT_STEP=2 TRAINER_TEST_INF_LR_AT_STEP=4 run "$name" 1 checkpoint.every=1 checkpoint.keep=0 \
  train.skip_nonfinite=1
status=$?
set -e
check_stopped "$name" "$status" \
  "error: step 4: the update, tried first on copies of the optimizer's state, would have made weights or moments non-finite, so the update was refused.*weights of step 3"

# FP8 (train.precision=fp8): an Inf amax (the TRAINER_TEST_FP8_INF_AT_STEP hook; the input of the
# first FP8 projection, layer 0's fused QKV) refuses the update like a non-finite gradient: the
# run stops naming the tensor and the step, or (skip_nonfinite, tp2) skips it.
# Either way every checkpoint, FP8 scaling state and amax histories included, is finite.
name=fp8_stop
set +e
TRAINER_TEST_FP8_INF_AT_STEP=4 run "$name" 1 checkpoint.every=1 checkpoint.keep=0 train.precision=fp8
status=$?
set -e
check_stopped "$name" "$status" \
  "error: step 4: the FP8 amax of layer 0's QKV projection input is inf, so the update was refused.*weights of step 3.*train.precision=bf16"

name=fp8_skip_tp2
TRAINER_TEST_FP8_INF_AT_STEP=4 skipped "$name" "the FP8 amax of layer 0's QKV projection input is inf" 2 \
  checkpoint.every=1 checkpoint.keep=0 train.precision=fp8 parallel.tp=2
"$BUILD/ckpt_compare" "$WORK/$name/ckpt/ckpt_00000003.h5" "$WORK/$name/ckpt/ckpt_00000004.h5" --rtol 0 \
  > "$WORK/cmp" 2>&1 && pass "$name: skipped step 4 left the weights of step 3" || { fail "$name: weights changed"; cat "$WORK/cmp"; }

summary
