#!/bin/sh
# parallel.shard beyond the optimizer's state: what the run says of each mode, the timing of what
# forward and backward wait for, the one-line refusals of what a mode cannot serve yet, and bitwise
# agreement between the modes where the arithmetic is the same.
# - dp 1: shard=weights is a notice, and the run trains as unsharded;
# - dp2 shard=grads and shard=weights with one micro-batch a step: the same losses and final
#   checkpoint as shard=optimizer bit for bit (each reduce-scatter sums the same two blocks), and
#   weights so in FP8 with the head in FP8 too (the FP8 copies cast from the gathered layer), and
#   weights with three layers gathered ahead, or with a communicator per slot
#   (parallel.gather_copy_engine: the copy engines on GPUs), or every layer kept from forward to
#   backward (parallel.reshard_after_forward=false), as with one;
# - the start-up line names what each rank holds; log.time_dp=true puts the waits into the
#   report's exposed dp comm, the weights' gathers also apart (ms_dp_gather);
# - hybrid sharding (parallel.shard_group=2 of dp4): the start-up line names the groups;
# - grads reducing in bf16 (parallel.grad_compress=bf16) bitwise as the sharded optimizer does;
# - refused: grads with int8 or fp16 compression, or bf16 with error feedback, weights with
#   fp8.param_gather, weights kept from forward to backward in FP8 or on the copy engines, a shard group that does not divide dp, a shard group without sharding or
#   with compression.
. "$(dirname "$0")/lib.sh"
make_corpus
run one 1 parallel.shard=weights || fail "shard=weights on one rank: $(tail -3 "$WORK/one/log")"
grep -q "^parallel.shard=weights: no effect with dp 1" "$WORK/one/log" && pass "dp 1: a notice" \
  || fail "dp 1: no notice in $(grep '^parallel' "$WORK/one/log")"

for mode in optimizer grads weights; do
  run "$mode" 2 parallel.dp=2 "parallel.shard=$mode" train.micro_batch=4 log.time_dp=true \
    || fail "shard=$mode on dp2: $(tail -3 "$WORK/$mode/log")"
done
run weights_p3 2 parallel.dp=2 parallel.shard=weights parallel.shard_prefetch=3 train.micro_batch=4 \
  || fail "shard=weights prefetch 3: $(tail -3 "$WORK/weights_p3/log")"
run weights_ce 2 parallel.dp=2 parallel.shard=weights parallel.gather_copy_engine=true train.micro_batch=4 \
  || fail "shard=weights on the copy engines: $(tail -3 "$WORK/weights_ce/log")"
run weights_nr 2 parallel.dp=2 parallel.shard=weights parallel.reshard_after_forward=false train.micro_batch=4 \
  || fail "shard=weights without resharding after forward: $(tail -3 "$WORK/weights_nr/log")"
for mode in optimizer grads; do  # bf16 reduce-scatters, whatever the buckets
  run "bf16_$mode" 2 parallel.dp=2 "parallel.shard=$mode" train.micro_batch=4 parallel.grad_compress=bf16 \
    || fail "bf16 shard=$mode on dp2: $(tail -3 "$WORK/bf16_$mode/log")"
done
for mode in optimizer weights; do  # FP8: the weights' copies cast from the gathered layer
  run "fp8_$mode" 2 parallel.dp=2 "parallel.shard=$mode" train.micro_batch=4 train.precision=fp8 fp8.head=true \
    || fail "FP8 shard=$mode on dp2: $(tail -3 "$WORK/fp8_$mode/log")"
done
for pair in "optimizer grads" "optimizer weights" "weights weights_p3" "weights weights_ce" "weights weights_nr" \
  "bf16_optimizer bf16_grads" \
  "fp8_optimizer fp8_weights"; do
  set -- $pair
  same_losses "$1" "$2" 0 && pass "$2: losses bitwise those of $1" || fail "$2: losses differ from $1"
  if "$BUILD/ckpt_compare" "$WORK/$1/ckpt/ckpt_00000006.h5" "$WORK/$2/ckpt/ckpt_00000006.h5" --rtol 0 \
    --prefix ""; then pass "$2: final checkpoint bitwise that of $1"; else fail "$2: checkpoints differ from $1"; fi
done
grep -q "^parallel.shard=grads: each rank holds its part (1/2) of the fp32 master weights, AdamW moments and gradients" \
  "$WORK/grads/log" && pass "grads: the start-up line" || fail "grads: $(grep '^parallel.shard' "$WORK/grads/log")"
# Without offload no rank keeps a part of the compute copy: each gather casts it from the masters.
grep -q "^parallel.shard=weights: .* gradients (and the compute copy's gathered layers' slots)" "$WORK/weights/log" \
  && pass "weights: the start-up line" \
  || fail "weights: $(grep '^parallel.shard' "$WORK/weights/log")"
run group2 4 parallel.dp=4 parallel.shard=weights parallel.shard_group=2 \
  || fail "shard_group=2 on dp4: $(tail -3 "$WORK/group2/log")"
grep -q "^parallel.shard=weights: each rank holds its part (1/2) .*; parallel.shard_group: 2 groups of 2 dp ranks" \
  "$WORK/group2/log" && pass "shard_group=2: the start-up line" || fail "shard_group: $(grep '^parallel.shard' "$WORK/group2/log")"
# CPU ranks run a started collective at its wait: the timed waits take time, and with weights
# the gathers' part of them is reported apart (grads has no gathers).
python3 - "$WORK/weights/log" "$WORK/weights/metrics.jsonl" "$WORK/grads/metrics.jsonl" <<'PY' \
  && pass "log.time_dp: the waits are exposed dp comm, the weights' gathers apart" || fail "log.time_dp: no dp comm"
import json, re, sys
m = re.search(r"exposed dp comm ([0-9.]+) \(weights' gathers ([0-9.]+)\)", open(sys.argv[1]).read())
print("exposed dp comm, of it gathers:", m and m.groups())
def gathers(path):
    return [o["ms_dp_gather"] for o in map(json.loads, open(path)) if "step" in o and o["step"] > 1]
w, g = gathers(sys.argv[2]), gathers(sys.argv[3])
print("ms_dp_gather weights", w, "grads", g)
sys.exit(0 if m and float(m.group(1)) >= float(m.group(2)) > 0 and all(x > 0 for x in w) and not any(g) else 1)
PY

T="$SRC/configs/tiny.yaml data.train=$WORK/data/train_*.bin data.val= checkpoint.dir= log.metrics= train.steps=2"
# shellcheck disable=SC2086
expect_error "grads with int8" "parallel.shard = grads .*grad_compress = int8: set parallel.grad_compress=bf16 or none, or parallel.shard=optimizer" 1 \
  $T parallel.shard=grads parallel.grad_compress=int8
# shellcheck disable=SC2086
expect_error "weights in bf16 with error feedback" "parallel.shard = weights reduces each layer's gradients in bf16 without error feedback" 1 \
  $T parallel.shard=weights parallel.grad_compress=bf16 parallel.grad_error_feedback=on
# shellcheck disable=SC2086
expect_error "weights with fp8.param_gather" "parallel.shard = weights .*set fp8.param_gather=false, or parallel.shard=grads" \
  1 $T parallel.shard=weights train.precision=fp8 fp8.param_gather=true
# shellcheck disable=SC2086
expect_error "no resharding in FP8" "parallel.reshard_after_forward = false .*set parallel.reshard_after_forward=true, or train.precision=bf16" \
  1 $T parallel.shard=weights parallel.reshard_after_forward=false train.precision=fp8
# shellcheck disable=SC2086
expect_error "no resharding on the copy engines" "reshard_after_forward = false .*parallel.gather_copy_engine=false" 1 $T \
  parallel.shard=weights parallel.reshard_after_forward=false parallel.gather_copy_engine=true
# shellcheck disable=SC2086
expect_error "shard_group 3 of dp 4" "parallel.shard_group = 3 does not divide parallel.dp = 4" 4 $T \
  parallel.dp=4 parallel.shard=grads parallel.shard_group=3
# shellcheck disable=SC2086
expect_error "shard_group without shard" "parallel.shard_group = 2 shares out sharded state, but parallel.shard = none" 1 \
  $T parallel.shard_group=2
# shellcheck disable=SC2086
expect_error "shard_group with bf16 gradients" "parallel.shard_group = 2 (of dp 4) cannot compress" 4 $T \
  parallel.dp=4 parallel.shard=optimizer parallel.shard_group=2 parallel.grad_compress=bf16
# shellcheck disable=SC2086
expect_error "shard=all" "parallel.shard = 'all' is not one of: none, optimizer, grads, weights" 1 $T parallel.shard=all
summary
