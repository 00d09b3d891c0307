#!/bin/sh
# A data shard changed under a running job: a 2-rank run of the tiny config reads a shard that
# is truncated, or rewritten in place at the same size, once the run logs step 3. The job must end
# with a non-zero status (not a signal: no SIGBUS) and a message naming the shard, and the
# checkpoints it wrote before must still be the complete ones.
. "$(dirname "$0")/lib.sh"
make_corpus

# change_under_run NAME CMD...: starts the run on a copy of the training shard, runs CMD (with
# $shard set) once step 3 is logged, and checks how the job ends.
change_under_run() {
  name=$1
  shift
  mkdir -p "$WORK/$name/data"
  shard=$WORK/$name/data/train_000.bin
  cp "$WORK/data/train_000.bin" "$shard"
  touch -d '2001-01-01' "$shard"  # a rewrite in the same clock tick as the copy still changes the time
  $MPIRUN -np 2 "$TRAINER" "$SRC/configs/tiny.yaml" "data.train=$WORK/$name/data/train_*.bin" data.val= \
    parallel.dp=2 train.steps=1000000 log.every=1 log.metrics= checkpoint.every=2 \
    "checkpoint.dir=$WORK/$name/ckpt" $EXTRA_ARGS < /dev/null > "$WORK/$name/log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "^step  *3/" "$WORK/$name/log" 2> /dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  "$@"
  status=0
  wait $pid || status=$?
  if [ "$status" != 0 ] && [ "$status" -lt 128 ]; then pass "$name: the job ended with exit $status"
  else fail "$name: exit $status, expected a non-zero exit without a signal"; tail -n 20 "$WORK/$name/log"; fi
  if grep -q "error: data.train: data shard $shard changed while the run reads it" "$WORK/$name/log"; then
    pass "$name: $(grep -m1 '^error:' "$WORK/$name/log" | cut -c1-160)..."
  else
    fail "$name: no message naming the shard"; tail -n 20 "$WORK/$name/log"
  fi
  grep -qi "bus error\|signal 7\|SIGBUS" "$WORK/$name/log" && fail "$name: SIGBUS" || true
  newest=$(ls "$WORK/$name/ckpt"/ckpt_*.h5 2>/dev/null | tail -n 1)
  if [ -n "$newest" ] && "$BUILD/ckpt_compare" "$newest" "$newest" --rtol 0 > /dev/null 2>&1; then
    pass "$name: the newest checkpoint $(basename "$newest") reads back"
  else fail "$name: no readable checkpoint left"; fi
}

truncate_shard() { truncate -s 1000 "$shard"; }
rewrite_in_place() { printf 'XXXXXXXX' | dd of="$shard" bs=1 seek=4096 conv=notrunc 2> /dev/null; }
change_under_run truncated truncate_shard
change_under_run rewritten rewrite_in_place
summary
