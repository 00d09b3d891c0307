#!/bin/sh
# scripts/validate/validate_8gpu.sh (the 8-GPU validation) on 8 CPU ranks with a tiny model: the
# five 8-GPU layout configs of the 7B model train, their loss curves agree with tp2 dp4's, the
# DP weak-scaling runs finish, and the summary is printed.
. "$(dirname "$0")/lib.sh"
make_corpus
if TRAINER_VALIDATE_CPU=1 TRAINER_VALIDATE_OUT="$WORK/validate8" TRAINER_VALIDATE_DATA="$WORK/data/train_*.bin" \
   bash "$SRC/scripts/validate/validate_8gpu.sh" "$BUILD" > "$WORK/out.txt" 2>&1; then
  pass "validate_8gpu.sh on 8 CPU ranks: all runs finished and the curves agree"
else
  fail "validate_8gpu.sh: $(tail -30 "$WORK/out.txt")"
fi
for l in 7b_tp2_dp4 7b_tp2_pp2_dp2 7b_tp4_dp2 7b_dp8_distopt 7b_pp4_vpp2; do
  grep -q "^$l  *[0-9]" "$WORK/out.txt" && pass "$l in the summary" || fail "$l missing from the summary"
done
grep -q "^ 8 GPU(s)  *[0-9]" "$WORK/out.txt" && pass "weak scaling to 8 ranks in the summary" || fail "no 8-rank weak-scaling row"
# Split over calls: `summary` alone runs nothing and summarises the runs already there.
v() { TRAINER_VALIDATE_CPU=1 TRAINER_VALIDATE_OUT="$WORK/validate8" bash "$SRC/scripts/validate/validate_8gpu.sh" "$BUILD" 6 "$@"; }
if v summary > "$WORK/summary.txt" 2>&1 && grep -q "^7b_pp4_vpp2  *[0-9]" "$WORK/summary.txt" &&
   ! grep -q "^== " "$WORK/summary.txt"; then
  pass "the summary part reads the earlier runs without running any"
else
  fail "summary part: $(tail -20 "$WORK/summary.txt")"
fi
rm "$WORK/validate8/7b_tp4_dp2.jsonl"
v summary > "$WORK/summary.txt" 2>&1 && fail "summary passed with 7b_tp4_dp2's run missing" || pass "summary fails on a missing run"
rc=0; v 7b_tp2_dp4x > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] && pass "an unknown part is refused" || fail "an unknown part was not refused with exit 2"
summary
