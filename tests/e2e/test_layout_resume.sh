#!/bin/sh
# Checkpoints move between layouts and shard modes: a checkpoint written at step 3 under tp2 pp2
# dp2 with the optimizer's state sharded resumes under tp1 pp4 dp2 (sharded), under dp2 unsharded,
# under dp2 with the gradients sharded too, and under one rank; and one written at step 3 by dp2
# with the weights sharded (ZeRO-3) resumes under tp2 dp2 with the optimizer's state sharded; the losses of steps 4-6 equal those of an uninterrupted single-rank run
# to 1e-5. The sharded runs use 10 KiB buckets, so the weights and moments are gathered from, and
# scattered to, many bucket parts.
. "$(dirname "$0")/lib.sh"
make_corpus
run straight 1 checkpoint.every=3 || fail "uninterrupted run"
zero="parallel.shard=optimizer parallel.bucket_mb=0.01"
run tp2pp2dp2 8 parallel.tp=2 parallel.pp=2 parallel.dp=2 $zero checkpoint.every=3 train.stop_at=3 \
  && pass "tp2 pp2 dp2 wrote step 3" || fail "tp2 pp2 dp2 run: $(tail -5 "$WORK/tp2pp2dp2/log")"
ck="$WORK/tp2pp2dp2/ckpt/ckpt_00000003.h5"
run pp4dp2 8 parallel.pp=4 parallel.dp=2 $zero "checkpoint.resume=$ck" || fail "resume under tp1 pp4 dp2"
grep -q "resumed from" "$WORK/pp4dp2/log" && pass "resumed under tp1 pp4 dp2" || fail "no resume under pp4 dp2"
same_losses straight pp4dp2 1e-5 && pass "tp1 pp4 dp2 losses after resume" || fail "tp1 pp4 dp2 losses"
run dp2_none 2 parallel.dp=2 parallel.shard=none "checkpoint.resume=$ck" || fail "resume under dp2 unsharded"
same_losses straight dp2_none 1e-5 && pass "dp2 unsharded losses after resume" || fail "dp2 unsharded losses"
run dp2_grads 2 parallel.dp=2 parallel.shard=grads "checkpoint.resume=$ck" || fail "resume under dp2, gradients sharded"
same_losses straight dp2_grads 1e-5 && pass "dp2 shard=grads losses after resume" || fail "dp2 shard=grads losses"
run dp2_weights 2 parallel.dp=2 parallel.shard=weights checkpoint.every=3 train.stop_at=3 \
  && pass "dp2 shard=weights wrote step 3" || fail "dp2 shard=weights run: $(tail -5 "$WORK/dp2_weights/log")"
run tp2dp2 4 parallel.tp=2 parallel.dp=2 $zero "checkpoint.resume=$WORK/dp2_weights/ckpt/ckpt_00000003.h5" \
  || fail "resume of the shard=weights checkpoint under tp2 dp2"
same_losses straight tp2dp2 1e-5 && pass "tp2 dp2 losses after the shard=weights checkpoint" || fail "tp2 dp2 losses"
run single 1 "checkpoint.resume=$ck" || fail "resume on one rank"
same_losses straight single 1e-5 && pass "one-rank losses after resume" || fail "one-rank losses"
same_weights straight single 1e-5 && pass "one-rank final weights" || fail "one-rank final weights"
summary
