#!/bin/sh
# A write error during a checkpoint ends every rank with one line and exit 1, never a signal or a
# hang, and the previous checkpoint stays the newest complete one, with no temporary left: an I/O
# error injected into one rank's write (TRAINER_TEST_FAIL_IN_CKPT), and a full file system (a small
# tmpfs, where this machine lets the test mount one), each on 1 and 2 ranks. Likewise a non-finite
# value in a tensor of the checkpoint (TRAINER_TEST_NAN_IN_CKPT: one rank's checksum pass counts
# one): no checkpoint of that step is published, and the message names the tensor and the step.
. "$(dirname "$0")/lib.sh"
make_corpus
T="$SRC/configs/tiny.yaml"
D="data.train=$WORK/data/train_*.bin"
V="data.val=$WORK/data/val_*.bin"
run base 1 train.steps=3 || fail "run writing the step-3 checkpoint"

# intact DIR WHAT: DIR holds the step-3 checkpoint alone, sound.
intact() {
  if [ "$(ls -A "$1")" = "ckpt_00000003.h5" ] && "$BUILD/ckpt_verify" "$1/ckpt_00000003.h5" > /dev/null; then
    pass "$2: the step-3 checkpoint is still the newest, sound, no temporary left"
  else fail "$2: checkpoint directory holds: $(ls -A "$1")"; fi
}

for np in 1 2; do
  mkdir -p "$WORK/inject$np"
  cp "$WORK/base/ckpt/ckpt_00000003.h5" "$WORK/inject$np/"
  export TRAINER_TEST_FAIL_IN_CKPT=7
  expect_error "injected write error, $np rank(s)" \
    "checkpoint: writing tensor 'model/layers.2.wq' .*injected write error (test hook)" $np "$T" "$D" "$V" \
    "checkpoint.dir=$WORK/inject$np" checkpoint.resume=auto parallel.tp=$np
  unset TRAINER_TEST_FAIL_IN_CKPT
  intact "$WORK/inject$np" "injected write error, $np rank(s)"
  # A tensor that holds a NaN after the update (its checksum pass counts it) is never published.
  mkdir -p "$WORK/nan$np"
  cp "$WORK/base/ckpt/ckpt_00000003.h5" "$WORK/nan$np/"
  export TRAINER_TEST_NAN_IN_CKPT=7
  expect_error "non-finite weight, $np rank(s)" \
    "checkpoint: step 6 not saved: tensor 'model/layers.2.wq' holds 1 non-finite value (NaN or Inf).*the previous checkpoint stays" \
    $np "$T" "$D" "$V" "checkpoint.dir=$WORK/nan$np" checkpoint.resume=auto parallel.tp=$np
  unset TRAINER_TEST_NAN_IN_CKPT
  intact "$WORK/nan$np" "non-finite weight, $np rank(s)"
done

MNT=$WORK/mnt
mkdir -p "$MNT"
if mount -t tmpfs -o size=6m tmpfs "$MNT" 2> /dev/null; then
  trap 'umount "$MNT" 2> /dev/null || true; rm -rf "$WORK"' EXIT
  mkdir -p "$MNT/ckpt"
  cp "$WORK/base/ckpt/ckpt_00000003.h5" "$MNT/ckpt/"
  avail=$(df -k --output=avail "$MNT" | tail -n 1)
  fallocate -l $(((avail - 1024) * 1024)) "$MNT/filler"  # 1 MiB left: not room for the next checkpoint
  for np in 1 2; do
    expect_error "full disk, $np rank(s)" "checkpoint: checkpoint needs about .* MiB in $MNT/ckpt but the file system cannot hold it" \
      $np "$T" "$D" "$V" "checkpoint.dir=$MNT/ckpt" checkpoint.resume=auto parallel.tp=$np
    intact "$MNT/ckpt" "full disk, $np rank(s)"
  done
  umount "$MNT"
else
  echo "skip: the full-disk cases need a tmpfs, and this machine refuses to mount one (not root?)"
fi
summary
