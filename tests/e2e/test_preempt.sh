#!/bin/sh
# Preemption through mpirun: a 2-rank run whose checkpoint writes take 4 s longer
# (TRAINER_TEST_CKPT_DELAY_S, as a slow file system would) gets SIGTERM once it logs step 3.
# - Started by scripts/launch/launch_mpirun.sh, the signal sent to the launcher must end the job with
#   exit 143 and a complete checkpoint of the step it names, from which checkpoint.resume=auto
#   continues.
# - Started by mpirun itself, the same signal sent to mpirun loses that checkpoint (Open MPI kills
#   the ranks about 2 s later and exits 1): the control showing the write outlasts mpirun's kill.
. "$(dirname "$0")/lib.sh"
make_corpus
export TRAINER_TEST_CKPT_DELAY_S=4
MPI_OPTS="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && MPI_OPTS="$MPI_OPTS --allow-run-as-root"
ARGS="data.train=$WORK/data/train_*.bin data.val= parallel.dp=2 train.steps=1000000 log.every=1 log.metrics= checkpoint.every=0"

# preempt NAME LAUNCHER...: the run under LAUNCHER, SIGTERM to the launcher after step 3; sets $status.
preempt() {
  name=$1
  shift
  mkdir -p "$WORK/$name"
  # shellcheck disable=SC2086
  "$@" $MPI_OPTS -np 2 "$TRAINER" "$SRC/configs/tiny.yaml" $ARGS "checkpoint.dir=$WORK/$name/ckpt" \
    < /dev/null > "$WORK/$name/log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "^step  *3/" "$WORK/$name/log" 2> /dev/null && break; sleep 0.1; done
  kill -TERM $pid
  status=0
  wait $pid || status=$?
}

preempt wrapped "$SRC/scripts/launch/launch_mpirun.sh"
[ "$status" = 143 ] && pass "launch_mpirun.sh: exit 143" || { fail "launch_mpirun.sh: exit $status, expected 143"; tail -n 15 "$WORK/wrapped/log"; }
at=$(sed -n 's/^signal 15: stopping after step \([0-9]*\)$/\1/p' "$WORK/wrapped/log")
ckpt=$WORK/wrapped/ckpt/$(printf 'ckpt_%08d.h5' "${at:-0}")
if [ -n "$at" ] && grep -q "checkpoint: step $at saved" "$WORK/wrapped/log" && [ -f "$ckpt" ] \
   && "$BUILD/ckpt_compare" "$ckpt" "$ckpt" --rtol 0 > /dev/null 2>&1; then
  pass "launch_mpirun.sh: the checkpoint of step $at is complete ($(grep -m1 "checkpoint: step $at saved" "$WORK/wrapped/log"))"
else
  fail "launch_mpirun.sh: no complete checkpoint of the last step"; tail -n 15 "$WORK/wrapped/log"
fi
TRAINER_TEST_CKPT_DELAY_S=0 $MPIRUN -np 2 "$TRAINER" "$SRC/configs/tiny.yaml" $ARGS "checkpoint.dir=$WORK/wrapped/ckpt" \
  checkpoint.resume=auto "train.stop_at=$((${at:-0} + 1))" > "$WORK/wrapped/log2" 2>&1 || fail "resume after SIGTERM"
grep -q "resumed from .*$(basename "$ckpt") at step ${at:-x}$" "$WORK/wrapped/log2" \
  && pass "resume=auto continued from step $at" || fail "no resume from step ${at:-?}: $(head -3 "$WORK/wrapped/log2")"

preempt bare mpirun
if [ "$status" != 143 ] && ! ls "$WORK/bare/ckpt"/ckpt_*.h5 > /dev/null 2>&1; then
  pass "control: SIGTERM to mpirun itself ends with exit $status and no checkpoint (the write outlasts mpirun's kill)"
else
  fail "control: SIGTERM to mpirun ended with exit $status and $(ls "$WORK/bare/ckpt" 2>/dev/null | tr '\n' ' '): the delayed write did not outlast mpirun's kill, so the test above proves nothing"
fi
summary
