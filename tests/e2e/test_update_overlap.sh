#!/bin/sh
# optimizer.update_overlap: with parallel.shard=weights each layer's update runs on the backend's
# second stream, beside the next forward, whose gather of a layer waits for that layer's update.
# Training must be bit for bit what the update before the step's end gives: every step's loss and
# the checkpoints (written every 2 steps: a checkpoint waits for the update in flight), on dp2
#   - in the act dtype, two micro-batches a step and a tied head;
#   - in FP8 with the head in FP8 (the FP8 copies cast from the gathered layer);
# and a run stopped at step 3 and resumed from its checkpoint ends as the uninterrupted one.
# On CPU ranks the second stream runs in place (the split of the update and its joins are tested);
# TRAINER_TEST_ARGS=train.device=cuda runs it on 2 GPUs, where a gather that did not wait would
# read the old weights.
. "$(dirname "$0")/lib.sh"
make_corpus
W="parallel.dp=2 parallel.shard=weights checkpoint.every=2"
for v in "bf16 train.micro_batch=2 model.tie_embeddings=true" "fp8 train.precision=fp8 fp8.head=true"; do
  set -- $v
  name=$1
  shift
  # shellcheck disable=SC2086
  run "${name}_serial" 2 $W optimizer.update_overlap=false "$@" || fail "$name serial: $(tail -3 "$WORK/${name}_serial/log")"
  # shellcheck disable=SC2086
  run "${name}_overlap" 2 $W optimizer.update_overlap=true "$@" || fail "$name overlap: $(tail -3 "$WORK/${name}_overlap/log")"
  same_losses "${name}_serial" "${name}_overlap" 0 && pass "$name: losses bitwise equal" || fail "$name: losses differ"
  for f in "$WORK/${name}_serial"/ckpt/ckpt_*.h5; do
    if "$BUILD/ckpt_compare" "$f" "$WORK/${name}_overlap/ckpt/${f##*/}" --rtol 0 --prefix "" > /dev/null; then
      pass "$name: ${f##*/} bitwise equal"; else fail "$name: ${f##*/} differs"; fi
  done
done
# shellcheck disable=SC2086
run split 2 $W train.micro_batch=2 model.tie_embeddings=true train.stop_at=3 || fail "first half: $(tail -3 "$WORK/split/log")"
mv "$WORK/split/metrics.jsonl" "$WORK/split/first.jsonl"
# shellcheck disable=SC2086
run split 2 $W train.micro_batch=2 model.tie_embeddings=true checkpoint.resume=auto \
  || fail "second half: $(tail -3 "$WORK/split/log")"
resumed_bitwise bf16_overlap split
summary
