# Shared by the end-to-end test scripts: paths, mpirun, a small corpus made from this
# repository's own text, runs of the tiny config, and comparisons of losses and weights.
set -eu
SRC=${TRAINER_SOURCE_DIR:?set by ctest}
BUILD=${TRAINER_BUILD_DIR:?set by ctest}
TRAINER=$BUILD/trainer
# Not bound (for np <= 2 Open MPI binds each rank to one core); a --bind-to in
# TRAINER_MPIRUN_ARGS comes later and wins.
MPIRUN="mpirun --oversubscribe --bind-to none ${TRAINER_MPIRUN_ARGS:-}"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
# Extra overrides for every run (the GPU tests pass train.device=cuda and more steps).
EXTRA_ARGS=${TRAINER_TEST_ARGS:-}
export OMP_NUM_THREADS=1
WORK=$(mktemp -d /tmp/trainer-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
N_PASS=0
N_FAIL=0

pass() { N_PASS=$((N_PASS + 1)); echo "ok: $*"; }
fail() { N_FAIL=$((N_FAIL + 1)); echo "FAIL: $*"; }
summary() { echo "$N_PASS passed, $N_FAIL failed"; [ "$N_FAIL" = 0 ] && [ "$N_PASS" -gt 0 ]; }

# start_fault LOG: whether a launch failed in Open MPI's or PMIx's own start-up on a loaded
# machine rather than in the trainer: daemons that did not start ("ORTE was unable to reliably
# start", "ORTE does not know how to route"), a PMIx server that lost a task's connection, or
# Open MPI 4.1's TCP transport between ranks of two stand-in nodes on one host failing while
# the ranks connect ("failed to TCP connect to a peer MPI process ... Operation now in
# progress"): a core dump of such a launch shows one rank killed by a segmentation fault
# inside MPI_Init, in mca_btl_tcp's receive handler calling a null function pointer, before
# the trainer sent a message of its own.
start_fault() {
  grep -qi -e "^ORTE " -e "ORTE was unable" -e "ORTE does not know" -e "failed to TCP connect to a peer" \
    -e "pmix.*lost connection" -e "lost connection.*pmix" "$1"
}
# launch_retried NAME: runs the function NAME, a launch whose folder is $WORK/NAME; a launch that
# failed at start-up (start_fault), and only such a one, runs again from a clean folder, up to
# four launches in all. The fault comes in bursts on a loaded 2-core machine (once, three
# launches in a row within 25 s), so each new launch waits longer: 5, 10, then 20 s.
launch_retried() {
  local n
  for n in 1 2 3 4; do
    "$1" && return 0
    start_fault "$WORK/$1/log" || return 1
    [ "$n" = 4 ] && return 1
    echo "note: $1 failed in the launcher's start-up (launch $n of 4); launching again"
    grep -m3 -i -e "ORTE" -e "TCP connect" -e "lost connection" "$WORK/$1/log" | sed 's/^/  /'
    rm -rf "${WORK:?}/$1"
    sleep $((5 << (n - 1)))
  done
}

# Byte-level shards of a fixed pseudo-English text (300 KB from a seeded LCG over a word
# list), so test data never changes with the code.
make_corpus() {
  python3 - "$WORK/corpus.txt" <<'PY'
import sys
words = ("the of and to in a is that for it as with was on be by at this from have or one had not but "
         "what all were when we there can an your which their said if do will each about how up out them "
         "then she many some so these would other into has more her two like him see time could no make "
         "than first been its who now people my made over did down only way find use may water long little "
         "very after words called just where most know get through back much before go good new write our "
         "used me man too any day same right look think also around another came come work three word must "
         "because does part even place well such here take why things help put years different away again "
         "off went old number great tell men say small every found still between name should home big give "
         "air line set own under read last never us left end along while might next sound below saw "
         "something thought both few those always looked show large often together asked house world going "
         "want school important until form food keep children feet land side without boy once animals life "
         "enough took sometimes four head above kind began almost live page got earth need far hand high").split()
state, out, n = 1234567, [], 0
while n < 300000:
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    w = words[(state >> 33) % len(words)] + (".\n" if (state >> 20) % 13 == 0 else " ")
    out.append(w)
    n += len(w)
open(sys.argv[1], "w").write("".join(out))
PY
  "$BUILD/prepare" --out "$WORK/data" --val-fraction 0.1 "$WORK/corpus.txt" > /dev/null
}

# run NAME NP [key=value ...]: the tiny config on NP ranks; metrics and checkpoints in $WORK/NAME.
run() {
  local run_name=$1 run_np=$2
  shift 2
  mkdir -p "$WORK/$run_name"
  $MPIRUN -np "$run_np" "$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$WORK/data/train_*.bin" \
    "data.val=$WORK/data/val_*.bin" "log.metrics=$WORK/$run_name/metrics.jsonl" \
    "checkpoint.dir=$WORK/$run_name/ckpt" $EXTRA_ARGS "$@" > "$WORK/$run_name/log" 2>&1
}

# losses NAME: "step loss" lines from a run's metrics file.
losses() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    if "step" in o: print(o["step"], repr(o["loss"]))' "$WORK/$1/metrics.jsonl"; }

# same_losses A B RTOL: every step logged by B has the loss A logged, to RTOL relative.
same_losses() {
  python3 - "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def read(p):
    return {o["step"]: o["loss"] for o in map(json.loads, open(p)) if "step" in o}
a, b, rtol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
bad = [(s, a.get(s), l) for s, l in b.items() if s not in a or abs(a[s] - l) > rtol * abs(a[s])]
print("compared %d steps (%s), rtol %g, mismatches %s" % (len(b), sorted(b), rtol, bad))
sys.exit(1 if bad or len(b) < 3 else 0)
PY
}

# same_weights A B RTOL: the final checkpoints' parameters agree (RTOL 0: bitwise).
same_weights() {
  local fa fb
  fa=$(ls "$WORK/$1"/ckpt/ckpt_*.h5 | tail -n 1); fb=$(ls "$WORK/$2"/ckpt/ckpt_*.h5 | tail -n 1)
  "$BUILD/ckpt_compare" "$fa" "$fb" --rtol "$3"
}

# resumed_bitwise A B: run B resumed from its step-3 checkpoint (its log says so) and equals the
# uninterrupted run A bit for bit: every loss B logged, and the step-6 checkpoints (weights and
# optimizer state).
resumed_bitwise() {
  grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/$2/log" && pass "resumed at step 3" || fail "did not resume"
  same_losses "$1" "$2" 0 && pass "losses after resume are bitwise equal" || fail "losses after resume differ"
  if "$BUILD/ckpt_compare" "$WORK/$1/ckpt/ckpt_00000006.h5" "$WORK/$2/ckpt/ckpt_00000006.h5" --rtol 0 --prefix ""; then
    pass "final checkpoints (weights and optimizer state) are bitwise equal"
  else
    fail "final checkpoints differ"
  fi
}

# numpy_python: prints a python3 that has numpy and h5py (Debian's python3-numpy and python3-h5py,
# which scripts/setup/setup.sh installs): the one on PATH, else the system's.
numpy_python() {
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import numpy, h5py' > /dev/null 2>&1; then echo "$p"; return 0; fi
  done
  return 1
}

# expect_fails WHAT PATTERN CMD...: CMD exits non-zero (not by a signal, no crash) and prints a
# line "error: ...PATTERN".
expect_fails() {
  local what=$1 pattern=$2 status
  shift 2
  set +e
  "$@" > "$WORK/out" 2>&1
  status=$?
  set -e
  if [ "$status" = 0 ]; then fail "$what: exit 0"; return; fi
  if [ "$status" -gt 128 ]; then fail "$what: killed by a signal ($status)"; cat "$WORK/out"; return; fi
  if grep -q "error:.*$pattern" "$WORK/out"; then
    pass "$what: $(grep -m1 'error:' "$WORK/out")"
  else
    fail "$what: no message matching '$pattern'"; cat "$WORK/out"
  fi
  if grep -qiE "segmentation|core dumped|backtrace" "$WORK/out"; then fail "$what: crashed"; fi
}

# expect_error WHAT PATTERN NP ARGS...: the trainer on NP ranks with ARGS fails that way.
expect_error() {
  local what=$1 pattern=$2 np=$3
  shift 3
  expect_fails "$what" "$pattern" $MPIRUN -np "$np" "$TRAINER" "$@"
}
