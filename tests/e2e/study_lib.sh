# Shared by the tests of scripts/study/study.py (tests/cmake/study.cmake), after lib.sh: the Python that
# runs it (TRAINER_PYTHON, chosen by study.cmake: one with PyYAML and matplotlib), a runner that
# records the exit status, and checks of its output.
PY=${TRAINER_PYTHON:-python3}
STUDY="$SRC/scripts/study/study.py"

# study NAME ARGS...: scripts/study/study.py ARGS with the test corpus and the trainer of this build;
# output in $WORK/NAME.txt, exit status in $RC.
study() {
  local name=$1
  shift
  set +e
  "$PY" "$STUDY" --trainer "$TRAINER" "--mpirun-args=${TRAINER_MPIRUN_ARGS:-}" \
    --set "data.train=$WORK/data/train_*.bin" "$@" > "$WORK/$name.txt" 2>&1
  RC=$?
  set -e
}

# collect NAME ARGS...: scripts/study/study.py --collect ARGS (no runs); output and $RC as study.
collect() {
  local name=$1
  shift
  set +e
  "$PY" "$STUDY" --collect "$@" > "$WORK/$name.txt" 2>&1
  RC=$?
  set -e
}

# expect_rc WHAT WANT NAME: the last study or collect, whose output is $WORK/NAME.txt, exited with
# WANT and printed no Python traceback.
expect_rc() {
  if [ "$RC" = "$2" ]; then pass "$1: exit $RC"; else fail "$1: exit $RC, expected $2:"; tail -30 "$WORK/$3.txt"; fi
  if grep -q "Traceback" "$WORK/$3.txt"; then fail "$1: a Python traceback:"; cat "$WORK/$3.txt"; fi
}

# expect_text WHAT PATTERN FILE: an extended regular expression FILE must match.
expect_text() {
  if grep -Eq -- "$2" "$3"; then pass "$1"; else fail "$1: no line matches '$2' in $3:"; sed 's/^/    /' "$3" | tail -40; fi
}
