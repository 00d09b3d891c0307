#!/bin/sh
# scripts/profile/timeline/summary.py on a hand-made timeline whose answer is known: two steps of
# 40 us between gradient-norm kernels, each with 15 us of kernels on two overlapping streams and one
# 25 us gap during a host sync, so 37.5% busy and the gap named by its neighbours and the sync;
# a copy to the peer GPU under a GEMM counts as a collective run beside other work. Then
# plot_window.py draws the first step's two streams.
. "$(dirname "$0")/lib.sh"
cat > "$WORK/tl.csv" <<'CSV'
kind,start_ns,end_ns,stream,name
kernel,0,1000,7,"sumsq_ranges_total"
kernel,1000,5000,7,"gemm_a"
kernel,2000,4000,9,"reduce_on_side_stream"
copy,2500,3500,11,"memcpy PtoP 1048576 B"
host,4000,30000,-1,"cudaStreamSynchronize"
kernel,30000,40000,7,"gemm_b"
kernel,40000,41000,7,"sumsq_ranges_total"
kernel,41000,45000,7,"gemm_a"
host,44000,70000,-1,"cudaStreamSynchronize"
kernel,70000,80000,7,"gemm_b"
kernel,80000,81000,7,"sumsq_ranges_total"
CSV
python3 "$SRC/scripts/profile/timeline/summary.py" "$WORK/tl.csv" --skip 0 > "$WORK/out.txt" 2>&1 || fail "summary.py: $(cat "$WORK/out.txt")"
grep -q "^2 steps after the first 0, 0.04 ms per step on the GPU clock: busy 0.01 ms (37.5%), idle 0.03 ms (62.5%)" \
  "$WORK/out.txt" && pass "busy and idle share" || fail "busy/idle line: $(head -1 "$WORK/out.txt")"
grep -Eq "^ +0.025 +1.0 +gemm_a +gemm_b +cudaStreamSynchronize" "$WORK/out.txt" && pass "the gap, its neighbours and the host call" ||
  fail "gap line: $(cat "$WORK/out.txt")"
grep -q "^collectives (NCCL kernels, peer copies) beside the rest, .*(100.0%)" "$WORK/out.txt" &&
  pass "the peer copy counted as a collective beside other work" || fail "collectives line: $(cat "$WORK/out.txt")"
python3 "$SRC/scripts/profile/timeline/summary.py" "$WORK/tl.csv" --marker nosuchkernel > "$WORK/err.txt" 2>&1 &&
  fail "a marker that matches nothing was accepted" || pass "a marker that matches nothing is refused"
grep -q "0 kernels match --marker 'nosuchkernel'" "$WORK/err.txt" && pass "and the message says why" || fail "message: $(cat "$WORK/err.txt")"
PY=python3
$PY -c "import matplotlib" 2> /dev/null || PY=/usr/bin/python3  # apt's matplotlib (setup.sh)
if $PY -c "import matplotlib" 2> /dev/null; then
  $PY "$SRC/scripts/profile/timeline/plot_window.py" "$WORK/tl.csv" "$WORK/w.png" --skip 0 --panel "step:gemm_a:0:40" \
    > "$WORK/plot.txt" 2>&1 && [ "$(head -c 4 "$WORK/w.png" | tail -c 3)" = PNG ] && pass "plot_window.py draws a window" ||
    fail "plot_window.py: $(cat "$WORK/plot.txt")"
  $PY "$SRC/scripts/profile/timeline/plot_window.py" "$WORK/tl.csv" "$WORK/x.png" --skip 0 --panel "step:gemm_a:5:40" \
    > "$WORK/plot.txt" 2>&1 && fail "an anchor past the last match was accepted" ||
    { grep -q "2 operations match 'gemm_a'" "$WORK/plot.txt" && pass "an anchor past the last match is refused, saying why" ||
      fail "message: $(cat "$WORK/plot.txt")"; }
else
  echo "skip: plot_window.py (no matplotlib for python3 or /usr/bin/python3)"
fi
summary
