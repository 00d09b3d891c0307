#!/bin/sh
# A byte-level BPE tokenizer end to end (tests/fixtures/bpe/gpt2_style.json, vocab 657): prepare
# encodes two text files with a document separator after each, the tiny model trains 3 steps on
# the shards, sample encodes a prompt and prints it back decoded (greedy), export_hf copies the
# tokenizer beside the model and refuses one larger than the model's vocabulary.
. "$(dirname "$0")/lib.sh"
TOK=$SRC/tests/fixtures/bpe/gpt2_style.json
head -c 60000 "$SRC/data/corpus/kjv.txt" > "$WORK/a.txt" 2>/dev/null || yes 'In the beginning God created the heaven and the earth.' | head -n 1000 > "$WORK/a.txt"
printf 'And God said, Let there be light: and there was light.\n' > "$WORK/b.txt"
if "$BUILD/prepare" --tokenizer "$TOK" --eos '<|endoftext|>' --val-fraction 0.1 --out "$WORK/shards" "$WORK/a.txt" \
     "$WORK/b.txt" > "$WORK/prepare.log" 2>&1 && grep -q "the tokenizer's vocab: set model.vocab_size >= 657" "$WORK/prepare.log"; then
  pass "prepare encodes with the tokenizer: $(tail -n 1 "$WORK/prepare.log" | cut -c1-80)..."
else fail "prepare with --tokenizer: $(tail -n 2 "$WORK/prepare.log")"; fi
# The separator (id 656) once after each file: the last token of all, and once more before it.
ids=$(for f in "$WORK"/shards/train_*.bin "$WORK"/shards/val_*.bin; do tail -c +65 "$f" | od -An -v -tu2; done |
  tr -s ' \n' '\n\n' | sed '/^$/d')
[ "$(echo "$ids" | grep -cx 656)" = 2 ] && [ "$(echo "$ids" | tail -n 1)" = 656 ] &&
  pass "the separator after each file" || fail "separators: $(echo "$ids" | grep -cx 656), last $(echo "$ids" | tail -n 1)"
[ "$(echo "$ids" | sort -n | tail -n 1)" -le 656 ] && [ "$(echo "$ids" | wc -l)" -lt 60000 ] &&
  pass "$(echo "$ids" | wc -l | tr -d ' ') tokens for $(cat "$WORK/a.txt" "$WORK/b.txt" | wc -c | tr -d ' ') bytes, all below 657" ||
  fail "token range or count"
"$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$WORK/shards/train_*.bin" "data.val=$WORK/shards/val_*.bin" \
  model.vocab_size=657 train.steps=3 train.warmup_steps=1 log.metrics= "checkpoint.dir=$WORK/ckpt" checkpoint.every=3 \
  $EXTRA_ARGS > "$WORK/train.log" 2>&1 && pass "the tiny model trains on them" || fail "training: $(tail -n 2 "$WORK/train.log")"
ckpt=$WORK/ckpt/ckpt_00000003.h5
cmp -s "$TOK" "$WORK/shards/tokenizer.json" && pass "prepare records the tokenizer beside the shards" ||
  fail "no tokenizer.json beside the shards"
out=$("$BUILD/sample" "$ckpt" --prompt "In the beginning" --tokens 5 --temperature 0 --device cpu 2> "$WORK/sample.err")
case "$out" in "In the beginning"*) grep -q "the tokenizer recorded with the data" "$WORK/sample.err" &&
  pass "sample finds the recorded tokenizer by itself" || fail "sample: no note of the recorded tokenizer" ;;
  *) fail "sample with the recorded tokenizer: '$out'" ;; esac
out=$("$BUILD/sample" "$ckpt" --tokenizer "$TOK" --prompt "In the beginning" --tokens 5 --temperature 0 --device cpu 2> "$WORK/sample.err")
case "$out" in "In the beginning"*) pass "sample prints the prompt decoded: '$(echo "$out" | head -n 1)'" ;;
  *) fail "sample with --tokenizer: '$out'" ;; esac
if "$BUILD/export_hf" "$ckpt" "$WORK/hf" --tokenizer "$TOK" > "$WORK/export.log" 2>&1 && cmp -s "$TOK" "$WORK/hf/tokenizer.json"; then
  pass "export_hf writes the tokenizer beside the model"
else fail "export_hf --tokenizer: $(tail -n 2 "$WORK/export.log")"; fi
"$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$WORK/shards/train_*.bin" "data.val=$WORK/shards/val_*.bin" \
  model.vocab_size=700 train.steps=1 train.warmup_steps=1 log.metrics= "checkpoint.dir=$WORK/small" checkpoint.every=1 \
  > /dev/null 2>&1
python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); t["added_tokens"][0]["id"] = 900
json.dump(t, open(sys.argv[2], "w"))' "$TOK" "$WORK/big.json"
err=$("$BUILD/export_hf" "$WORK/small/ckpt_00000001.h5" "$WORK/hf2" --tokenizer "$WORK/big.json" 2>&1) || true
case "$err" in *"has 901 tokens, more than the model's vocab_size 700"*) pass "a tokenizer larger than the model is refused" ;;
  *) fail "larger tokenizer: '$err'" ;; esac
printf 'bytes again\n' > "$WORK/c.txt"
"$BUILD/prepare" --out "$WORK/shards" "$WORK/c.txt" > "$WORK/prepare2.log" 2>&1
[ ! -e "$WORK/shards/tokenizer.json" ] && grep -q "removed stale .*tokenizer.json" "$WORK/prepare2.log" &&
  pass "byte-level shards into the same folder remove the recorded tokenizer" || fail "stale tokenizer.json kept"
summary
