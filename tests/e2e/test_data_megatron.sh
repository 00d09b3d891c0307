#!/bin/sh
# Megatron indexed datasets (PREFIX.bin + PREFIX.idx) as training data: the tiny config trained on
# a Megatron dataset holding the same tokens as a native shard gives bitwise the native losses
# (uint16 and int32 tokens, one dataset and a glob of three), and each damaged dataset gets its
# one-line error (expect_error in lib.sh). The datasets come from tests/tools/megatron_dataset.py,
# a writer independent of the reader. Where Megatron-Core's own builder can be imported (installed,
# or its megatron/core/datasets/indexed_dataset.py named by TRAINER_MEGATRON_INDEXED_DATASET),
# tests/tools/megatron_core_dataset.py writes the same datasets with it: byte for byte the same
# files, and the same losses.
. "$(dirname "$0")/lib.sh"
make_corpus
PY=$(numpy_python) || { echo "no python3 with numpy: install python3-numpy (scripts/setup/setup.sh)"; exit 1; }
MM="$PY $SRC/tests/tools/megatron_dataset.py"
T="$SRC/configs/tiny.yaml"
V="data.val=$WORK/data/val_*.bin"
mkdir -p "$WORK/mm16" "$WORK/mm32" "$WORK/mm3" "$WORK/bad"
$MM "$WORK/data/train_000.bin" "$WORK/mm16/train"
$MM "$WORK/data/val_000.bin" "$WORK/mm16/val"
$MM "$WORK/data/train_000.bin" "$WORK/mm32/train" --dtype int32
# Three native shards, and one Megatron dataset from each.
"$BUILD/prepare" --out "$WORK/data3" --val-fraction 0 --shard-tokens 100000 "$WORK/corpus.txt" > /dev/null
for f in "$WORK"/data3/train_*.bin; do $MM "$f" "$WORK/mm3/$(basename "$f" .bin)"; done

same_run() {  # same_run NAME WHAT KEY=VALUE...: a run equals the native one bit for bit
  name=$1 what=$2
  shift 2
  if launch_retried_args "$name" "$@" && same_losses "$REF" "$name" 0; then pass "$what: losses bitwise equal"
  else fail "$what: losses differ or the run failed"; tail -n 5 "$WORK/$name/log"; fi
}
launch_retried_args() {  # the run of lib.sh, relaunched after a launcher start-up fault
  n=$1
  shift
  for _ in 1 2 3; do
    run "$n" 1 "$@" && return 0
    start_fault "$WORK/$n/log" || return 1
    rm -rf "${WORK:?}/$n"; sleep 5
  done
  return 1
}

launch_retried_args native || { fail "native run"; cat "$WORK/native/log"; }
REF=native
same_run mm16 "uint16 Megatron dataset" "data.train=$WORK/mm16/train.bin" "data.val=$WORK/mm16/val.bin"
same_run mm32 "int32 Megatron dataset" "data.train=$WORK/mm32/train.bin"
MC="$PY $SRC/tests/tools/megatron_core_dataset.py ${TRAINER_MEGATRON_INDEXED_DATASET:+--module $TRAINER_MEGATRON_INDEXED_DATASET}"
if $MC --probe 2> /dev/null; then
  for t in uint16 int32; do
    mkdir -p "$WORK/mc_$t"
    $MC "$WORK/data/train_000.bin" "$WORK/mc_$t/train" --dtype $t > /dev/null
    ours="$WORK/mm16/train"; [ $t = int32 ] && ours="$WORK/mm32/train"
    cmp -s "$WORK/mc_$t/train.idx" "$ours.idx" && cmp -s "$WORK/mc_$t/train.bin" "$ours.bin" &&
      pass "$t: Megatron-Core's IndexedDatasetBuilder writes the test's dataset byte for byte" ||
      fail "$t: Megatron-Core's builder and tests/tools/megatron_dataset.py wrote different files"
    same_run "mc_$t" "$t dataset of Megatron-Core's builder" "data.train=$WORK/mc_$t/train.bin"
  done
else
  echo "skip: Megatron-Core's IndexedDatasetBuilder (not installed; TRAINER_MEGATRON_INDEXED_DATASET names no copy of its file)"
fi
launch_retried_args native3 "data.train=$WORK/data3/train_*.bin" || { fail "native 3-shard run"; cat "$WORK/native3/log"; }
REF=native3
same_run mm3 "glob of three Megatron datasets" "data.train=$WORK/mm3/train_*.bin"

# Damaged datasets: one line each, naming the file and what was expected.
bad() {  # bad NAME PATTERN WRITER-ARGS...: a dataset written so, then trained on, fails with PATTERN
  name=$1 pattern=$2
  shift 2
  $MM "$WORK/data/train_000.bin" "$WORK/bad/$name" "$@"
  expect_error "$name" "$pattern" 1 "$T" "data.train=$WORK/bad/$name.bin" "$V"
}
bad magic "Megatron index .*magic.idx has magic 4d 4d 49 44 49 44 59 00 00; expected \"MMIDIDX" --corrupt magic
bad version "version.idx has version 2; expected version 1" --corrupt version
bad float32 "dtype code 7 (float32); expected code 8 (uint16) or 4 (int32)" --dtype 7
bad int16 "dtype code 3 (int16); expected code 8 (uint16) or 4 (int32)" --dtype 3
bad code99 "dtype code 99 (unknown); expected code 8" --dtype 99
bad truncated "truncated.idx is truncated: its header says" --corrupt truncate-idx
bad header "header.idx is truncated: 20 bytes, expected at least the 34-byte header" --corrupt short-header
bad modes "modes.idx is longer than its header says.*multimodal" --corrupt modes
bad gap "gap.idx: sequence 1 has length .* starts at byte .*; expected .* the start" --corrupt gap
bad binsize "binsize.bin disagrees with its index .*the .bin has" --corrupt bin-size
bad bigtoken "token id 300 but model.vocab_size is 256" --dtype int32 --first-token 300
cp "$WORK/mm16/train.bin" "$WORK/bad/noidx.bin"
expect_error "missing .idx" "noidx.bin starts with magic.*Megatron dataset.*noidx.idx does not exist" 1 "$T" \
  "data.train=$WORK/bad/noidx.bin" "$V"
expect_error ".idx named" "train.idx is the index (.idx) of a Megatron dataset" 1 "$T" \
  "data.train=$WORK/mm16/train.idx" "$V"
summary
