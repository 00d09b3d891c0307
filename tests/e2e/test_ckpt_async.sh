#!/bin/sh
# Asynchronous checkpoints (checkpoint.async=true) against synchronous ones, on 1 rank, tp 2 and
# dp 2 with the sharded optimizer:
# - the files hold the same tensors, checksums and attributes bit for bit (the stored config
#   differs only in its checkpoint.async line), and the run's losses are the same;
# - a run stopped at step 3 and resumed from its asynchronous checkpoint ends bitwise like the
#   uninterrupted synchronous run;
# - a write error or a non-finite value in the background write ends every rank with one line
#   and exit 1, the previous checkpoint intact and no temporary left (the hooks of
#   test_ckpt_write_fault.sh), on 1 and 2 ranks; a process killed during it (1 rank, and dp 2
#   with the sharded optimizer) leaves the previous checkpoint, from which resume=auto continues
#   bitwise;
# - training goes on while a slow write (TRAINER_TEST_CKPT_DELAY_S) runs, and at SIGTERM the
#   write in flight completes and is published before the process exits 143.
# Every run takes TRAINER_TEST_ARGS (lib.sh) too: train.device=cuda runs it all on GPUs.
. "$(dirname "$0")/lib.sh"
make_corpus
T="$SRC/configs/tiny.yaml"
D="data.train=$WORK/data/train_*.bin"
V="data.val=$WORK/data/val_*.bin"

# same_content A B: two checkpoint files hold the same datasets (bytes, shapes) and the same
# attributes, the stored config_yaml compared without checkpoint.async and the runs' own folders
# (checkpoint.dir, log.metrics).
same_content() {
  if ! py=$(numpy_python); then
    echo "note: no python3 with h5py: comparing the tensors only"
    "$BUILD/ckpt_compare" "$1" "$2" --rtol 0 --prefix "" > /dev/null
    return
  fi
  "$py" - "$1" "$2" <<'PY'
import re, sys, h5py
def read(path):
    out = {}
    with h5py.File(path, "r") as f:
        def attrs(name, obj):
            for k, v in obj.attrs.items():
                if k == "config_yaml":
                    v = re.sub(rb"\n  (async|dir|metrics): [^\n]*", b"", bytes(v))
                out[(name, "@" + k)] = repr(v)
        attrs("/", f)
        def visit(name, obj):
            attrs(name, obj)
            if isinstance(obj, h5py.Dataset):
                out[(name, "data")] = (obj.shape, obj.dtype.str, obj[...].tobytes())
        f.visititems(visit)
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
bad = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
print("%d entries compared, %d differ%s" % (len(a), len(bad), ": %s" % bad[:5] if bad else ""))
sys.exit(1 if bad or len(a) < 10 else 0)
PY
}

# One layout per name: the ranks and the overrides.
for layout in "one 1" "tp2 2 parallel.tp=2" "dp2 2 parallel.dp=2 parallel.shard=optimizer"; do
  # shellcheck disable=SC2086
  set -- $layout
  name=$1 np=$2
  shift 2
  run "sync_$name" "$np" checkpoint.every=3 "$@" || fail "$name: synchronous run"
  run "async_$name" "$np" checkpoint.every=3 checkpoint.async=true "$@" || fail "$name: asynchronous run"
  for step in 3 6; do
    f=$(printf 'ckpt_%08d.h5' "$step")
    if same_content "$WORK/sync_$name/ckpt/$f" "$WORK/async_$name/ckpt/$f"; then
      pass "$name: the asynchronous $f holds what the synchronous one does, bit for bit"
    else fail "$name: the asynchronous $f differs from the synchronous one"; fi
  done
  if grep -q "checkpoint: step 3 copied to host in .* (training stalled .* s), writing to" "$WORK/async_$name/log" &&
     grep -q "checkpoint: step 6 saved to .* in .* s in the background (.* GB/s)" "$WORK/async_$name/log"; then
    pass "$name: the stall and the background write are reported"
  else fail "$name: no stall or write line: $(grep checkpoint: "$WORK/async_$name/log")"; fi
  same_losses "sync_$name" "async_$name" 0 && pass "$name: same losses" || fail "$name: the losses differ"
  # Resume from an asynchronous checkpoint: stopped at step 3, continued to step 6.
  run "split_$name" "$np" checkpoint.every=3 checkpoint.async=true train.stop_at=3 "$@" || fail "$name: first half"
  mv "$WORK/split_$name/metrics.jsonl" "$WORK/split_$name/first.jsonl"
  run "split_$name" "$np" checkpoint.every=3 checkpoint.async=true checkpoint.resume=auto "$@" \
    || fail "$name: second half"
  resumed_bitwise "sync_$name" "split_$name"
done

# intact DIR WHAT: DIR holds the step-3 checkpoint alone, sound.
intact() {
  if [ "$(ls -A "$1")" = "ckpt_00000003.h5" ] && "$BUILD/ckpt_verify" "$1/ckpt_00000003.h5" > /dev/null; then
    pass "$2: the step-3 checkpoint is still the newest, sound, no temporary left"
  else fail "$2: checkpoint directory holds: $(ls -A "$1")"; fi
}

# Failures of the background write: resumed at step 3, the write of step 4 fails; the run stops
# at the step boundary where the ranks learn of it.
for np in 1 2; do
  for fault in FAIL NAN; do
    dir=$WORK/fault_${fault}_$np
    mkdir -p "$dir"
    cp "$WORK/sync_one/ckpt/ckpt_00000003.h5" "$dir/"
    if [ $fault = FAIL ]; then
      pattern="checkpoint: writing tensor 'model/layers.2.wq' .*injected write error (test hook)"
    else
      pattern="checkpoint: step 4 not saved: tensor 'model/layers.2.wq' holds 1 non-finite value (NaN or Inf).*the previous checkpoint stays"
    fi
    export "TRAINER_TEST_${fault}_IN_CKPT=7"
    # shellcheck disable=SC2086
    expect_error "async, $fault in the write of step 4, $np rank(s)" "$pattern" $np "$T" "$D" "$V" $EXTRA_ARGS \
      "checkpoint.dir=$dir" checkpoint.resume=auto checkpoint.every=2 checkpoint.async=true parallel.tp=$np
    unset "TRAINER_TEST_${fault}_IN_CKPT"
    intact "$dir" "async, $fault in the write, $np rank(s)"
    if grep -q "checkpoint: step 4 saved" "$WORK/out"; then fail "async, $fault: step 4 reported saved"; fi
  done
done

# A process killed while its background write runs (every rank's writer kills its process after
# 5 tensors of the step-4 checkpoint) leaves the step-3 checkpoint and a temporary; resume=auto
# continues from step 3 to the same end as the uninterrupted synchronous run. On 1 rank, and on
# dp 2 with the sharded optimizer, where both ranks write their parts into the one temporary.
for layout in "one 1" "dp2 2 parallel.dp=2 parallel.shard=optimizer"; do
  # shellcheck disable=SC2086
  set -- $layout
  name=$1 np=$2
  shift 2
  mkdir -p "$WORK/crash_$name/ckpt"
  cp "$WORK/sync_$name/ckpt/ckpt_00000003.h5" "$WORK/crash_$name/ckpt/"
  status=0
  TRAINER_TEST_KILL_IN_CKPT=5 run "crash_$name" "$np" checkpoint.every=2 checkpoint.async=true checkpoint.resume=auto \
    "$@" || status=$?
  left=$(LC_ALL=C ls -A "$WORK/crash_$name/ckpt" | tr '\n' ' ')
  [ "$status" != 0 ] && [ "$left" = ".ckpt_00000004.h5.tmp ckpt_00000003.h5 " ] \
    && pass "$name: killed during the background write of step 4 (exit $status): only a temporary of it" \
    || fail "$name: kill during the background write: exit $status, the folder holds $left"
  run "crash_$name" "$np" checkpoint.every=3 checkpoint.async=true checkpoint.resume=auto "$@" \
    || fail "$name: resume after the crash"
  grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/crash_$name/log" \
    && pass "$name: resume=auto picked checkpoint 3" || fail "$name: resume=auto did not pick checkpoint 3"
  "$BUILD/ckpt_compare" "$WORK/sync_$name/ckpt/ckpt_00000006.h5" "$WORK/crash_$name/ckpt/ckpt_00000006.h5" --rtol 0 \
    --prefix "" > /dev/null && pass "$name: after the crash and resume, the step-6 checkpoint is bitwise the uninterrupted one" \
    || fail "$name: after the crash, the step-6 checkpoint differs"
done

# A slow write: training goes on meanwhile (the write of step 2 takes at least 2 s, a step of the
# tiny model milliseconds), and each checkpoint waits for the one before.
export TRAINER_TEST_CKPT_DELAY_S=2
run slow 1 checkpoint.every=2 checkpoint.async=true || fail "run with slow asynchronous writes"
order=$(grep -n -e "^step  *3/" -e "checkpoint: step 2 saved" "$WORK/slow/log" | cut -d: -f2 | tr '\n' ' ')
case "$order" in
  "step "*"checkpoint"*) pass "steps ran while the checkpoint of step 2 was written" ;;
  *) fail "no step logged during the write of step 2: $(grep -e '^step' -e checkpoint: "$WORK/slow/log")" ;;
esac
[ "$(grep -c "checkpoint: step [246] saved" "$WORK/slow/log")" = 3 ] && pass "every slow write was published" \
  || fail "slow writes published: $(grep "saved" "$WORK/slow/log")"

# SIGTERM with a slow write: the checkpoint of the stop step is in flight when the loop ends; it
# completes and is published before exit 143, and resume=auto continues from it.
mkdir -p "$WORK/term"
# shellcheck disable=SC2086
"$TRAINER" "$T" "$D" $EXTRA_ARGS data.val= train.steps=1000000 checkpoint.every=0 checkpoint.async=true log.every=1 \
  log.metrics= "checkpoint.dir=$WORK/term/ckpt" > "$WORK/term/log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^step  *3/" "$WORK/term/log" && break; sleep 0.1; done
kill -TERM $pid
status=0
wait $pid || status=$?
unset TRAINER_TEST_CKPT_DELAY_S
[ "$status" = 143 ] && pass "SIGTERM: exit 143" || fail "SIGTERM: exit $status, expected 143"
at=$(sed -n 's/^signal 15: stopping after step \([0-9]*\)$/\1/p' "$WORK/term/log")
ckpt=$WORK/term/ckpt/$(printf 'ckpt_%08d.h5' "${at:-0}")
if [ -n "$at" ] && grep -q "checkpoint: step $at saved to .* in the background" "$WORK/term/log" &&
   "$BUILD/ckpt_verify" "$ckpt" > /dev/null; then
  pass "SIGTERM: the write in flight of step $at completed before exit"
else fail "SIGTERM: no complete checkpoint of the stop step: $(tail -n 4 "$WORK/term/log")"; fi
# shellcheck disable=SC2086
"$TRAINER" "$T" "$D" $EXTRA_ARGS data.val= train.steps=1000000 checkpoint.async=true checkpoint.resume=auto log.metrics= \
  "train.stop_at=$((${at:-0} + 1))" "checkpoint.dir=$WORK/term/ckpt" > "$WORK/term/log2" 2>&1 \
  || fail "resume after SIGTERM"
grep -q "resumed from .* at step ${at:-x}$" "$WORK/term/log2" && pass "resume=auto continued from step $at" \
  || fail "no resume from step ${at:-?}: $(head -n 3 "$WORK/term/log2")"
summary
