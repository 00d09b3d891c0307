#!/bin/sh
# model.from: hf:DIR takes the model section from a Hugging Face config.json. A short run of a
# non-default shape (2 layers, RMSNorm eps 1e-6, RoPE theta 5e5, a tied head, init std 0.01) is
# exported with build/export_hf. A config with no model keys and model.from pointing at the
# export resolves to that shape and trains from a fresh init of it; with checkpoint.init_from
# on the same directory the step-0 checkpoint holds the exported weights bit for bit, while the
# model keys tiny.yaml sets agree. Then the refusals, each one line naming the field or key: a
# key set to another value, a longer seq_len, another architecture, a field the trainer does
# not know, rope_scaling, a missing directory, and a value without hf:.
. "$(dirname "$0")/lib.sh"
make_corpus
EXPORT=$BUILD/export_hf
SHAPE="model.n_layers=2 model.norm_eps=1e-6 model.rope_theta=500000 model.tie_embeddings=true model.init_std=0.01"
run src 1 $SHAPE train.steps=2 data.val= || fail "the run that writes the checkpoint: $(grep error "$WORK/src/log")"
CK=$WORK/src/ckpt/ckpt_00000002.h5
"$EXPORT" "$CK" "$WORK/hf" > "$WORK/export.log" 2>&1 || fail "export: $(cat "$WORK/export.log")"

# resolved NAME: the model section of the resolved config a run printed, as key=value words.
resolved() { sed -n '/^# resolved config/,/^parallel:/p' "$WORK/$1/log" | sed -n 's/^  \([a-z_]*\): \(.*\)$/\1=\2/p' | tr '\n' ' '; }

# 1. No model keys at all: the shape comes from config.json, and a fresh init of it trains.
: > "$WORK/bare.yaml"
mkdir -p "$WORK/fresh"
$MPIRUN -np 1 "$TRAINER" "$WORK/bare.yaml" "model.from=hf:$WORK/hf" train.steps=1 train.warmup_steps=0 \
  train.global_batch=8 train.micro_batch=2 "data.train=$WORK/data/train_*.bin" data.val= checkpoint.dir= log.metrics= \
  > "$WORK/fresh/log" 2>&1 && pass "a run with only model.from trains (fresh init)" \
  || fail "model.from with a bare config: $(grep error "$WORK/fresh/log")"
want="dim=64 n_layers=2 n_heads=4 n_kv_heads=2 ffn_dim=128 vocab_size=256 seq_len=32 norm_eps=1e-06 rope_theta=500000 \
tie_embeddings=true init_std=0.01 from=\"hf:$WORK/hf\" "
got=$(resolved fresh)
[ "$got" = "$want" ] && pass "resolved model section: $got" || fail "resolved model section: '$got', expected '$want'"

# 2. With checkpoint.init_from on the same directory; tiny.yaml's own model keys (n_layers
# overridden to the export's 2) agree with config.json.
run imp 1 $EXTRA_ARGS model.n_layers=2 "model.from=hf:$WORK/hf" "checkpoint.init_from=hf:$WORK/hf" \
  checkpoint.at_start=true train.steps=1 train.warmup_steps=0 data.val= \
  || fail "model.from with init_from: $(grep error "$WORK/imp/log")"
"$BUILD/ckpt_compare" "$CK" "$WORK/imp/ckpt/ckpt_00000000.h5" --rtol 0 --prefix model/ > "$WORK/cmp.log" 2>&1 \
  && pass "model.from + init_from: the step-0 weights are the export's, bit for bit" \
  || fail "model.from + init_from: weights differ: $(cat "$WORK/cmp.log")"

# 3. Refusals.
T="$SRC/configs/tiny.yaml"
D="data.train=$WORK/data/train_*.bin"
expect_error "a key that disagrees" \
  "model.from=hf:$WORK/hf: $WORK/hf/config.json has num_hidden_layers = 2, but the config sets model.n_layers = 4: remove model.n_layers or set it to 2" \
  1 "$T" "$D" "model.from=hf:$WORK/hf"
expect_error "a float key that disagrees" "rope_theta = 500000, but the config sets model.rope_theta = 10000" 1 "$T" "$D" \
  model.n_layers=2 model.rope_theta=10000 "model.from=hf:$WORK/hf"
expect_error "seq_len past max_position_embeddings" "model.seq_len = 64 is longer than max_position_embeddings = 32" 1 \
  "$T" "$D" model.n_layers=2 model.seq_len=64 "model.from=hf:$WORK/hf"
$MPIRUN -np 1 "$TRAINER" "$T" "$D" model.n_layers=2 model.seq_len=16 "model.from=hf:$WORK/hf" --dry-run > "$WORK/short.log" 2>&1 \
  && pass "a shorter seq_len is accepted" || fail "seq_len 16: $(grep error "$WORK/short.log")"
variant() { rm -rf "$WORK/$1"; cp -r "$WORK/hf" "$WORK/$1"; }
variant mistral
sed -i 's/"LlamaForCausalLM"/"MistralForCausalLM"/' "$WORK/mistral/config.json"
expect_error "another architecture" "model.from: .*architectures is \[\"MistralForCausalLM\"\], expected \[\"LlamaForCausalLM\"\]" \
  1 "$WORK/bare.yaml" "model.from=hf:$WORK/mistral"
variant unknown
sed -i 's/"use_cache": true/"sliding_window": 4096/' "$WORK/unknown/config.json"
expect_error "a field the trainer does not know" "field 'sliding_window' is not one the trainer knows" 1 "$WORK/bare.yaml" \
  "model.from=hf:$WORK/unknown"
variant scaled
sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "linear", "factor": 2.0}/' "$WORK/scaled/config.json"
expect_error "rope_scaling" "rope_scaling is set: the trainer has plain rotary embeddings only" 1 "$WORK/bare.yaml" \
  "model.from=hf:$WORK/scaled"
expect_error "a missing directory" "model.from: cannot open $WORK/nope" 1 "$WORK/bare.yaml" "model.from=hf:$WORK/nope"
expect_error "a value without hf:" "model.from = '$WORK/hf': expected hf:DIR" 1 "$WORK/bare.yaml" "model.from=$WORK/hf"
summary
