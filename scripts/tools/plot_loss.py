#!/usr/bin/env python3
"""Loss curves of trainer runs in one PNG: the training loss of every step (thin) and the
validation loss where a run evaluated (markers), one colour per run, read from the metrics JSONL
files the runs wrote (docs/metrics.md). Prints each run's final validation loss and its
difference to the first run's.
  scripts/tools/plot_loss.py OUT.png LABEL=METRICS.jsonl [LABEL=METRICS.jsonl ...] [--title TEXT]
Needs matplotlib."""
import argparse
import json
import sys


def read_run(path):
    steps, losses, val_steps, vals = [], [], [], []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" not in rec or "step" not in rec:
                continue  # the closing report object
            steps.append(rec["step"])
            losses.append(rec["loss"])
            if rec.get("val_loss") is not None:
                val_steps.append(rec["step"])
                vals.append(rec["val_loss"])
    if not steps:
        sys.exit(f"plot_loss: {path} holds no step records; expected a trainer metrics JSONL (log.metrics)")
    return steps, losses, val_steps, vals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", metavar="LABEL=METRICS.jsonl")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    first_val = None
    for spec in a.runs:
        label, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"plot_loss: '{spec}' is not LABEL=METRICS.jsonl")
        steps, losses, val_steps, vals = read_run(path)
        line, = ax.plot(steps, losses, lw=0.6, alpha=0.6, label=f"{label} train")
        if vals:
            ax.plot(val_steps, vals, "o-", ms=3, color=line.get_color(), label=f"{label} val")
            if first_val is None:
                first_val = vals[-1]
            rel = (vals[-1] - first_val) / first_val
            print(f"{label}: final val loss {vals[-1]:.6g} at step {val_steps[-1]} ({rel:+.2%} against the first run)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out)


if __name__ == "__main__":
    main()
