#!/bin/sh
# build/sample on the GPU against the CPU (label gpu): both decode through the backend table
# (model/decode.c) in fp32 with no TF32, the KV cache in the backend's memory. The default
# model (configs/default.yaml's shape) trains 100 steps on the GPU and checkpoints; from that
# one checkpoint:
#  - the stream loss (every position of 32 windows of seq_len tokens decoded one token at a
#    time through the cache) agrees between --device cpu and --device cuda to 1e-5 relative
#    (only summation orders differ);
#  - greedy continuations of three prompts, to the end of the context, are the same text.
# Without a GPU, --device cuda fails with one line (tests/e2e/test_sample.sh checks that on CPU CI).
. "$(dirname "$0")/../e2e/lib.sh"
SAMPLE=$BUILD/sample
make_corpus
mkdir -p "$WORK/gpu"
"$TRAINER" "$SRC/configs/default.yaml" train.device=cuda train.steps=100 train.warmup_steps=10 \
  "data.train=$WORK/data/train_*.bin" data.val= "checkpoint.dir=$WORK/gpu/ckpt" checkpoint.every=0 log.metrics= \
  > "$WORK/gpu/log" 2>&1 || { fail "training the default model on the GPU: $(grep error "$WORK/gpu/log")"; summary; exit 1; }
CKPT=$WORK/gpu/ckpt/ckpt_00000100.h5

for dev in cpu cuda; do
  "$SAMPLE" "$CKPT" --stream-loss --device "$dev" > "$WORK/stream_$dev" 2> "$WORK/stream_$dev.err" \
    || fail "--stream-loss --device $dev: $(cat "$WORK/stream_$dev.err")"
done
grep -q "decoding in fp32 on cuda" "$WORK/stream_cuda.err" && pass "--device cuda decodes on the GPU" \
  || fail "--device cuda did not say it decodes on cuda: $(cat "$WORK/stream_cuda.err")"
python3 - "$WORK/stream_cpu" "$WORK/stream_cuda" <<'PY' && pass "stream loss: GPU equals CPU to 1e-5" || fail "stream loss differs"
import sys
a, b = (float(open(p).read().rsplit(":", 1)[1]) for p in sys.argv[1:3])
print("cpu %.9g, cuda %.9g, relative difference %.2e" % (a, b, abs(a - b) / abs(a)))
sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)
PY

for prompt in "the people" "and when we" "w"; do
  cpu=$("$SAMPLE" "$CKPT" --prompt "$prompt" --tokens 200 --temperature 0 --device cpu 2> /dev/null)
  gpu=$("$SAMPLE" "$CKPT" --prompt "$prompt" --tokens 200 --temperature 0 --device cuda 2> /dev/null)
  if [ -n "$cpu" ] && [ "$cpu" = "$gpu" ]; then
    pass "greedy '$prompt': the same ${#cpu} bytes on CPU and GPU: $(echo "$cpu" | head -c 60)..."
  else
    fail "greedy '$prompt' differs: cpu '$cpu' / cuda '$gpu'"
  fi
done
summary
