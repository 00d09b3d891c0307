#!/bin/sh
# fp8.param_gather: the distributed optimizer all-gathers the updated FP8 weights as codes, and
# training is bitwise what the compute copy's all-gather gives. Each layout runs the tiny config in
# FP8 with 10 KiB buckets (parts that cut weights and rows anywhere) with fp8.param_gather false and
# true: every step's loss and the final checkpoint (weights and optimizer state) must be equal bit
# for bit, and the start-up line must report codes on the wire and fewer bytes than without:
# - dp2 (delayed scaling; the embedding and the head travel in the act dtype);
# - tp2 x dp2 with SP, current scaling, a tied LM head in FP8 (the embedding lookup reads it, so
#   its buckets travel in the act dtype and its codes are cast after the gather) and bf16 edge layers;
# - dp2 with an FP8 head and the optimizer's state on the host, updated a step late
#   (optimizer.offload_delay: the checkpoints' flush completes the update with the same gather);
# - dp2 with the gradients sharded too (parallel.shard=grads: a bucket per layer).
#   test_param_gather.sh [LAYOUT...]   (dp2, tp2_dp2_tied, dp2_offload, dp2_grads; default all four)
# TRAINER_TEST_ARGS=train.device=cuda runs it on GPUs (label gpu: on 2 GPUs the 2-rank layouts;
# on one GPU all three, over the staged MPI communicator).
. "$(dirname "$0")/lib.sh"
LAYOUTS=${*:-dp2 tp2_dp2_tied dp2_offload dp2_grads}
make_corpus

# gather_line NAME: the start-up line of run NAME; checks it names FP8 codes and fewer bytes.
gather_line() {
  line=$(grep -m1 '^fp8.param_gather:' "$WORK/$1/log" || true)
  if python3 - "$line" <<'PY'
import re, sys
m = re.search(r"in ([0-9.]+) MiB a step \(([0-9.]+) MiB of FP8 codes, ([0-9.]+) MiB in \w+\) instead of ([0-9.]+) MiB",
              sys.argv[1])
sys.exit(0 if m and float(m.group(2)) > 0 and float(m.group(1)) < float(m.group(4)) else 1)
PY
  then pass "$1: $line"; else fail "$1: start-up line '$line' does not show codes on the wire and fewer bytes"; fi
}

# compare NAME NP key=value...: the layout with fp8.param_gather false and true.
compare() {
  name=$1 np=$2
  shift 2
  # shellcheck disable=SC2086
  run "$name" "$np" "$@" || fail "$name without fp8.param_gather: $(tail -5 "$WORK/$name/log")"
  # shellcheck disable=SC2086
  if run "${name}_pg" "$np" "$@" fp8.param_gather=true; then pass "${name}_pg trains"; else
    fail "${name}_pg: $(tail -5 "$WORK/${name}_pg/log")"; return; fi
  gather_line "${name}_pg"
  same_losses "$name" "${name}_pg" 0 && pass "$name: losses bitwise equal" || fail "$name: losses differ"
  fa=$(ls "$WORK/$name"/ckpt/ckpt_*.h5 | tail -n 1); fb=$(ls "$WORK/${name}_pg"/ckpt/ckpt_*.h5 | tail -n 1)
  if [ "${fa##*/}" = "${fb##*/}" ] && "$BUILD/ckpt_compare" "$fa" "$fb" --rtol 0 --prefix ""; then
    pass "$name: final checkpoints (${fa##*/}) bitwise equal"; else fail "$name: final checkpoints differ"; fi
}

Z="train.precision=fp8 parallel.shard=optimizer parallel.bucket_mb=0.01"
for layout in $LAYOUTS; do
  # shellcheck disable=SC2086
  case $layout in
    dp2) compare dp2 2 $Z parallel.dp=2 ;;
    tp2_dp2_tied) compare tp2_dp2_tied 4 $Z parallel.tp=2 parallel.dp=2 parallel.sequence_parallel=true \
      fp8.recipe=current fp8.head=true model.tie_embeddings=true fp8.bf16_edge_layers=true ;;
    dp2_offload) compare dp2_offload 2 $Z parallel.dp=2 fp8.head=true optimizer.offload=host \
      optimizer.offload_update=cpu optimizer.offload_delay=1 checkpoint.every=2 ;;
    dp2_grads) compare dp2_grads 2 train.precision=fp8 parallel.shard=grads parallel.dp=2 ;;
    *) fail "unknown layout '$layout' (dp2, tp2_dp2_tied, dp2_offload, dp2_grads)" ;;
  esac
done
summary
