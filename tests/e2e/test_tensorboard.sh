#!/bin/sh
# TensorBoard event files (log.tensorboard): every scalar of the event file equals the value
# the metrics file holds for the same step (float32 rounding, and the decimals the JSON prints),
# a resumed run adds a second file whose steps continue without repeating one (also when it runs
# again steps the folder holds), a run from step 1 in a used folder gets a notice, a damaged byte
# fails the reader's CRC check, and a folder that cannot be created is refused at start-up.
# The reader (tests/tools/tfevents_read.py) is written from the format alone.
. "$(dirname "$0")/lib.sh"
make_corpus
READER="$SRC/tests/tools/tfevents_read.py"
TB="$WORK/tb/events"
# log.peak_tflops makes mfu appear; eval every 2 steps gives val_loss on some steps.
ARGS="log.tensorboard=$TB log.peak_tflops=0.01 log.eval_every=2 checkpoint.every=3"

# compare: every logged step of the metrics file has the same scalars in the event files of
# $TB (by tag), and no step is written twice across them; the expected step list in $1.
compare() {
  python3 - "$READER" "$TB" "$WORK/tb/metrics.jsonl" "$1" <<'PY'
import glob, importlib.util, json, math, os, struct, sys
spec = importlib.util.spec_from_file_location("tfevents_read", sys.argv[1])
reader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reader)
files = sorted(glob.glob(os.path.join(sys.argv[2], "events.out.tfevents.*")))
events, bad = {}, []
for path in files:
    version, steps = reader.read_events(path)
    if version != "brain.Event:2":
        bad.append("%s: file_version %r" % (path, version))
    for step, values in steps:
        if step in events:
            bad.append("step %d written twice" % step)
        events[step] = values
# A step run again after a resume is logged again in the metrics file; the event files keep the
# first run's values, so each step is compared with its first line.
rows = {}
for o in map(json.loads, open(sys.argv[3])):
    if "step" in o:
        rows.setdefault(o["step"], o)
# Tag -> (JSON field, decimals the JSON prints; None = %.9g).
tags = {"loss": ("loss", None), "val_loss": ("val_loss", None), "lr": ("lr", None),
        "grad_norm": ("grad_norm", None), "tokens_per_s": ("tokens_per_s", 1), "mfu": ("mfu", 4),
        "mem_gib": ("mem_gib", 3), "step_ms/data": ("ms_data", 3), "step_ms/compute": ("ms_compute", 3),
        "step_ms/tp_comm": ("ms_tp_comm", 3), "step_ms/pp_comm": ("ms_pp_comm", 3),
        "step_ms/dp_comm": ("ms_dp_comm", 3), "step_ms/dp_gather": ("ms_dp_gather", 3),
        "step_ms/optimizer": ("ms_optimizer", 3)}
n = 0
if sorted(events) != sorted(rows):
    bad.append("event steps %s, metrics steps %s" % (sorted(events), sorted(rows)))
for step, row in rows.items():
    values = events.get(step, {})
    want = {tag for tag, (field, _) in tags.items() if field in row}
    if set(values) != want:
        bad.append("step %d: tags %s, expected %s" % (step, sorted(values), sorted(want)))
    for tag, value in values.items():
        field, decimals = tags[tag]
        j = row.get(field)
        f32 = struct.unpack("<f", struct.pack("<f", j))[0] if j is not None else None
        # float32 keeps 24 bits; the JSON rounds to its decimals (or 9 significant digits).
        tol = abs(j) * 2.0 ** -24 + (0.5 * 10.0 ** -decimals if decimals is not None else abs(j) * 5e-9)
        if j is None or not math.isfinite(value) or abs(value - j) > tol:
            bad.append("step %d %s: event %r, metrics %r (float32 %r)" % (step, tag, value, j, f32))
        n += 1
expect = [int(s) for s in sys.argv[4].split(",")]
if sorted(events) != expect:
    bad.append("steps %s, expected %s" % (sorted(events), expect))
print("%d files, %d steps, %d scalars compared, problems: %s" % (len(files), len(events), n, bad or "none"))
sys.exit(1 if bad or n == 0 else 0)
PY
}

run tb 1 $ARGS train.stop_at=3 || fail "first run"
grep -q "val_loss" "$WORK/tb/metrics.jsonl" && grep -q "mfu" "$WORK/tb/metrics.jsonl" \
  && pass "the metrics file has val_loss and mfu" || fail "no val_loss or mfu in the metrics file"
[ "$(ls "$TB" | grep -c '^events\.out\.tfevents\.')" = 1 ] && pass "one event file after the first run" \
  || fail "expected one event file: $(ls "$TB")"
compare 1,2,3 && pass "every scalar equals the metrics value (steps 1-3)" || fail "scalars differ from the metrics"

# Resume: a second file; steps 4-6 only, never 1-3 again (possibly within the same second).
run tb 1 $ARGS checkpoint.resume=auto || fail "resumed run"
grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/tb/log" && pass "resumed at step 3" || fail "did not resume"
[ "$(ls "$TB" | grep -c '^events\.out\.tfevents\.')" = 2 ] && pass "a second event file after the resume" \
  || fail "expected two event files: $(ls "$TB")"
compare 1,2,3,4,5,6 && pass "steps continue across the files without a duplicate, values equal the metrics" \
  || fail "resumed event files wrong"

# A damaged byte (in the last record's data) fails the CRC check: the reader can fail.
f=$(ls "$TB"/events.out.tfevents.* | tail -n 1)
cp "$f" "$WORK/damaged"
size=$(wc -c < "$WORK/damaged")
printf 'Z' | dd of="$WORK/damaged" bs=1 seek=$((size - 10)) conv=notrunc 2> /dev/null
python3 "$READER" "$f" > /dev/null && pass "the reader accepts the intact file" \
  || fail "the reader refuses the intact file"
if python3 "$READER" "$WORK/damaged" > "$WORK/damaged.out"; then
  fail "the reader accepted a damaged file"
else
  grep -q "CRC mismatch" "$WORK/damaged.out" && pass "a damaged byte: $(cat "$WORK/damaged.out")" \
    || fail "damaged file refused without a CRC message: $(cat "$WORK/damaged.out")"
fi

# A run stopped between checkpoints resumes from the last one it wrote: the steps it runs again
# (4-6 from step 3's checkpoint) are in the folder already, so the third file adds none of them.
run tb 1 $ARGS "checkpoint.resume=$WORK/tb/ckpt/ckpt_00000003.h5" || fail "second resume from step 3"
[ "$(ls "$TB" | grep -c '^events\.out\.tfevents\.')" = 3 ] && pass "a third event file after the second resume" \
  || fail "expected three event files: $(ls "$TB")"
compare 1,2,3,4,5,6 && pass "steps run again after a resume are not written twice" || fail "steps written twice"
# A run from step 1 in a folder with events of another run: a notice says the curves overlap.
run tb_fresh 1 "log.tensorboard=$TB" train.steps=2 train.warmup_steps=1 || fail "a fresh run in a used folder"
grep -q "log.tensorboard: $TB already holds events up to step 6 of an earlier run" "$WORK/tb_fresh/log" \
  && pass "a fresh run in a used folder is told so" || fail "no notice: $(grep tensorboard "$WORK/tb_fresh/log")"

# A folder under a regular file cannot be created: one line at start-up, before any step.
touch "$WORK/afile"
expect_error "log.tensorboard under a file" "log.tensorboard: cannot create folder $WORK/afile/tb.*log.tensorboard=" 2 \
  "$SRC/configs/tiny.yaml" "data.train=$WORK/data/train_*.bin" "data.val=$WORK/data/val_*.bin" \
  "log.tensorboard=$WORK/afile/tb"
grep -q "^step" "$WORK/out" && fail "steps ran before the refusal" || pass "refused before the first step"
[ "$(grep -c 'error:' "$WORK/out")" = 1 ] && pass "one error line" || fail "expected one error line"
summary
