#!/bin/sh
# A huge but finite gradient (1e30 times the true one at step 3: TRAINER_TEST_HUGE_GRAD_AT_STEP)
# never puts Inf into Adam's second moment. Without clipping (train.grad_clip=0) its square would
# overflow fp32: the step counts as non-finite, so the run stops there (or, with
# train.skip_nonfinite=1, skips it) and every checkpoint is finite. With clipping the step is an
# ordinary clipped one.
. "$(dirname "$0")/lib.sh"
make_corpus
PY=$(numpy_python) || { echo "numpy and h5py are needed (scripts/setup/setup.sh)"; exit 1; }
export TRAINER_TEST_HUGE_GRAD_AT_STEP=3

# finite NAME: every floating-point dataset of every checkpoint of the run is finite.
finite() {
  "$PY" - "$WORK/$1/ckpt" <<'PYEOF'
import glob, sys, h5py, numpy as np
bad, files = [], sorted(glob.glob(sys.argv[1] + "/*.h5"))
for f in files:
    with h5py.File(f, "r") as h:
        h.visititems(lambda n, o: bad.append(n) if isinstance(o, h5py.Dataset) and o.dtype.kind == "f"
                     and not np.isfinite(o[()]).all() else None)
print("%d checkpoints, non-finite datasets: %s" % (len(files), bad[:4]))
sys.exit(1 if bad or not files else 0)
PYEOF
}

if run stop 1 train.grad_clip=0 checkpoint.every=1; then fail "no clipping: the run did not stop"
elif grep -q "error: step 3: the gradient norm is inf, so the update was refused" "$WORK/stop/log"; then
  pass "no clipping: the run stops at step 3 ($(grep -m1 '^error' "$WORK/stop/log" | cut -c1-90)...)"
else fail "no clipping: $(tail -n 3 "$WORK/stop/log")"; fi
finite stop && pass "no clipping: checkpoints finite" || fail "no clipping: a checkpoint holds Inf or NaN"
run skip 1 train.grad_clip=0 train.skip_nonfinite=1 || fail "skip_nonfinite=1: the run failed"
grep -q "warning: step 3: the gradient norm is inf: update skipped" "$WORK/skip/log" \
  && pass "skip_nonfinite=1: step 3 skipped with a warning" || fail "skip_nonfinite=1: no warning"
finite skip && pass "skip_nonfinite=1: checkpoints finite" || fail "skip_nonfinite=1: non-finite checkpoint"
run clipped 1 || fail "clipping: the run failed"
grep -q "^step  *3/.*grad_norm [0-9]\{20,\}" "$WORK/clipped/log" && pass "clipping: step 3 logs the huge norm and trains on" \
  || fail "clipping: $(grep '^step  *3/' "$WORK/clipped/log")"
finite clipped && pass "clipping: checkpoints finite" || fail "clipping: non-finite checkpoint"
summary
