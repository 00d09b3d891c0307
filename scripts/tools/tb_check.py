#!/usr/bin/env python3
"""Checks the trainer's TensorBoard event files with TensorBoard's own reader, on a host where the
`tensorboard` package is installed: every scalar of every step in DIR (log.tensorboard) against the
run's metrics file (log.metrics), tag by tag as docs/metrics.md maps them: equal to within half a
unit of the last digit the metrics file prints (the events hold float32 values unrounded).

    python3 scripts/tools/tb_check.py TB_DIR METRICS.jsonl

Prints one line per tag (steps compared, mismatches) and exits 1 on any mismatch, a step in one
file and not the other, or no event at all. A resumed run's folder holds several event files;
TensorBoard's EventAccumulator reads the folder's newest file only, so each file is read on its
own and the steps gathered (a step in two files must carry the same values).
"""
import decimal
import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

FIELDS = {"loss": "loss", "val_loss": "val_loss", "lr": "lr", "grad_norm": "grad_norm",
          "tokens_per_s": "tokens_per_s", "mfu": "mfu", "mem_gib": "mem_gib",
          "step_ms/data": "ms_data", "step_ms/compute": "ms_compute", "step_ms/tp_comm": "ms_tp_comm",
          "step_ms/pp_comm": "ms_pp_comm", "step_ms/dp_comm": "ms_dp_comm", "step_ms/dp_gather": "ms_dp_gather",
          "step_ms/optimizer": "ms_optimizer"}


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def near(text, value):
    """Whether the float32 value printed as text (a JSON number, or None for a non-finite one) is
    value, to half a unit of the text's last digit and float32's rounding."""
    if text is None:
        return not math.isfinite(value)
    want = float(text)
    unit = 10.0 ** decimal.Decimal(text).as_tuple().exponent
    return abs(want - value) <= unit / 2 + abs(want) * 2.0 ** -23


def events(tb_dir):
    """{tag: {step: value}} over every event file of the folder, each read by EventAccumulator."""
    out, clashes = {}, []
    files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    for path in files:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for ev in acc.Scalars(tag):
                seen = out.setdefault(tag, {})
                if ev.step in seen and not same(seen[ev.step], ev.value):
                    clashes.append(f"{tag} step {ev.step}: {seen[ev.step]} in one file, {ev.value} in {path}")
                seen[ev.step] = ev.value
    return files, out, clashes


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tb_dir, metrics = sys.argv[1], sys.argv[2]
    files, tb, clashes = events(tb_dir)
    if not files or not tb:
        sys.exit(f"tb_check: no scalar events under {tb_dir}")
    rows = [json.loads(line, parse_float=str, parse_int=str) for line in open(metrics) if line.strip()]
    steps = {int(r["step"]): r for r in rows if "step" in r and not r.get("report")}
    bad = list(clashes)
    for tag, field in FIELDS.items():
        want = {s: r[field] for s, r in steps.items() if field in r}
        got = tb.get(tag, {})
        if not want and not got:
            continue
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = [s for s in sorted(set(want) & set(got)) if not near(want[s], got[s])]
        print(f"{tag}: {len(set(want) & set(got))} steps compared, {len(wrong)} differ, {len(missing)} missing, "
              f"{len(extra)} extra")
        bad += [f"{tag} step {s}: metrics {want[s]}, events {got[s]}" for s in wrong[:5]]
        bad += [f"{tag}: steps {missing[:5]} in the metrics file only" for _ in [0] if missing]
        bad += [f"{tag}: steps {extra[:5]} in the events only" for _ in [0] if extra]
    unknown = sorted(set(tb) - set(FIELDS))
    if unknown:
        bad.append(f"tags docs/metrics.md does not list: {unknown}")
    print(f"{len(files)} event file(s), {len(steps)} logged steps")
    if bad:
        print("\n".join("FAIL: " + b for b in bad))
        sys.exit(1)
    print("ok: every scalar at every step equals the metrics file")


if __name__ == "__main__":
    main()
