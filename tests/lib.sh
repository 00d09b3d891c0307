# Shared by the end-to-end test scripts: paths, mpirun, a small corpus made from this
# repository's own text, runs of the tiny config, and comparisons of losses and weights.
set -eu
SRC=${TRAINER_SOURCE_DIR:?set by ctest}
BUILD=${TRAINER_BUILD_DIR:?set by ctest}
TRAINER=$BUILD/trainer
MPIRUN="mpirun --oversubscribe ${TRAINER_MPIRUN_ARGS:-}"
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

# Byte-level shards from the sources and docs of this repository (a few hundred KB of text).
make_corpus() {
  cat "$SRC"/docs/*.md "$SRC"/app/*.c "$SRC"/model/*.c "$SRC"/parallel/*.c > "$WORK/corpus.txt"
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
