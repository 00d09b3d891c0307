#!/bin/sh
# parallel.tp_overlap: the tp2 + SP layout trains bit for bit the same whichever way its gathers
# and reduce-scatters run (with two ranks every sum has two terms, so the order cannot change a
# bit): each mode against the communicator's overlapped collectives (nccl), every step's loss and
# the final checkpoint (weights and optimizer state) equal, and the start-up line naming what ran.
#   test_tp_overlap.sh [MODE...]   (none, p2p; default none): p2p needs GPUs with peer access
# PRECISIONS (default "default reduce_bf16"): each a pass of the comparison, as is (default), in
# FP8 (fp8), or with the partial sums of parallel.tp_reduce_dtype in bf16 (reduce_bf16, still two
# terms) or fp32 (reduce_fp32); the default is the activations' dtype (bf16 on GPUs).
# On CPU ranks (no TRAINER_TEST_ARGS) also the refusals: p2p where the ranks are not GPU ranks
# over NCCL, and the notices of a mode and of tp_reduce_dtype with tp 1.
# TRAINER_TEST_ARGS=train.device=cuda runs it on 2 GPUs (label gpu).
. "$(dirname "$0")/lib.sh"
MODES=${*:-none}
make_corpus
TP="parallel.tp=2 parallel.sequence_parallel=true train.steps=12 train.warmup_steps=2"

# startup NAME WORDS: the run's start-up line says the tp collectives ran as WORDS.
startup() {
  line=$(grep -m1 '^tensor parallelism:' "$WORK/$1/log" || true)
  case $line in *"$2"*) pass "$1: $line" ;; *) fail "$1: start-up line '$line' does not say '$2'" ;; esac
}

# compare REF NAME: losses and final checkpoints bitwise equal.
compare() {
  same_losses "$1" "$2" 0 && pass "$2: losses bitwise equal to $1" || fail "$2: losses differ from $1"
  fa=$(ls "$WORK/$1"/ckpt/ckpt_*.h5 | tail -n 1); fb=$(ls "$WORK/$2"/ckpt/ckpt_*.h5 | tail -n 1)
  if [ "${fa##*/}" = "${fb##*/}" ] && "$BUILD/ckpt_compare" "$fa" "$fb" --rtol 0 --prefix ""; then
    pass "$2: final checkpoint (${fa##*/}) bitwise equal to $1's"; else fail "$2: final checkpoints differ"; fi
}

for prec in ${PRECISIONS:-default reduce_bf16}; do
  case $prec in fp8) P="train.precision=fp8" ;; reduce_*) P="parallel.tp_reduce_dtype=${prec#reduce_}" ;; *) P="" ;; esac
  ref=nccl_$prec
  # shellcheck disable=SC2086
  run "$ref" 2 $TP $P parallel.tp_overlap=nccl || { fail "$ref: $(tail -5 "$WORK/$ref/log")"; continue; }
  startup "$ref" "the communicator's collectives"
  case $prec in reduce_*) startup "$ref" "partial sums in ${prec#reduce_}" ;; esac
  for mode in $MODES; do
    name=${mode}_$prec
    # shellcheck disable=SC2086
    if run "$name" 2 $TP $P "parallel.tp_overlap=$mode"; then pass "$name trains"; else
      fail "$name: $(tail -5 "$WORK/$name/log")"; continue; fi
    case $mode in
      none) startup "$name" "not overlapped" ;;
      p2p) startup "$name" "peer copies on the copy engines" ;;
    esac
    compare "$ref" "$name"
  done
done

case ${TRAINER_TEST_ARGS:-} in
  *device=cuda*) ;;
  *)
    # shellcheck disable=SC2086
    expect_error "p2p on CPU ranks" "parallel.tp_overlap=nccl" 2 "$SRC/configs/tiny.yaml" $TP \
      parallel.tp_overlap=p2p checkpoint.dir= log.metrics= "data.train=$WORK/data/train_*.bin" \
      "data.val=$WORK/data/val_*.bin"
    run tp1_p2p 1 parallel.tp_overlap=p2p parallel.tp_reduce_dtype=bf16 train.steps=2 train.warmup_steps=1 \
      && grep -q "parallel.tp_overlap=p2p has no effect" "$WORK/tp1_p2p/log" \
      && grep -q "parallel.tp_reduce_dtype=bf16 has no effect" "$WORK/tp1_p2p/log" \
      && pass "tp 1: $(grep 'has no effect' "$WORK/tp1_p2p/log" | tr '\n' ' ')" \
      || fail "tp 1 with parallel.tp_overlap=p2p parallel.tp_reduce_dtype=bf16: no notice ($(tail -3 "$WORK/tp1_p2p/log"))"
    ;;
esac
summary
