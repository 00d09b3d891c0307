#!/bin/sh
# Resume is bitwise: 6 steps in one process equal 3 steps, a checkpoint, and 3 more steps in
# a fresh process (same logged losses, identical final parameters and Adam moments). Then a
# process killed (SIGKILL) while it writes a checkpoint leaves the previous one loadable, and
# checkpoint.resume=auto continues from it to the same result. A checkpoint of step 0
# (checkpoint.at_start) resumes bitwise too.
. "$(dirname "$0")/lib.sh"
make_corpus
run straight 1 checkpoint.every=3 || fail "uninterrupted run"
run split 1 checkpoint.every=3 train.stop_at=3 || fail "first half"
[ -f "$WORK/split/ckpt/ckpt_00000003.h5" ] && pass "checkpoint at step 3 written" || fail "no checkpoint at step 3"
mv "$WORK/split/metrics.jsonl" "$WORK/split/first.jsonl"
run split 1 checkpoint.every=3 checkpoint.resume=auto || fail "second half"
resumed_bitwise straight split

# The initial weights as a checkpoint (checkpoint.at_start): writing step 0 changes nothing, and a
# run resumed from it equals the uninterrupted run bit for bit.
run at0 1 checkpoint.every=3 checkpoint.at_start=true || fail "run with checkpoint.at_start"
grep -q "checkpoint: step 0 saved" "$WORK/at0/log" && [ -f "$WORK/at0/ckpt/ckpt_00000000.h5" ] \
  && pass "checkpoint of step 0 written before the first update" || fail "no checkpoint of step 0"
"$BUILD/ckpt_compare" "$WORK/straight/ckpt/ckpt_00000006.h5" "$WORK/at0/ckpt/ckpt_00000006.h5" --rtol 0 --prefix "" \
  && pass "a run with at_start ends bitwise like one without" || fail "at_start changed the run"
run at0_resumed 1 checkpoint.every=3 "checkpoint.resume=$WORK/at0/ckpt/ckpt_00000000.h5" || fail "resume from step 0"
grep -q "resumed from .*ckpt_00000000.h5 at step 0" "$WORK/at0_resumed/log" && pass "resumed at step 0" \
  || fail "did not resume at step 0"
same_losses straight at0_resumed 0 && pass "losses after resuming from step 0 are bitwise equal" \
  || fail "losses after resuming from step 0 differ"
"$BUILD/ckpt_compare" "$WORK/straight/ckpt/ckpt_00000006.h5" "$WORK/at0_resumed/ckpt/ckpt_00000006.h5" --rtol 0 \
  --prefix "" && pass "resumed from step 0: final checkpoints bitwise equal" || fail "resumed from step 0 differs"

# Crash mid-write: checkpoints every 2 steps; the write at step 4 is killed after 5 tensors.
run crash 1 checkpoint.every=2 train.stop_at=2 || fail "run to step 2"
set +e
TRAINER_TEST_KILL_IN_CKPT=5 run crash 1 checkpoint.every=2 checkpoint.resume=auto
status=$?
set -e
[ "$status" != 0 ] && pass "run killed while writing checkpoint 4 (exit $status)" || fail "the kill hook did not fire"
[ ! -f "$WORK/crash/ckpt/ckpt_00000004.h5" ] && pass "no checkpoint 4 after the crash" || fail "checkpoint 4 exists"
ls -a "$WORK/crash/ckpt" | grep -q "tmp" && pass "the partial write is a temporary file" || fail "no temporary file left"
run crash 1 checkpoint.every=2 checkpoint.resume=auto || fail "resume after the crash"
grep -q "resumed from .*ckpt_00000002.h5 at step 2" "$WORK/crash/log" && pass "resume=auto picked checkpoint 2" \
  || fail "resume=auto did not pick checkpoint 2: $(cat "$WORK/crash/log")"
same_losses straight crash 0 && pass "losses after the crash and resume equal the uninterrupted run" \
  || fail "losses after crash differ"

# Preemption: SIGTERM mid-run finishes the step in flight, checkpoints it and exits 128+15;
# resume=auto then continues from that step.
mkdir -p "$WORK/term"
"$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$WORK/data/train_*.bin" data.val= train.steps=1000000 \
  "checkpoint.dir=$WORK/term/ckpt" checkpoint.every=0 log.every=1 log.metrics= > "$WORK/term/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "^step  *3/" "$WORK/term/log" && break; sleep 0.1; done
kill -TERM $pid
set +e
wait $pid
status=$?
set -e
[ "$status" = 143 ] && pass "SIGTERM: exit 143" || fail "SIGTERM: exit $status, expected 143"
at=$(sed -n 's/^signal 15: stopping after step \([0-9]*\)$/\1/p' "$WORK/term/log")
if [ -n "$at" ] && [ -f "$WORK/term/ckpt/$(printf 'ckpt_%08d.h5' "$at")" ]; then
  pass "SIGTERM: checkpoint of step $at written"
else
  fail "SIGTERM: no checkpoint of the last step: $(tail -3 "$WORK/term/log")"
fi
"$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$WORK/data/train_*.bin" data.val= train.steps=1000000 \
  "checkpoint.dir=$WORK/term/ckpt" checkpoint.resume=auto "train.stop_at=$((${at:-0} + 2))" log.metrics= \
  > "$WORK/term/log2" 2>&1 || fail "resume after SIGTERM"
grep -q "resumed from .* at step ${at:-x}$" "$WORK/term/log2" && pass "resume=auto continued from step $at" \
  || fail "no resume from step ${at:-?}: $(head -3 "$WORK/term/log2")"
summary
