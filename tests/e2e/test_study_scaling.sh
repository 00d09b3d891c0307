#!/bin/sh
# scripts/study/study.py, a weak-scaling study on CPU ranks (configs/studies/cpu_weak_tiny.yaml: the
# tiny model on 1, 2 and 4 ranks): it passes, the report names every point with its efficiency,
# report.json holds the figures, the four plots are PNGs of 800 x 450 pixels; with two repeats
# the intervals are over repeats; expectations recorded with --update-expectations pass --check,
# and a figure far below its expectation fails it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/study_lib.sh"
make_corpus
study weak "$SRC/configs/studies/cpu_weak_tiny.yaml" --out "$WORK/weak"
expect_rc "weak scaling over 1, 2 and 4 ranks" 0 weak
expect_text "PASS in the report" '^\*\*PASS\*\*' "$WORK/weak/report.md"
for v in dp1 dp2 dp4; do
  expect_text "$v in the runs table" "^\| $v \| [124] \| [124] \| [0-9,]+ " "$WORK/weak/report.md"
done
expect_text "efficiency of dp4 against dp1 with its interval" '^- dp4: 4 CPU ranks, [0-9.]+% of dp1 per CPU rank \(95% interval' \
  "$WORK/weak/report.md"
expect_text "the header names the machine, the commit and the date" '^- Machine: .*CPU .*cores' "$WORK/weak/report.md"
expect_text "the commit" '^- Commit: ([0-9a-f]{12}(-dirty)?|unknown) ' "$WORK/weak/report.md"
"$PY" - "$WORK/weak" <<'PY' && pass "report.json: every variant's figures, efficiency and loss curve" || fail "report.json"
import json, sys
rep = json.load(open(sys.argv[1] + "/report.json"))
assert rep["verdict"] == "PASS" and rep["study"]["interval_over"] == "steps", rep["verdict"]
for v in rep["variants"]:
    f = v["figures"]
    for k in ("tokens_per_s_per_device", "tflops_per_device", "ms_per_step", "ms_compute", "ms_dp_comm",
              "ms_optimizer", "mem_gib", "report_peak_mem_gib", "report_exposed_comm_pct"):
        assert f[k]["lo"] <= f[k]["value"] <= f[k]["hi"], (v["name"], k, f[k])
    assert v["status"] == "ok" and v["efficiency"]["value"] > 0 and len(v["losses"]) == 8, v["name"]
PY
"$PY" - "$WORK/weak" <<'PY' && pass "four PNGs of 800 x 450" || fail "plots"
import struct, sys
for name in ("throughput", "step_split", "loss", "memory"):
    head = open(f"{sys.argv[1]}/{name}.png", "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", name
    assert struct.unpack(">II", head[16:24]) == (800, 450), (name, struct.unpack(">II", head[16:24]))
PY
# Plot titles name the variants whose ranks share GPUs (staged): their figures are no scaling.
"$PY" - "$WORK/weak" "$SRC/scripts/study" <<'PY' && pass "titles name staged variants" || fail "plot titles"
import json, sys
sys.path.insert(0, sys.argv[2])
from studylib import plots
rep = json.load(open(f"{sys.argv[1]}/report.json"))
assert "share GPUs" not in plots.title(rep, "x"), plots.title(rep, "x")
rep["variants"][1]["staged"] = True
t = plots.title(rep, "x")
assert t.endswith(f"\n{rep['variants'][1]['name']}: ranks share GPUs over staged MPI, not a scaling figure"), t
PY
study rep "$SRC/configs/studies/cpu_weak_tiny.yaml" --out "$WORK/rep" --only dp1 dp2 --repeats 2 --no-plots
expect_rc "two repeats of dp1 and dp2" 0 rep
expect_text "intervals over repeats" "mean over the 2 repeats" "$WORK/rep/report.md"
expect_text "dp4 not run, not failed" '^\| dp4 \| 4 \| 4 \| - .*\| not run \|$' "$WORK/rep/report.md"
# Expectations of this machine kind, in a folder of the test's own.
collect upd "$WORK/weak" --update-expectations --expect-dir "$WORK/expect" --no-plots
expect_rc "--update-expectations" 0 upd
ls "$WORK"/expect/cpu-*.json > /dev/null 2>&1 && pass "expectations file named by the CPU model" || fail "no expectations file"
collect chk "$WORK/weak" --check --expect-dir "$WORK/expect" --no-plots
expect_rc "--check against the figures just recorded" 0 chk
"$PY" - "$WORK"/expect/cpu-*.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["studies"]["cpu_weak_tiny"]["dp2"]["figures"]["tokens_per_s_per_device"]["value"] *= 1000
json.dump(d, open(sys.argv[1], "w"))
PY
collect chk2 "$WORK/weak" --check --expect-dir "$WORK/expect" --no-plots
expect_rc "--check with dp2's tokens/s expected 1000 x higher" 1 chk2
expect_text "the figure below its expectation is named" "FAIL: dp2: tokens_per_s_per_device .* below the expected" "$WORK/chk2.txt"
summary
