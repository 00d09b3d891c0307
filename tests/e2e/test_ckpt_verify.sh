#!/bin/sh
# Checkpoints are verified, not trusted: build/ckpt_verify and every load name the damage (a
# flipped bit, an Inf in a moment, an out-of-range step, a truncated file, a damaged metadata block)
# in one line, never HDF5's error stack; resume=auto falls back from a damaged checkpoint to the
# previous good one; a version-2 file (no checksums) loads with a notice; a checkpoint at
# train.steps says the run is complete.
. "$(dirname "$0")/lib.sh"
make_corpus
T="$SRC/configs/tiny.yaml"
D="data.train=$WORK/data/train_*.bin"
V="data.val=$WORK/data/val_*.bin"
VERIFY=$BUILD/ckpt_verify
DAMAGE=$BUILD/ckpt_damage

run good 1 checkpoint.every=3 || fail "run writing checkpoints 3 and 6"
C3=$WORK/good/ckpt/ckpt_00000003.h5
C6=$WORK/good/ckpt/ckpt_00000006.h5
if "$VERIFY" "$C3" "$C6" > "$WORK/out" 2>&1 && [ "$(grep -c '^ok: .*checksums and finiteness' "$WORK/out")" = 2 ]; then
  pass "ckpt_verify: sound checkpoints pass: $(head -n 1 "$WORK/out")"
else fail "ckpt_verify on sound checkpoints: $(cat "$WORK/out")"; fi

# damaged NAME OP...: a copy of the step-6 checkpoint damaged by ckpt_damage OP...
damaged() {
  name=$1
  shift
  cp "$C6" "$WORK/$name.h5"
  "$DAMAGE" "$WORK/$name.h5" "$@" || fail "ckpt_damage $name $*"
}
damaged flip flip model/layers.1.wq
damaged inf set optim/exp_avg_sq/layers.0.w_up 3 inf
damaged step attr step 1000000000000000
head -c 1000000 "$C6" > "$WORK/trunc.h5"
# Garbage over the first object headers after the superblock (the root group and its attributes).
cp "$C6" "$WORK/meta.h5"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(800); f.write(b"\xa5" * 1200)' "$WORK/meta.h5"

# expect_verify_fails WHAT PATTERN FILE: ckpt_verify exits 1 with a line naming the problem, no stack.
expect_verify_fails() {
  set +e
  "$VERIFY" "$3" > "$WORK/out" 2>&1
  status=$?
  set -e
  if [ "$status" = 1 ] && grep -q "^error: $3: .*$2" "$WORK/out" && ! grep -q "HDF5-DIAG" "$WORK/out"; then
    pass "ckpt_verify, $1: $(grep -m1 '^error:' "$WORK/out" | cut -c1-200)"
  else fail "ckpt_verify, $1: exit $status: $(cat "$WORK/out")"; fi
}
expect_verify_fails "flipped bit" "tensor 'model/layers.1.wq' fails its checksum" "$WORK/flip.h5"
expect_verify_fails "Inf in a moment" "tensor 'optim/exp_avg_sq/layers.0.w_up' holds a NaN or Inf (element 3)" "$WORK/inf.h5"
expect_verify_fails "huge step" "step = 1000000000000000 and samples_seen = 48 are out of range" "$WORK/step.h5"
expect_verify_fails "truncated file" "does not open as HDF5" "$WORK/trunc.h5"
expect_verify_fails "damaged metadata" "damaged" "$WORK/meta.h5"

# expect_load_fails WHAT PATTERN NP FILE [key=value ...]: resuming from FILE fails that way, one line.
expect_load_fails() {
  what=$1 pattern=$2 np=$3 file=$4
  shift 4
  expect_error "$what" "$pattern" "$np" "$T" "$D" "$V" "checkpoint.resume=$file" "checkpoint.dir=$WORK/x" "$@"
  if grep -q "HDF5-DIAG" "$WORK/out"; then fail "$what: HDF5's error stack printed"; fi
}
expect_load_fails "resume from a flipped bit" "tensor 'model/layers.1.wq' fails its checksum" 1 "$WORK/flip.h5"
expect_load_fails "resume from a flipped bit, 2 ranks tp=2" "tensor 'model/layers.1.wq' fails its checksum" 2 \
  "$WORK/flip.h5" parallel.tp=2
expect_load_fails "resume with an Inf in a moment, 2 ranks dp=2" \
  "tensor 'optim/exp_avg_sq/layers.0.w_up' holds Inf" 2 "$WORK/inf.h5" parallel.dp=2
expect_load_fails "resume from a huge step" "are out of range (expected 0 <= step <= samples_seen)" 1 "$WORK/step.h5"
expect_load_fails "resume from a truncated file" "trunc.h5 is damaged: it does not open as HDF5" 2 "$WORK/trunc.h5"
expect_load_fails "resume from damaged metadata" "damaged" 1 "$WORK/meta.h5"

# resume=auto: the damaged newest checkpoint is skipped with a warning for the previous good one.
mkdir -p "$WORK/auto/ckpt"
cp "$C3" "$WORK/auto/ckpt/"
cp "$WORK/flip.h5" "$WORK/auto/ckpt/ckpt_00000006.h5"
run auto 2 checkpoint.resume=auto train.steps=7 parallel.tp=2 || fail "resume=auto past a damaged checkpoint: $(cat "$WORK/auto/log")"
if grep -q "warning: checkpoint.resume=auto: .*ckpt_00000006.h5: tensor 'model/layers.1.wq' fails its checksum" \
     "$WORK/auto/log" && grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/auto/log"; then
  pass "resume=auto skips the damaged newest checkpoint: $(grep -m1 warning "$WORK/auto/log" | cut -c1-160)"
else fail "resume=auto did not fall back: $(cat "$WORK/auto/log")"; fi
mkdir -p "$WORK/bad/ckpt"
cp "$WORK/flip.h5" "$WORK/bad/ckpt/ckpt_00000006.h5"
cp "$WORK/inf.h5" "$WORK/bad/ckpt/ckpt_00000003.h5"
expect_error "resume=auto with every checkpoint damaged" "no undamaged checkpoint left" 1 "$T" "$D" "$V" \
  "checkpoint.dir=$WORK/bad/ckpt" checkpoint.resume=auto

# A version-2 checkpoint (no checksums) still loads, with a notice.
damaged v2 v2
run v2 1 "checkpoint.resume=$WORK/v2.h5" train.steps=7 || fail "resume from a version-2 checkpoint"
grep -q "note: checkpoint .*v2.h5 has format version 2, without checksums" "$WORK/v2/log" &&
  pass "version-2 checkpoint loads with a notice" || fail "no notice for a version-2 checkpoint: $(cat "$WORK/v2/log")"
"$VERIFY" "$WORK/v2.h5" > "$WORK/out" 2>&1 && grep -q "finiteness only" "$WORK/out" &&
  pass "ckpt_verify on a version-2 checkpoint: $(cat "$WORK/out")" || fail "ckpt_verify, version 2: $(cat "$WORK/out")"

# A data position that is not step x global batch: a note (the batch may have changed), training goes on.
damaged pos attr samples_seen 50
run pos 1 "checkpoint.resume=$WORK/pos.h5" train.steps=7 || fail "resume with samples_seen off the batch grid"
grep -q "note: checkpoint .*pos.h5: samples_seen = 50 is not step 6 times its train.global_batch 8" "$WORK/pos/log" &&
  pass "samples_seen off the batch grid: a note" || fail "no note for samples_seen 50 at step 6: $(cat "$WORK/pos/log")"

# A checkpoint at train.steps: the run is already complete, nothing trained or written.
run done 1 "checkpoint.resume=$C6" train.steps=6 || fail "resume at train.steps: exit status"
if grep -q "is at step 6 and train.steps is 6: the run is already complete" "$WORK/done/log" &&
  ! grep -q "^step" "$WORK/done/log"; then pass "a checkpoint at train.steps says the run is complete"
else fail "resume at train.steps: $(cat "$WORK/done/log")"; fi
summary
