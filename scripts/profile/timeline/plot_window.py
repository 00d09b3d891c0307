#!/usr/bin/env python3
"""A picture of a stretch of a timeline written by cupti_timeline.c (scripts/profile/profile_timeline.sh):
one row per GPU stream, each kernel, copy and memset a bar coloured by what it is (GEMM, attention,
other kernels, copies between GPUs, copies inside one, NCCL's kernels), so that what runs beside
what shows: a tensor-parallel layer's peer copies under its GEMMs, or a collective alone.

Each --panel LABEL:ANCHOR:N:SPAN_US draws the SPAN_US microseconds from the start of the N-th GPU
operation (from 0, counted from the start of the step after --skip steps) whose name holds
ANCHOR; panels stack in the order given.
  plot_window.py TIMELINE.csv OUT.png --panel "forward:rmsnorm_fwd:9:3400" [--panel ...]
      [--marker sumsq_ranges_total] [--skip 1] [--title TEXT]
"""
import argparse
import csv
import sys

CATEGORIES = [  # (test on the name, label, colour), first match wins
    (lambda n: n.startswith("memcpy PtoP"), "copy to/from the peer GPU", "#e6550d"),
    (lambda n: n.startswith("memcpy"), "copy inside the GPU", "#31a354"),
    (lambda n: n.startswith("memset"), "memset", "#bdbdbd"),
    (lambda n: "ncclDevKernel" in n or "ncclKernel" in n, "NCCL kernel", "#de2d26"),
    (lambda n: "nvjet" in n or "gemm" in n.lower() or "cutlass" in n, "GEMM", "#3182bd"),
    (lambda n: "sdpa" in n or "cudnn" in n, "attention (cuDNN)", "#756bb1"),
    (lambda n: True, "other kernel", "#636363"),
]


def category(name):
    for i, (test, _, _) in enumerate(CATEGORIES):
        if test(name):
            return i
    return len(CATEGORIES) - 1


def load(path, marker, skip):
    ops = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["kind"] != "host":
                ops.append((int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), r["name"]))
    ops.sort()
    marks = sorted(e for s, e, st, n in ops if marker in n)
    if len(marks) <= skip:
        sys.exit(f"plot_window.py: {len(marks)} operations match --marker '{marker}'; need more than --skip {skip}")
    t0 = marks[skip]
    return [o for o in ops if o[0] >= t0]


def window(ops, anchor, nth, span_ns):
    hits = [o for o in ops if anchor in o[3]]
    if len(hits) <= nth:
        sys.exit(f"plot_window.py: {len(hits)} operations match '{anchor}' after the start; asked for number {nth}")
    w0 = hits[nth][0]
    return w0, [o for o in ops if o[1] > w0 and o[0] < w0 + span_ns]


def stream_label(ops_of_stream):
    cats = {category(n) for _, _, _, n in ops_of_stream}
    if cats <= {0}:
        return "copy engine (peer copies)"
    if 3 in cats and len(cats - {2}) == 1:
        return "NCCL stream"
    return "compute stream"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline")
    ap.add_argument("out")
    ap.add_argument("--panel", action="append", required=True, help="LABEL:ANCHOR:N:SPAN_US")
    ap.add_argument("--marker", default="sumsq_ranges_total", help="substring of a kernel name that runs once per step")
    ap.add_argument("--skip", type=int, default=1, help="steps to leave out at the start (warm-up)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ops = load(a.timeline, a.marker, a.skip)
    panels = []
    for spec in a.panel:
        parts = spec.split(":")
        if len(parts) != 4:
            sys.exit(f"plot_window.py: --panel '{spec}' is not LABEL:ANCHOR:N:SPAN_US")
        label, anchor, nth, span = parts[0], parts[1], int(parts[2]), float(parts[3])
        w0, sel = window(ops, anchor, nth, span * 1e3)
        panels.append((label, w0, span, sel))

    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.6 + 1.1 * len(panels) * 2), squeeze=False)
    used = set()
    for ax, (label, w0, span, sel) in zip(axes[:, 0], panels):
        streams = sorted({o[2] for o in sel})
        rows = {st: i for i, st in enumerate(streams)}
        for s, e, st, n in sel:
            c = category(n)
            used.add(c)
            x0, x1 = max(s - w0, 0) / 1e3, min(e - w0, span * 1e3) / 1e3
            ax.broken_barh([(x0, max(x1 - x0, 0.5))], (rows[st] - 0.4, 0.8), facecolors=CATEGORIES[c][2],
                           edgecolors="white", linewidth=0.3)
        ax.set_yticks(range(len(streams)))
        ax.set_yticklabels([stream_label([o for o in sel if o[2] == st]) for st in streams])
        ax.set_xlim(0, span)
        ax.set_ylim(-0.6, len(streams) - 0.4)
        ax.invert_yaxis()
        ax.set_title(label, loc="left", fontsize=10)
        ax.set_xlabel("µs")
    axes[0, 0].legend(handles=[Patch(color=CATEGORIES[c][2], label=CATEGORIES[c][1]) for c in sorted(used)],
                      loc="upper center", bbox_to_anchor=(0.5, 1.45), ncol=len(used), fontsize=8, frameon=False)
    if a.title:
        fig.suptitle(a.title, fontsize=10, y=0.995)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}: {len(panels)} panel(s)")


if __name__ == "__main__":
    main()
