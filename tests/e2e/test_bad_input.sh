#!/bin/sh
# Bad input gets one clear message and a non-zero exit, never a crash: each case names the
# problem (expect_error in lib.sh).
. "$(dirname "$0")/lib.sh"
make_corpus

T="$SRC/configs/tiny.yaml"
D="data.train=$WORK/data/train_*.bin"
V="data.val=$WORK/data/val_*.bin"
printf 'model:\n  dim: 64\n  dimm: 3\n' > "$WORK/typo.yaml"
expect_error "unknown key" "typo.yaml:3.*unknown key 'model.dimm'" 1 "$WORK/typo.yaml"
printf 'model:\n  dim: 64\ntrain:\n  steps: 3\nmodel:\n  n_layers: 2\n' > "$WORK/twice.yaml"
expect_error "section twice" "twice.yaml:5: section 'model' appears twice (lines 1 and 5)" 1 "$WORK/twice.yaml"
printf 'model:\nlog:\n  every: 1\nmodel: {dim: 64}\n' > "$WORK/twice_empty.yaml"
expect_error "empty section, then the same section" "section 'model' appears twice (lines 1 and 4)" 1 \
  "$WORK/twice_empty.yaml"
printf 'model:\n  dim: 64\n  n_layers: 2\n  dim: 32\n' > "$WORK/key_twice.yaml"
expect_error "key twice" "key_twice.yaml:4: model.dim is set twice (lines 2 and 4)" 1 "$WORK/key_twice.yaml"
printf 'model:\n  dim: &width 64\n  ffn_dim: *width\n' > "$WORK/anchor.yaml"
expect_error "YAML anchor" "anchor.yaml:2: YAML anchor '&width' is not supported" 1 "$WORK/anchor.yaml"
printf 'train:\n  lr: !!float 1e-3\n' > "$WORK/tag.yaml"
expect_error "YAML tag" "tag.yaml:2: YAML tag 'tag:yaml.org,2002:float' is not supported" 1 "$WORK/tag.yaml"
for n in -4 0 abc 3x "" " 4" +4 1048577 99999999999999999999; do
  expect_error "--world-size '$n'" "--world-size needs a whole number of ranks from 1 to 1048576, found '$n'" 1 \
    "$T" --dry-run --world-size "$n"
done
expect_error "--world-size without a value" "--world-size needs a whole number" 1 "$T" --dry-run --world-size
expect_error "unknown key override" "model.nlayers" 1 "$T" model.nlayers=3
expect_error "dim not divisible by n_heads" "model.dim.*model.n_heads" 1 "$T" model.dim=66
expect_error "n_heads not divisible by n_kv_heads" "n_heads.*n_kv_heads" 1 "$T" model.n_kv_heads=3
expect_error "missing config" "cannot open" 1 "$WORK/nope.yaml"
expect_error "missing shard" "no data shard matches" 1 "$T" "data.train=$WORK/none_*.bin" "$V"

head -c 1000 "$WORK/data/train_000.bin" > "$WORK/trunc.bin"
expect_error "truncated shard" "truncated" 1 "$T" "data.train=$WORK/trunc.bin" "$V"
{ printf 'NOTASHRD'; tail -c +9 "$WORK/data/train_000.bin"; } > "$WORK/magic.bin"
expect_error "wrong-magic shard" "magic" 1 "$T" "data.train=$WORK/magic.bin" "$V"
expect_error "token beyond vocab" "vocab_size" 1 "$T" "$D" "$V" model.vocab_size=64 model.dim=64
# A token id of 2^31 - 1 (an int32 shard): named, and no negative vocab_size suggested.
python3 -c '
import struct, sys
toks = [1, 2, 2**31 - 1] + [3] * 200
open(sys.argv[1], "wb").write(b"TRNTOK\0\0" + struct.pack("<IIq", 1, 4, len(toks)) + bytes(40) + struct.pack("<%di" % len(toks), *toks))
' "$WORK/bigtok.bin"
expect_error "token id 2^31-1" "token id 2147483647, beyond the largest model.vocab_size" 1 "$T" "data.train=$WORK/bigtok.bin" "$V"
grep -q "at least -" "$WORK/out" && fail "token id 2^31-1: a negative vocab_size suggested" || true

# Files that are not regular files, or too large or too deep, are refused, never read forever.
mkfifo "$WORK/fifo.yaml" "$WORK/fifo.bin"
expect_error "FIFO as config" "fifo.yaml: config file is a FIFO, not a regular file" 1 "$WORK/fifo.yaml"
expect_error "device as config" "/dev/zero: config file is a device, not a regular file" 1 /dev/zero
expect_error "directory as config" "config file is a directory, not a regular file" 1 "$WORK"
expect_error "FIFO as shard" "fifo.bin is not a regular file" 1 "$T" "data.train=$WORK/fifo.bin" "$V"
expect_error "device as shard" "/dev/zero is not a regular file" 1 "$T" "data.train=/dev/zero" "$V"
expect_error "directory as shard" "is not a regular file" 1 "$T" "data.train=$WORK" "$V"
{ printf 'model:\n  dim: 64\n'; head -c 1100000 /dev/zero | tr '\0' '#'; printf '\n'; } > "$WORK/big.yaml"
expect_error "config over 1 MiB" "big.yaml: config file is 1100018 bytes, more than the 1048576" 1 "$WORK/big.yaml"
python3 -c 'import sys; open(sys.argv[1], "w").write("model:\n  dim: 64\nx: " + "[" * 100 + "]" * 100 + "\n")' "$WORK/deep.yaml"
expect_error "YAML nested 100 deep" "deep.yaml:3: YAML nested deeper than 64 levels" 1 "$WORK/deep.yaml"

run small 1 || fail "run that writes a checkpoint"
expect_error "checkpoint of another model shape" "shape" 1 "$T" "$D" "$V" model.dim=128 \
  "checkpoint.resume=$WORK/small/ckpt/ckpt_00000006.h5" "checkpoint.dir=$WORK/other"
expect_error "missing checkpoint file" "nope.h5" 1 "$T" "$D" "$V" "checkpoint.resume=$WORK/nope.h5"

# An unusable checkpoint.dir is reported at start-up, before the first step.
touch "$WORK/afile"
expect_error "checkpoint.dir under a file" "cannot create checkpoint directory $WORK/afile/ckpt" 2 "$T" "$D" "$V" \
  "checkpoint.dir=$WORK/afile/ckpt"
expect_error "unwritable checkpoint.dir" "checkpoint directory /proc is not writable" 2 "$T" "$D" "$V" checkpoint.dir=/proc
grep -q "^step" "$WORK/out" && fail "unwritable checkpoint.dir: a step ran first" || true

# Layouts refused before anything is allocated.
expect_error "world size not divisible" "world size 3" 3 "$T" "$D" parallel.tp=2
expect_error "7B 16-rank layout on 8 ranks" "laid out for 16 ranks.*override parallel.dp=0" 8 \
  "$SRC/configs/7b_tp2_dp4.yaml" "$D" train.device=cpu
# A job step whose tasks MPI did not connect (srun without a PMI plugin, with an MPI library that
# then starts each task alone; Open MPI refuses that itself in MPI_Init): srun's variables set by
# hand on one plain process, task 0 of 16, which says so; the other tasks stay silent.
if SLURM_STEP_NUM_TASKS=16 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 "$TRAINER" "$T" "$D" > "$WORK/out" 2>&1; then
  fail "a task of srun alone in its MPI world: exit 0"
elif grep -q "error: srun started 16 processes, but MPI_COMM_WORLD holds 1.*srun --mpi=pmix" "$WORK/out"; then
  pass "a task of srun alone in its MPI world: $(cut -c1-100 "$WORK/out")..."
else fail "a task of srun alone in its MPI world: $(cat "$WORK/out")"; fi
expect_error "n_heads not divisible by tp" "n_heads" 8 "$T" "$D" parallel.tp=8
expect_error "n_kv_heads not divisible by tp" "n_kv_heads" 4 "$T" "$D" parallel.tp=4
expect_error "n_layers not divisible by pp*vpp" "n_layers" 2 "$T" "$D" parallel.pp=2 parallel.vpp=4
expect_error "last stage layers that leave an uneven rest" "last_stage_layers = 2" 2 "$T" "$D" parallel.pp=2 \
  parallel.vpp=2 parallel.last_stage_layers=2
expect_error "last stage layers without a pipeline" "needs a pipeline" 1 "$T" "$D" parallel.last_stage_layers=1
expect_error "micro-batches not a multiple of pp for interleaving" "parallel.vpp" 2 "$T" "$D" parallel.pp=2 \
  parallel.vpp=2 train.global_batch=6
expect_error "sequence parallel without tp" "sequence_parallel" 1 "$T" "$D" parallel.sequence_parallel=true
expect_error "seq_len not divisible by tp" "seq_len" 2 "$T" "$D" parallel.tp=2 parallel.sequence_parallel=true \
  model.seq_len=33
expect_error "global batch not divisible" "global_batch" 2 "$T" "$D" parallel.dp=2 train.global_batch=6
expect_error "unknown precision" "train.precision = 'fp16' is not one of" 1 "$T" "$D" train.precision=fp16
expect_error "bf16 on CPU ranks" "train.precision = bf16 with train.device = cpu" 1 "$T" "$D" train.device=cpu \
  train.precision=bf16
expect_error "unknown attention kernel" "train.attention" 1 "$T" "$D" train.attention=flash
expect_error "unknown CPU ISA" "train.cpu_isa" 1 "$T" "$D" train.cpu_isa=neon
expect_error "zero AdamW epsilon" "train.eps = 0 is out of range" 1 "$T" "$D" train.eps=0
expect_error "non-positive collective timeout" "parallel.comm_timeout_s" 1 "$T" "$D" parallel.comm_timeout_s=0
# fp8.param_gather gathers per-tensor FP8 codes for the distributed optimizer.
expect_error "FP8 weight gather without FP8" "fp8.param_gather = true gathers FP8 weights, but train.precision" 2 \
  "$T" "$D" parallel.dp=2 parallel.shard=optimizer fp8.param_gather=true
expect_error "FP8 weight gather with block scaling" "fp8.recipe = block" 2 "$T" "$D" train.precision=fp8 \
  fp8.recipe=block parallel.dp=2 parallel.shard=optimizer fp8.param_gather=true
expect_error "FP8 weight gather without the distributed optimizer" "set parallel.shard=optimizer" 2 \
  "$T" "$D" train.precision=fp8 parallel.dp=2 fp8.param_gather=true
summary
