#!/bin/sh
# --dry-run plans every shipped config without allocating, for the config's own rank count when
# no --world-size is given: 7b_tp2_dp4 for its 16 ranks (two nodes of 8), the other 7B layouts
# for 8, and the configs with parallel.dp = 0 for the ranks launched (1 here, which the plan
# says). Each must print its plan and launch lines and exit 0. Then the 16-rank plan's launch
# lines and memory, --gpus-per-node, and --world-size against a config laid out for 16.
. "$(dirname "$0")/lib.sh"
for f in "$SRC"/configs/*.yaml; do
  name=$(basename "$f" .yaml)
  case $name in 7b_tp2_dp4) ranks=16 ;; 7b_dp4_*) ranks=4 ;; 7b_tp*|7b_dp*|7b_pp*) ranks=8 ;; *) ranks=1 ;; esac
  if "$TRAINER" "$f" --dry-run > "$WORK/plan.txt" 2>&1 && grep -q "^plan: $ranks ranks" "$WORK/plan.txt" \
     && grep -q "memory per rank" "$WORK/plan.txt" && grep -q "^  mpirun -np $ranks .*$f$" "$WORK/plan.txt" \
     && grep -q "^  srun --nodes .*$f$" "$WORK/plan.txt"; then
    pass "$name planned for $ranks ranks ($(grep -c '^  [0-9]' "$WORK/plan.txt") rank rows)"
  else
    fail "$name: $(cat "$WORK/plan.txt")"
  fi
  if [ "$ranks" = 1 ]; then
    grep -q "parallel.dp = 0 leaves the rank count to the launch: planned for the 1 rank launched; pass --world-size N" \
      "$WORK/plan.txt" && pass "$name: the plan says dp 0 follows the launch" || fail "$name: no dp 0 note"
  fi
done

C="$SRC/configs/7b_tp2_dp4.yaml"
"$TRAINER" "$C" --dry-run > "$WORK/p16.txt" 2>&1
grep -q "^launch: 16 ranks on 2 nodes of 8 (--gpus-per-node 8); groups inside a node: tp, dp; across nodes: pp$" "$WORK/p16.txt" \
  && grep -q "^  mpirun -np 16 --hostfile HOSTFILE --map-by ppr:8:node .*trainer $C$" "$WORK/p16.txt" \
  && grep -q "^  srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 .*trainer $C$" "$WORK/p16.txt" \
  && pass "7b_tp2_dp4: two nodes of 8, only pp between them, mpirun and srun lines" || fail "7b_tp2_dp4 launch: $(cat "$WORK/p16.txt")"
# The plan's largest rank (GiB) leaves room on an 80 GB H100 for what it does not count (CUDA
# context, workspaces, communicator buffers).
most=$(awk '$1 ~ /^[0-9]+$/ && $NF ~ /G$/ { v = $NF; sub("G", "", v); if (v + 0 > m) m = v + 0 } END { print m }' "$WORK/p16.txt")
python3 -c "import sys; sys.exit(0 if 0 < float(sys.argv[1]) <= 60 else 1)" "$most" \
  && pass "7b_tp2_dp4: at most $most GiB per rank in the plan" || fail "7b_tp2_dp4: $most GiB per rank"
# The expected peak of a GPU run: the fullest rank's total plus the runtime's estimate (2.3 GiB
# on one GPU), and the work buffers in the table.
"$TRAINER" "$SRC/configs/7b_layers.yaml" --dry-run > "$WORK/p1.txt" 2>&1
python3 - "$WORK/p1.txt" <<'PY' && pass "7b_layers: $(grep -m1 '^expected peak' "$WORK/p1.txt" | cut -c1-80)..." \
  || fail "7b_layers expected peak: $(cat "$WORK/p1.txt")"
import re, sys
t = open(sys.argv[1]).read()
row = re.search(r"^  0 +0 .* ([0-9.]+)G +([0-9.]+)G$", t, re.M)
m = re.search(r"^expected peak on the fullest rank: ([0-9.]+) GiB, the table's ([0-9.]+) and about ([0-9.]+) GiB", t, re.M)
work, total = float(row.group(1)), float(row.group(2))
peak, table, runtime = (float(m.group(i)) for i in range(1, 4))
sys.exit(0 if work > 0.5 and table == total and runtime == 2.3 and abs(peak - table - runtime) < 0.06 else 1)
PY
"$TRAINER" "$C" --dry-run --gpus-per-node 4 'data.train=a b/*.bin' > "$WORK/p4.txt" 2>&1
grep -q "^launch: 16 ranks on 4 nodes of 4 (--gpus-per-node 4); groups inside a node: tp; across nodes: dp, pp$" "$WORK/p4.txt" \
  && grep -q "^  srun --nodes 4 --ntasks-per-node 4 --gpus-per-node 4 .*trainer $C 'data.train=a b/\*.bin'$" "$WORK/p4.txt" \
  && pass "--gpus-per-node 4: four nodes, dp and pp across them, overrides quoted" || fail "--gpus-per-node 4: $(cat "$WORK/p4.txt")"
"$TRAINER" "$C" --dry-run --world-size 8 > "$WORK/p8.txt" 2>&1 && fail "--world-size 8 planned a 16-rank config" ||
  { grep -q "error: .*laid out for 16 ranks (mpirun -np 16); to run it on 8, add the override parallel.dp=0" "$WORK/p8.txt" \
    && pass "--world-size 8 names the 16 ranks and parallel.dp=0" || fail "--world-size 8: $(cat "$WORK/p8.txt")"; }
"$TRAINER" "$C" --dry-run --world-size 8 parallel.dp=0 > "$WORK/p8.txt" 2>&1 && grep -q "^plan: 8 ranks = tp 2 x dp 2 x pp 2" "$WORK/p8.txt" \
  && pass "--world-size 8 parallel.dp=0 plans tp 2 x dp 2 x pp 2" || fail "parallel.dp=0 on 8: $(cat "$WORK/p8.txt")"
# parallel.shard: the full 7B on dp4 under each mode; sharding the optimizer's state takes
# 12 bytes a parameter down to 12 / dp and adds the reduced part of the gradients (4 / dp), so
# the two differ by 8 bytes a parameter at dp 4; sharding the gradients too drops their whole
# fp32 buffer but for its staging; the table's fullest rank is this run's.
"$TRAINER" "$SRC/configs/7b.yaml" --dry-run --world-size 4 parallel.dp=4 optimizer.offload=none \
  parallel.shard=optimizer > "$WORK/shard.txt" 2>&1
python3 - "$WORK/shard.txt" <<'PY' && pass "7b dp4: the plan of each shard mode" || fail "7b dp4 shard modes: $(cat "$WORK/shard.txt")"
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"^parallel.shard: the fullest rank needs ([0-9.]+) GiB with none, ([0-9.]+) GiB with optimizer "
              r"\(this run\), ([0-9.]+) GiB with grads, ([0-9.]+) GiB with weights$", t, re.M)
n = float(re.search(r"^  0 +0 .* ([0-9.]+)M ", t, re.M).group(1)) * 1e6
most = max(float(v) for v in re.findall(r"^  \d+ +\d+ .* ([0-9.]+)G$", t, re.M))
none, opt, grads, weights = (float(m.group(i)) for i in range(1, 5))
# grads keeps 1/4 of the fp32 gradients instead of 5/4, plus two slots of a layer (202383360
# elements, a multiple of 4 * 128) and a quarter of one; weights no compute copy but two layers
# gathered (each gather casts this rank's part from the fp32 masters).
layer = 202383360 / 2**30
staging = 4 * (2 + 1 / 4) * layer
print("none %.2f, optimizer %.2f, grads %.2f, weights %.2f, table %.2f, 8 bytes a parameter %.2f, staging %.2f "
      "(GiB)" % (none, opt, grads, weights, most, 8 * n / 2**30, staging))
sys.exit(0 if abs(opt - most) < 0.01 and abs(none - opt - 8 * n / 2**30) < 0.02 and
         abs(opt - grads - (4 * n / 2**30 - staging)) < 0.02 and
         abs(grads - weights - (2 * n / 2**30 - 2 * 2 * layer)) < 0.02 else 1)
PY
# --gpu-mem: the full 7B on dp4 with selective recomputation does not fit 80 GB GPUs with the
# optimizer's state sharded, and the plan names the least sharding that does; with weights it fits.
"$TRAINER" "$SRC/configs/7b.yaml" --dry-run --world-size 4 parallel.dp=4 optimizer.offload=none \
  train.global_batch=8 train.micro_batch=2 train.recompute=selective parallel.shard=optimizer --gpu-mem 80 > "$WORK/fit.txt" 2>&1
grep -q "^fit: .* does not fit; parallel.shard=grads would" "$WORK/fit.txt" && pass "--gpu-mem 80: shard=grads would fit" \
  || fail "--gpu-mem 80: $(grep -E '^fit|error' "$WORK/fit.txt")"
"$TRAINER" "$SRC/configs/7b.yaml" --dry-run --world-size 4 parallel.dp=4 optimizer.offload=none \
  train.global_batch=8 train.micro_batch=2 train.recompute=selective parallel.shard=weights --gpu-mem 80 > "$WORK/fit.txt" 2>&1
grep -q "^fit: .*: fits$" "$WORK/fit.txt" && pass "--gpu-mem 80: shard=weights fits" \
  || fail "--gpu-mem 80 weights: $(grep -E '^fit|error' "$WORK/fit.txt")"
"$TRAINER" "$C" --dry-run --gpu-mem 0 > "$WORK/g0.txt" 2>&1 && fail "--gpu-mem 0 accepted" ||
  { grep -q "error: --gpu-mem needs a whole number of GiB" "$WORK/g0.txt" && pass "--gpu-mem 0 refused" || fail "--gpu-mem 0: $(cat "$WORK/g0.txt")"; }
"$TRAINER" "$C" --dry-run --gpus-per-node x > "$WORK/px.txt" 2>&1 && fail "--gpus-per-node x accepted" ||
  { grep -q "error: --gpus-per-node needs a whole number" "$WORK/px.txt" && pass "--gpus-per-node x refused" || fail "--gpus-per-node x: $(cat "$WORK/px.txt")"; }
summary
