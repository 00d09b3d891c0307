#!/bin/sh
# Error feedback's residual (docs/compression.md) across layouts: an int8 dp2 checkpoint of step
# 3 resumes under tp2 dp2 (the same dp: the residual is read, no note), under dp4 (the residual
# starts at zero, with a note) and on one rank (no compression: dropped, with a note); each run
# finishes. The bitwise resume under the same layout is e2e_resume_int8_ef.
. "$(dirname "$0")/lib.sh"
make_corpus
int8="parallel.grad_compress=int8 parallel.bucket_mb=0.05"
# shellcheck disable=SC2086
run dp2 2 parallel.dp=2 $int8 checkpoint.every=3 train.stop_at=3 || fail "dp2 int8 run: $(tail -5 "$WORK/dp2/log")"
ck="$WORK/dp2/ckpt/ckpt_00000003.h5"
if command -v h5ls > /dev/null; then
  h5ls -r "$ck" | grep -q "grad_compress/residual/layers.0.wq .*{2, " \
    && pass "the checkpoint holds a residual per dp rank" || fail "no residual of shape (2, ...) in $ck"
fi
# shellcheck disable=SC2086
run tp2dp2 4 parallel.tp=2 parallel.dp=2 $int8 "checkpoint.resume=$ck" || fail "resume under tp2 dp2"
grep -q "resumed from" "$WORK/tp2dp2/log" && ! grep -q "residual" "$WORK/tp2dp2/log" \
  && pass "tp2 dp2 resumed with the residual, no note" || fail "tp2 dp2: $(grep -i residual "$WORK/tp2dp2/log")"
# shellcheck disable=SC2086
run dp4 4 parallel.dp=4 $int8 "checkpoint.resume=$ck" || fail "resume under dp4"
grep -q "residual of dp 2; this run has dp 4, so the residual starts at zero" "$WORK/dp4/log" \
  && pass "dp4: the residual starts at zero, with a note" || fail "dp4: no note in $(tail -3 "$WORK/dp4/log")"
run one 1 "checkpoint.resume=$ck" || fail "resume on one rank"
grep -q "holds a gradient-compression residual; this run keeps none" "$WORK/one/log" \
  && pass "one rank: the residual is dropped, with a note" || fail "one rank: no note"
summary
