#!/bin/sh
# Bitwise resume under a 2-rank layout: test_resume_layout.sh NAME [key=value ...] trains 6 steps
# in one job, and 3 steps, a checkpoint and 3 more steps in a fresh job, on 2 ranks with the given
# layout; the losses and the final checkpoints (weights and optimizer state) must be identical.
# Registered (tests/cmake/e2e.cmake) for dp2 with the distributed optimizer and 10 KiB buckets (the
# master weights and moments gathered from many bucket parts at save and scattered back at
# load), tp2 with SP, and pp2 vpp2 with overlapped bf16 transfers. TRAINER_TEST_ARGS=
# train.device=cuda runs it on GPUs (label gpu).
. "$(dirname "$0")/lib.sh"
name=$1; shift
make_corpus
# shellcheck disable=SC2086
run "$name" 2 "$@" checkpoint.every=3 || fail "uninterrupted run: $(tail -5 "$WORK/$name/log")"
# shellcheck disable=SC2086
run split 2 "$@" checkpoint.every=3 train.stop_at=3 || fail "first half: $(tail -5 "$WORK/split/log")"
mv "$WORK/split/metrics.jsonl" "$WORK/split/first.jsonl"
# shellcheck disable=SC2086
run split 2 "$@" checkpoint.every=3 checkpoint.resume=auto || fail "second half: $(tail -5 "$WORK/split/log")"
resumed_bitwise "$name" split
summary
