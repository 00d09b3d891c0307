#!/bin/sh
# build/sample (app/sample.c, model/decode.c): text from a checkpoint with a KV cache, on the CPU
# backend (tests/gpu/test_sample_gpu.sh compares the CUDA backend with it on a GPU).
#
# The cache is checked against the trainer itself. A tiny run trains 60 steps and checkpoints
# step 59; `sample --stream-loss` on that checkpoint decodes, one token at a time through the
# cache, the global_batch windows step 60 reads (samples 59G .. 60G-1, docs/data.md) and prints
# the mean cross-entropy of their targets. The trainer computed the same number as step 60's
# loss with a full-sequence forward of the same weights (fp32 on CPU ranks), so an error in the
# cache (positions, RoPE offsets, the causal span, GQA head mapping) shows as a different loss;
# only the summation order differs, hence 1e-5 relative rather than bitwise. The model is
# trained that far (lr 3e-3) because near its random init attention is almost uniform and
# position errors barely move the loss: at step 59, keys roped at position 0 move it by 4%.
# Then: greedy output is deterministic, seeded sampling reproduces for its seed and differs for
# another, generation stops at seq_len, and bad input fails with a one-line error.
. "$(dirname "$0")/lib.sh"
SAMPLE=$BUILD/sample
make_corpus
TRAIN="train.steps=60 train.lr=3e-3 checkpoint.every=59 data.val="
run tiny 1 $TRAIN || fail "training the tiny model"
CKPT=$WORK/tiny/ckpt/ckpt_00000059.h5
[ -f "$CKPT" ] && pass "checkpoint of step 59 written" || fail "no checkpoint of step 59"

# 1. The decoder's loss through the cache equals the trainer's step-60 loss, for the tiny model
# and for one whose LM head is the embedding table.
stream_loss_matches() {
  "$SAMPLE" "$WORK/$1/ckpt/ckpt_00000059.h5" --stream-loss > "$WORK/$1/stream" 2>&1 \
    || { fail "$1: --stream-loss"; cat "$WORK/$1/stream"; return; }
  python3 - "$WORK/$1/stream" "$WORK/$1/metrics.jsonl" <<'PY' && pass "$1: KV-cache loss equals the trainer's step 60 loss" \
    || fail "$1: KV-cache loss differs from the trainer's"
import json, sys
got = float(open(sys.argv[1]).read().rsplit(":", 1)[1])
want = [o["loss"] for o in map(json.loads, open(sys.argv[2])) if o.get("step") == 60][0]
print("decoder %.9g, trainer step 60 %.9g, relative difference %.2e" % (got, want, abs(got - want) / want))
sys.exit(0 if abs(got - want) <= 1e-5 * abs(want) else 1)
PY
}
stream_loss_matches tiny
run tied 1 $TRAIN model.tie_embeddings=true || fail "training a tied model"
stream_loss_matches tied

# 2. Determinism: greedy twice, the same seed twice, another seed.
out() { "$SAMPLE" "$CKPT" --prompt "the people" --tokens 16 "$@" 2> /dev/null; }
[ "$(out --temperature 0)" = "$(out --temperature 0 --seed 99)" ] && pass "greedy output is deterministic" \
  || fail "greedy output differs between runs"
a=$(out --temperature 1 --top-p 1 --seed 7); b=$(out --temperature 1 --top-p 1 --seed 7)
c=$(out --temperature 1 --top-p 1 --seed 8)
[ -n "$a" ] && [ "$a" = "$b" ] && pass "seed 7 reproduces: $a" || fail "seed 7 does not reproduce: '$a' / '$b'"
[ "$a" != "$c" ] && pass "seed 8 differs: $c" || fail "seeds 7 and 8 give the same text"
[ "$(out --temperature 1 --top-p 1e-6 --seed 3)" = "$(out --temperature 0)" ] \
  && pass "a nucleus of one token (top-p 1e-6) gives the greedy text" || fail "top-p 1e-6 is not greedy"
case "$a" in "the people"*) pass "the prompt is printed first" ;; *) fail "output does not start with the prompt" ;; esac
n=$(out --temperature 0 | wc -c)
[ "$n" = 27 ] && pass "--tokens 16 adds 16 bytes" || fail "--tokens 16 printed $n bytes"
"$SAMPLE" "$CKPT" --prompt "the" --tokens 100 --temperature 0 > "$WORK/long" 2>&1
grep -q "stopped after 30 tokens: the context reached the model's seq_len 32" "$WORK/long" \
  && pass "generation stops at seq_len" || { fail "no stop at seq_len"; cat "$WORK/long"; }
"$SAMPLE" "$CKPT" --prompt "$(printf 'caf\303\251')" --tokens 0 > "$WORK/esc" 2>&1
grep -qF 'caf\xc3\xa9' "$WORK/esc" && pass "non-printable bytes are escaped" || fail "escaping: $(cat "$WORK/esc")"

# 3. Bad input.
run v128 1 train.steps=2 model.vocab_size=128 data.val= || fail "training a vocab-128 model"
V128=$WORK/v128/ckpt/ckpt_00000002.h5
expect_fails "byte outside a 128-token vocabulary" "prompt byte 0xc3 at offset 3 is outside the model's vocabulary" \
  "$SAMPLE" "$V128" --prompt "$(printf 'caf\303\251')"
"$SAMPLE" "$V128" --prompt "the" --tokens 4 --temperature 0 > /dev/null 2>&1 \
  && pass "a vocab-128 model takes an ASCII prompt" || fail "a vocab-128 model refused an ASCII prompt"
expect_fails "missing checkpoint" "cannot open checkpoint" "$SAMPLE" "$WORK/none.h5" --prompt "x"
expect_fails "prompt longer than seq_len" "33 bytes (tokens), longer than the model's seq_len 32" \
  "$SAMPLE" "$CKPT" --prompt "$(printf '%033d' 0)"
expect_fails "empty prompt" "the prompt is empty" "$SAMPLE" "$CKPT" --prompt ""
expect_fails "top-p 0" "--top-p 0" "$SAMPLE" "$CKPT" --prompt "x" --top-p 0
expect_fails "negative temperature" "--temperature -1" "$SAMPLE" "$CKPT" --prompt "x" --temperature -1
expect_fails "unknown device" "--device tpu: expected auto, cpu or cuda" "$SAMPLE" "$CKPT" --prompt "x" --device tpu
# No GPU visible (none here, or hidden on a GPU host): one line naming the option and the fix.
expect_fails "--device cuda without a GPU" "--device cuda but .*; use --device cpu (or auto)" \
  env CUDA_VISIBLE_DEVICES= "$SAMPLE" "$CKPT" --prompt "x" --device cuda
[ "$(out --temperature 0 --device cpu)" = "$(out --temperature 0)" ] \
  && pass "--device cpu gives the greedy text of the default device here" || fail "--device cpu differs"
summary
