#!/bin/sh
# Kill a rank: a 2-rank dp2 run of the tiny config (CPU ranks; TRAINER_TEST_ARGS=train.device=cuda
# for the GPU variant) is started, and once it logs step progress one trainer process is killed
# with SIGKILL. The whole job must end, with a non-zero status, within TRAINER_KILL_DEADLINE_S
# (default 90 s) and say why: mpirun's report of the dead rank, or the NCCL watchdog's message
# naming the group and the operation (parallel.comm_timeout_s is 20 s here).
. "$(dirname "$0")/lib.sh"
deadline=${TRAINER_KILL_DEADLINE_S:-90}
# TRAINER_KILL_DATA: a folder of train_*.bin / val_*.bin shards to use instead of making some.
if [ -n "${TRAINER_KILL_DATA:-}" ]; then data=$TRAINER_KILL_DATA; else make_corpus; data=$WORK/data; fi
mkdir -p "$WORK/kill"
# shellcheck disable=SC2086
$MPIRUN -np 2 "$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$data/train_*.bin" \
  "data.val=$data/val_*.bin" parallel.dp=2 parallel.comm_timeout_s=20 train.steps=1000000 train.warmup_steps=1 log.every=1 \
  log.metrics= checkpoint.dir= $EXTRA_ARGS < /dev/null > "$WORK/kill/log" 2>&1 &
pid=$!

# The trainer processes this mpirun started, at any depth (mpirun may start a daemon first).
trainers() {
  todo=$1; found=""
  while [ -n "$todo" ]; do
    next=""
    for p in $todo; do
      for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do
        [ "$(ps -o comm= -p "$c" 2>/dev/null)" = trainer ] && found="$found $c" || next="$next $c"
      done
    done
    todo=$next
  done
  echo $found
}

for _ in $(seq 600); do grep -q "^step  *3/" "$WORK/kill/log" && break; sleep 0.1; done
if grep -q "^step  *3/" "$WORK/kill/log"; then pass "the run logs step progress"; else fail "no step 3 in the log"; fi
victims=$(trainers $pid)
victim=${victims##* }
if [ -n "$victim" ]; then pass "trainer processes: $victims"; else fail "no trainer process under mpirun $pid"; fi
t0=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"
ended=0
for _ in $(seq $((deadline * 10))); do
  if ! kill -0 "$pid" 2>/dev/null; then ended=1; break; fi
  sleep 0.1
done
t1=$(date +%s)
if [ "$ended" = 1 ]; then
  status=0; wait "$pid" || status=$?
  pass "the job ended $((t1 - t0)) s after the kill (exit $status)"
  [ "$status" != 0 ] && pass "non-zero exit status" || fail "exit status 0 after a rank was killed"
else
  fail "the job still runs $deadline s after the kill"
  for p in $(trainers $pid); do kill -9 "$p" 2>/dev/null; done
  kill -9 "$pid" 2>/dev/null
fi
echo "--- end of the job's output:"; tail -n 15 "$WORK/kill/log"; echo "---"
if grep -Eqi "signal 9|killed|did not complete within|exited on signal|terminated|aborted" "$WORK/kill/log"; then
  pass "the output says why the job ended"
else
  fail "no message about the dead rank"
fi
summary
