#!/bin/sh
# Layout parity: test_parity.sh NAME NP [key=value ...] trains the tiny config on NP ranks
# with the given layout and on one rank (same global batch, seed and extra keys), and checks
# that every step's loss and every final parameter tensor agree to 1e-5 relative
# (TRAINER_PARITY_RTOL overrides: the GPU variant in tests/cmake/gpu.cmake uses 2e-2).
. "$(dirname "$0")/lib.sh"
name=$1; np=$2; shift 2
make_corpus
extra=""
for kv in "$@"; do case $kv in model.*) extra="$extra $kv";; esac; done
# shellcheck disable=SC2086
run reference 1 $extra || fail "single-rank run (log: $(cat "$WORK/reference/log"))"
if run "$name" "$np" "$@"; then pass "$name trains on $np ranks"; else fail "$name run"; cat "$WORK/$name/log"; fi
rtol=${TRAINER_PARITY_RTOL:-1e-5}
if same_losses reference "$name" "$rtol"; then pass "$name losses equal the single-rank run (rtol $rtol)"; else fail "$name losses"; fi
if same_weights reference "$name" "$rtol"; then pass "$name weights equal the single-rank run (rtol $rtol)"; else fail "$name weights"; fi
summary
