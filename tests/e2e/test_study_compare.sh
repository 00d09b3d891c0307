#!/bin/sh
# scripts/study/study.py, compares on CPU ranks: dp2 against tp2 (configs/studies/cpu_dp2_vs_tp2.yaml,
# the same model and data) passes with loss curves within 1e-5; the same with the candidate's lr
# ten times higher fails on its loss curve. The speed verdict of `expect: faster` on metrics with
# known speeds (the first run's, rewritten): a candidate as fast as the baseline fails, one twice
# as fast passes. A timing of this machine decides nothing here.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/study_lib.sh"
make_corpus
study pass "$SRC/configs/studies/cpu_dp2_vs_tp2.yaml" --out "$WORK/pass"
expect_rc "dp2 against tp2" 0 pass
expect_text "the verdict: speedup with its interval, loss curves within 1e-5" \
  '^- tp2 [0-9.]+ x dp2 \(95% interval [0-9.]+-[0-9.]+, over steps\); loss curves agree: largest relative '\
'difference .* over 8 steps \(tolerance 1e-05\)$' \
  "$WORK/pass/report.md"
ls "$WORK"/pass/throughput.png "$WORK"/pass/step_split.png "$WORK"/pass/loss.png "$WORK"/pass/memory.png > /dev/null &&
  pass "the compare's plots" || fail "plots missing"
sed -e 's/^loss_rtol: 1e-5$/loss_rtol: 0.01/' \
  -e 's/overrides: {parallel.tp: 2}}/overrides: {parallel.tp: 2, train.lr: 1e-2}}/' \
  "$SRC/configs/studies/cpu_dp2_vs_tp2.yaml" > "$WORK/lr10.yaml"
grep -q "train.lr: 1e-2" "$WORK/lr10.yaml" || fail "the lr x 10 study was not written"
study lr10 "$WORK/lr10.yaml" --out "$WORK/lr10" --no-plots
expect_rc "the candidate with lr x 10" 1 lr10
expect_text "FAIL in the report" '^\*\*FAIL\*\*' "$WORK/lr10/report.md"
expect_text "the loss curves differ by more than 1%" "FAIL: tp2: loss curve differs from dp2's: largest relative difference .* \(tolerance 1%\)" \
  "$WORK/lr10.txt"
# expect: faster, on the first study's runs with their tokens/s rewritten to known values.
speed() {  # DIR K: dp2's tokens/s per step := 1000 (+-1%), tp2's := K x as much; the study expects faster
  "$PY" - "$1" "$2" <<'PY'
import json, sys
d, k = sys.argv[1], float(sys.argv[2])
for name, scale in (("dp2", 1.0), ("tp2", k)):
    rows = [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
    for r in rows:
        if "step" in r:
            r["tokens_per_s"] = 1000.0 * scale * (1 + 0.01 * (r["step"] % 3 - 1))
    open(f"{d}/{name}.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in rows))
plan = json.load(open(d + "/plan.json"))
plan["study_text"] += "expect: faster\n"
json.dump(plan, open(d + "/plan.json", "w"))
PY
}
cp -r "$WORK/pass" "$WORK/same"; speed "$WORK/same" 1.0
collect same "$WORK/same" --no-plots
expect_rc "expect: faster, the candidate as fast as the baseline" 1 same
expect_text "the interval that includes 1.0 is named" "FAIL: tp2: expect: faster, but the 95% interval .* includes 1.0" "$WORK/same.txt"
cp -r "$WORK/pass" "$WORK/twice"; speed "$WORK/twice" 2.0
collect twice "$WORK/twice" --no-plots
expect_rc "expect: faster, the candidate twice as fast" 0 twice
expect_text "speedup 2.00" "tp2 2.00 x dp2" "$WORK/twice.txt"
summary
