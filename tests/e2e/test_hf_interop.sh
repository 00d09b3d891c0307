#!/bin/sh
# Hugging Face interop end to end. A few steps of configs/tiny.yaml write a checkpoint; its fp32
# export read back by an independent reader (numpy, tests/tools/hf_export_check.py) equals it bit for
# bit, and a run started from the export (checkpoint.init_from with checkpoint.at_start) writes a
# step-0 checkpoint whose model tensors equal the original bit for bit, on one rank and under
# tp2 and pp2; its step-1 loss equals Llama's forward computed in numpy on the batch the data
# order predicts. Also: a sharded bf16 export, shards written by numpy in fp16, a tied embedding,
# and a resumed checkpoint winning over init_from.
. "$(dirname "$0")/lib.sh"
make_corpus
EXPORT=$BUILD/export_hf
PY=$(numpy_python) || { fail "no python3 with numpy and h5py (Debian: python3-numpy python3-h5py)"; summary; }
CHECK="$PY $SRC/tests/tools/hf_export_check.py"

run base 1 || fail "training run that writes a checkpoint"
CK=$WORK/base/ckpt/ckpt_00000006.h5
"$EXPORT" "$CK" "$WORK/hf32" > "$WORK/export.log" 2>&1 && pass "fp32 export" || fail "fp32 export: $(cat "$WORK/export.log")"
[ -f "$WORK/hf32/model.safetensors" ] && [ ! -f "$WORK/hf32/model.safetensors.index.json" ] \
  && pass "one file under the shard limit" || fail "fp32 export files: $(ls "$WORK/hf32")"
$CHECK check "$CK" "$WORK/hf32" fp32 && pass "numpy reads the fp32 export bitwise" || fail "numpy check of fp32"
"$EXPORT" "$CK" "$WORK/hf16" --dtype bf16 --shard-mb 0.1 > "$WORK/export16.log" 2>&1 && pass "sharded bf16 export" \
  || fail "bf16 export: $(cat "$WORK/export16.log")"
n=$(ls "$WORK/hf16"/model-*-of-*.safetensors 2>/dev/null | wc -l)
[ "$n" -gt 2 ] && [ -f "$WORK/hf16/model.safetensors.index.json" ] && pass "bf16 export in $n shards with an index" \
  || fail "bf16 export files: $(ls "$WORK/hf16")"
$CHECK check "$CK" "$WORK/hf16" bf16 && pass "numpy reads the bf16 shards: round to nearest even" \
  || fail "numpy check of bf16"

# run_from NAME NP DIR [key=value ...]: starts from DIR and writes the step-0 checkpoint.
run_from() {
  local name=$1 np=$2 dir=$3
  shift 3
  run "$name" "$np" "checkpoint.init_from=hf:$dir" checkpoint.at_start=true train.steps=1 train.warmup_steps=0 "$@" \
    || { fail "$name: run from hf:$dir: $(grep error "$WORK/$name/log")"; return 1; }
  grep -q "initialised from hf:$dir" "$WORK/$name/log" || fail "$name: no 'initialised from' line"
}
for layout in "one 1" "tp2 2 parallel.tp=2" "pp2 2 parallel.pp=2"; do
  set -- $layout
  name=$1 np=$2
  shift 2
  run_from "imp_$name" "$np" "$WORK/hf32" "$@" || continue
  if "$BUILD/ckpt_compare" "$CK" "$WORK/imp_$name/ckpt/ckpt_00000000.h5" --rtol 0 --prefix model/; then
    pass "HDF5 -> safetensors -> HDF5 is bitwise ($name)"
  else
    fail "round trip differs ($name)"
  fi
done
$CHECK equals "$WORK/imp_one/ckpt/ckpt_00000000.h5" "$CK" fp32 && pass "fresh optimizer state" \
  || fail "optimizer state after init_from"
# The step-1 loss of the run started from the export equals Llama's forward written out in numpy
# (scripts/tools/hf_check.py --engine numpy) on the batch rebuilt from docs/data.md's sample order.
$PY "$SRC/scripts/tools/hf_check.py" "$WORK/hf32" --engine numpy --global-batch 8 --data "$WORK/data/train_*.bin" \
  --metrics "$WORK/imp_one/metrics.jsonl" --rtol 1e-5 && pass "step-1 loss equals an independent forward" \
  || fail "step-1 loss differs from the numpy forward"

run_from imp_bf16 2 "$WORK/hf16" parallel.tp=2 && \
  $CHECK equals "$WORK/imp_bf16/ckpt/ckpt_00000000.h5" "$CK" bf16 && pass "bf16 shards import under tp2" \
  || fail "bf16 shards import"
$CHECK write-fp16 "$CK" "$WORK/hf_f16" "$WORK/hf32/config.json" > /dev/null && run_from imp_f16 2 "$WORK/hf_f16" \
  parallel.pp=2 && $CHECK equals "$WORK/imp_f16/ckpt/ckpt_00000000.h5" "$CK" fp16 \
  && pass "fp16 shards written by numpy import under pp2" || fail "fp16 shards import"

# Tied embeddings: no lm_head.weight, tie_word_embeddings true, and back bitwise.
run tied 1 model.tie_embeddings=true || fail "tied run"
"$EXPORT" "$WORK/tied/ckpt/ckpt_00000006.h5" "$WORK/hf_tied" > /dev/null && \
  $CHECK check "$WORK/tied/ckpt/ckpt_00000006.h5" "$WORK/hf_tied" fp32 && run_from imp_tied 1 "$WORK/hf_tied" \
  model.tie_embeddings=true && "$BUILD/ckpt_compare" "$WORK/tied/ckpt/ckpt_00000006.h5" \
  "$WORK/imp_tied/ckpt/ckpt_00000000.h5" --rtol 0 && pass "tied embedding round trip" || fail "tied round trip"

# A checkpoint to resume wins over init_from, with a line saying so.
run imp_one 1 "checkpoint.init_from=hf:$WORK/hf32" checkpoint.resume=auto train.steps=2 train.warmup_steps=0 \
  || fail "resume with init_from set"
grep -q "checkpoint.init_from=hf:$WORK/hf32 ignored: resuming from .*ckpt_00000001.h5" "$WORK/imp_one/log" \
  && pass "a resumed checkpoint wins over init_from" || fail "no 'ignored' line: $(head -3 "$WORK/imp_one/log")"
summary
