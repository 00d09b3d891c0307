#!/bin/sh
# Bitwise resume of dp2 with the distributed optimizer: 6 steps in one job equal 3 steps, a
# checkpoint and 3 more steps in a fresh job (same losses, identical final weights and Adam
# moments). 10 KiB buckets, so the master weights and moments are gathered from many bucket
# parts at save and scattered back to them at load. TRAINER_TEST_ARGS=train.device=cuda runs
# it on 2 GPUs (label gpu), where the gathers go through host memory.
. "$(dirname "$0")/lib.sh"
make_corpus
zero="parallel.dp=2 parallel.distributed_optimizer=true parallel.bucket_mb=0.01 checkpoint.every=3"
# shellcheck disable=SC2086
run straight 2 $zero || fail "uninterrupted run: $(tail -5 "$WORK/straight/log")"
# shellcheck disable=SC2086
run split 2 $zero train.stop_at=3 || fail "first half: $(tail -5 "$WORK/split/log")"
mv "$WORK/split/metrics.jsonl" "$WORK/split/first.jsonl"
# shellcheck disable=SC2086
run split 2 $zero checkpoint.resume=auto || fail "second half: $(tail -5 "$WORK/split/log")"
resumed_bitwise straight split
summary
