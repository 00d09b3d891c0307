#!/bin/sh
# Bad input to the Hugging Face interop gets one clear message and a non-zero exit on every
# rank, never a crash: a directory that is not a Llama, a shape that differs from the config,
# safetensors files cut inside the header or inside a tensor, and an export over an existing path.
. "$(dirname "$0")/lib.sh"
make_corpus
EXPORT=$BUILD/export_hf
T="$SRC/configs/tiny.yaml"
D="data.train=$WORK/data/train_*.bin"
V="data.val=$WORK/data/val_*.bin"

run small 1 || fail "run that writes a checkpoint"
CK=$WORK/small/ckpt/ckpt_00000006.h5
"$EXPORT" "$CK" "$WORK/hf" > /dev/null || fail "export"

# variant NAME: a copy of the export to damage.
variant() { rm -rf "$WORK/$1"; cp -r "$WORK/hf" "$WORK/$1"; }

variant mistral
sed -i 's/"LlamaForCausalLM"/"MistralForCausalLM"/' "$WORK/mistral/config.json"
expect_error "not a Llama" "architectures is \[\"MistralForCausalLM\"\], expected \[\"LlamaForCausalLM\"\]" 1 "$T" "$D" "$V" \
  "checkpoint.init_from=hf:$WORK/mistral"
expect_error "another shape" "hidden_size is 64 but model.dim is 128" 2 "$T" "$D" "$V" model.dim=128 parallel.tp=2 \
  "checkpoint.init_from=hf:$WORK/hf"
expect_error "another norm epsilon" "rms_norm_eps is 1e-05 but model.norm_eps is 1e-06" 1 "$T" "$D" "$V" \
  model.norm_eps=1e-6 "checkpoint.init_from=hf:$WORK/hf"

variant header
head -c 100 "$WORK/hf/model.safetensors" > "$WORK/header/model.safetensors"
expect_error "truncated header" "safetensors file .*header/model.safetensors: truncated header" 1 "$T" "$D" "$V" \
  "checkpoint.init_from=hf:$WORK/header"
variant tensor
size=$(wc -c < "$WORK/hf/model.safetensors")
head -c $((size - 1000)) "$WORK/hf/model.safetensors" > "$WORK/tensor/model.safetensors"
expect_error "truncated tensor" "tensor/model.safetensors: truncated: tensor 'lm_head.weight' ends at byte" 2 "$T" "$D" "$V" \
  parallel.pp=2 "checkpoint.init_from=hf:$WORK/tensor"
variant noweights
rm "$WORK/noweights/model.safetensors"
expect_error "no weights" "holds neither model.safetensors nor model.safetensors.index.json" 1 "$T" "$D" "$V" \
  "checkpoint.init_from=hf:$WORK/noweights"
expect_error "missing directory" "cannot open $WORK/nope" 1 "$T" "$D" "$V" "checkpoint.init_from=hf:$WORK/nope"
expect_error "init_from without hf:" "checkpoint.init_from = '$WORK/hf': expected hf:DIR" 1 "$T" "$D" "$V" \
  "checkpoint.init_from=$WORK/hf"

expect_fails "export over an existing path" "$WORK/hf exists: pass --force" "$EXPORT" "$CK" "$WORK/hf"
expect_fails "export over a file" "exists and is not a directory" "$EXPORT" "$CK" "$WORK/hf/config.json" --force
expect_fails "export of a missing checkpoint" "cannot open checkpoint $WORK/nope.h5 (No such file" "$EXPORT" "$WORK/nope.h5" "$WORK/out1"
expect_fails "export of a file that is not a checkpoint" "not an HDF5 file" "$EXPORT" "$WORK/hf/config.json" \
  "$WORK/out2"
expect_fails "unknown export dtype" "--dtype fp16: expected fp32 or bf16" "$EXPORT" "$CK" "$WORK/out3" --dtype fp16
"$EXPORT" "$CK" "$WORK/hf" --force > "$WORK/force.log" 2>&1 && pass "--force writes over an earlier export" \
  || fail "--force: $(cat "$WORK/force.log")"
summary
