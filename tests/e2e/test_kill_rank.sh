#!/bin/sh
# Kill a rank: a dp run of the tiny config on TRAINER_KILL_NP ranks (CPU ranks;
# TRAINER_TEST_ARGS=train.device=cuda for the GPU variant) is started, and once it logs step
# progress one trainer process is killed with SIGKILL. The whole job must end, with a non-zero
# status, within TRAINER_KILL_DEADLINE_S (default 90 s) and say why: mpirun's report of the dead
# rank, or the NCCL watchdog's message naming the group and the operation
# (parallel.comm_timeout_s is 20 s here).
#
# Environment (all optional):
#   TRAINER_KILL_SIGNAL    KILL (default): the rank dies, as above. STOP: the rank is stopped
#                          with SIGSTOP and stays alive, so mpirun sees nothing wrong: the other
#                          ranks must end on their own through the NCCL watchdog after
#                          parallel.comm_timeout_s (within the deadline), and the output must hold
#                          the watchdog's message "nccl: group '<name>' <operation> did not
#                          complete within <t> s". mpirun may still wait for the stopped process
#                          (a stopped process keeps a SIGTERM pending): the test then says so and
#                          kills it, and the job must end.
#                          Only meaningful over NCCL on GPUs (train.device=cuda): the CPU ranks'
#                          communicator has no watchdog. The stopped process is continued and
#                          killed when the test ends, whatever happened.
#   TRAINER_KILL_NP        the number of ranks (default 2); the run is parallel.dp=NP unless
#                          TRAINER_TEST_ARGS sets another layout (it comes later and wins).
#   TRAINER_KILL_DEADLINE_S  how long the job may take to end after the signal (default 90).
#   TRAINER_KILL_DATA      a folder of train_*.bin / val_*.bin shards to use instead of making some.
. "$(dirname "$0")/lib.sh"
deadline=${TRAINER_KILL_DEADLINE_S:-90}
sig=${TRAINER_KILL_SIGNAL:-KILL}
np=${TRAINER_KILL_NP:-2}
case $sig in KILL|STOP) ;; *) echo "TRAINER_KILL_SIGNAL must be KILL or STOP, not '$sig'" >&2; exit 2 ;; esac
case $np in ''|*[!0-9]*|0|1) echo "TRAINER_KILL_NP must be a number of ranks >= 2, not '$np'" >&2; exit 2 ;; esac

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

# Whatever is left of the job when the test ends (a failure, an interrupt): every trainer process
# seen, stopped ones continued first so that none stays behind, and mpirun.
pid=""; seen=""
cleanup() {
  [ -n "$pid" ] && seen="$seen $(trainers "$pid")"
  for p in $seen; do
    if [ "$(ps -o comm= -p "$p" 2>/dev/null)" = trainer ]; then
      kill -CONT "$p" 2>/dev/null || true
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
}
trap 'cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

if [ -n "${TRAINER_KILL_DATA:-}" ]; then data=$TRAINER_KILL_DATA; else make_corpus; data=$WORK/data; fi
mkdir -p "$WORK/kill"
# shellcheck disable=SC2086
$MPIRUN -np "$np" "$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$data/train_*.bin" \
  "data.val=$data/val_*.bin" parallel.dp="$np" parallel.comm_timeout_s=20 train.steps=1000000 train.warmup_steps=1 \
  log.every=1 log.metrics= checkpoint.dir= $EXTRA_ARGS < /dev/null > "$WORK/kill/log" 2>&1 &
pid=$!

for _ in $(seq 600); do grep -q "^step  *3/" "$WORK/kill/log" && break; sleep 0.1; done
if grep -q "^step  *3/" "$WORK/kill/log"; then pass "the run logs step progress"; else fail "no step 3 in the log"; fi
victims=$(trainers $pid)
seen=$victims
victim=${victims##* }
if [ -n "$victim" ]; then pass "trainer processes: $victims"; else fail "no trainer process under mpirun $pid"; fi
t0=$(date +%s)
[ -n "$victim" ] && kill -s "$sig" "$victim"
if [ "$sig" = STOP ]; then
  # The other ranks must end on their own; mpirun itself may go on waiting for the stopped one,
  # which only SIGCONT or SIGKILL can end (Open MPI's SIGTERM stays pending on it).
  others=$(echo " $victims " | sed "s/ $victim / /")
  left=$others
  for _ in $(seq $((deadline * 10))); do
    left=""; for p in $others; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -z "$left" ]; then pass "the other ranks ended $(($(date +%s) - t0)) s after SIGSTOP to rank process $victim"
  else fail "rank processes$left still run $deadline s after SIGSTOP to rank process $victim"; fi
  sleep 5
  if kill -0 "$pid" 2>/dev/null; then
    echo "note: mpirun still waits for the stopped process $victim 5 s later; it is killed now"
    kill -KILL "$victim" 2>/dev/null
  fi
fi
ended=0
for _ in $(seq $((deadline * 10))); do
  if ! kill -0 "$pid" 2>/dev/null; then ended=1; break; fi
  sleep 0.1
done
t1=$(date +%s)
if [ "$ended" = 1 ]; then
  status=0; wait "$pid" || status=$?
  pass "the job ended $((t1 - t0)) s after SIG$sig to rank process $victim (exit $status)"
  [ "$status" != 0 ] && pass "non-zero exit status" || fail "exit status 0 after a rank got SIG$sig"
else
  fail "the job still runs $deadline s after SIG$sig to rank process $victim"
fi
cleanup
pid=""
echo "--- end of the job's output:"; tail -n 15 "$WORK/kill/log"; echo "---"
if [ "$sig" = STOP ]; then
  # A stopped rank neither exits nor closes a socket: only the watchdog of a rank waiting for it
  # can end the job, and its message names the group and the operation it waited on.
  msg=$(grep -Eo "nccl: group '[^']+' [a-z][^ ]*( [^ ]+)* did not complete within [0-9.e+]+ s" "$WORK/kill/log" | head -n 1)
  if [ -n "$msg" ]; then pass "the watchdog ended the job: $msg"
  else fail "no NCCL watchdog message naming the group and the operation"; fi
elif grep -Eqi "signal 9|killed|did not complete within|exited on signal|terminated|aborted" "$WORK/kill/log"; then
  pass "the output says why the job ended"
else
  fail "no message about the dead rank"
fi
summary
