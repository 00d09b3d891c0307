#!/bin/sh
# FP8: evaluating between steps leaves training alone. Delayed scaling folds a step's amaxes into
# the scales at the next step; an evaluation in between (which records nothing) must not lose
# them. The tiny config in FP8 for 12 steps, evaluated every 3 steps and only at the end: the
# training losses must be bitwise equal.
. "$(dirname "$0")/lib.sh"
make_corpus
run plain 1 train.precision=fp8 train.steps=12 log.eval_every=0 || fail "run without evaluations"
run evals 1 train.precision=fp8 train.steps=12 log.eval_every=3 || fail "run with evaluations"
if same_losses plain evals 0; then pass "training losses are bitwise equal with and without evaluations"
else fail "evaluations changed the training losses"; fi
summary
