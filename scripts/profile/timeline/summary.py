#!/usr/bin/env python3
"""Summary of a timeline written by cupti_timeline.c (scripts/profile/profile_timeline.sh): where a
training step's wall time goes on the GPU, as it ran.

Steps are delimited by the end of a kernel that runs once per step (--marker, a substring of
its name; by default the gradient norm's final sum, which runs once per step where AdamW runs
once per piece of the distributed optimizer's update). Per step: the GPU's busy time (the union of kernels,
copies and memsets over every stream), its idle time, and the idle gaps longer than --gap-us,
each named by the work before and after it and by the host's CUDA calls running during it
(a host-side wait, or a slow launch, shows there). Then the kernels' time per step as they ran,
to set beside Nsight Compute's isolated replays (scripts/profile/profile_kernels.sh). Where the
timeline has collectives (a rank of a multi-GPU run), how much of their time ran beside other work.
  summary.py TIMELINE.csv [--marker sumsq_ranges_total] [--skip 1] [--gap-us 10] [--top 15]
"""
import argparse
import collections
import csv
import sys


def short(name, n=60):
    name = name.split("(")[0]
    return name if len(name) <= n else name[: n - 3] + "..."


def merged(intervals):
    """The union of (start, end) intervals as sorted disjoint ones."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b):
    """Length of the intersection of two unions from merged()."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_comm(name):
    """NCCL's kernels, and copies from one GPU to another (the peer copies of
    parallel.tp_overlap=p2p, on the copy engines)."""
    return "ncclDevKernel" in name or "ncclKernel" in name or name.startswith("memcpy PtoP")


def comm_beside_compute(gpu, t0, t1, n_steps):
    """Collectives (NCCL's kernels, peer copies) against the rest of the GPU's work, per step: how
    long each ran, how much of the collectives' time had computation beside it, and how long the
    GPU ran collectives only (communication the step waited for)."""
    comm, comp = [], []
    for s, e, n, k in gpu:
        if e > t0 and s < t1:
            (comm if is_comm(n) else comp).append((max(s, t0), min(e, t1)))
    if not comm:
        return
    comm, comp = merged(comm), merged(comp)
    c_len, p_len = sum(e - s for s, e in comm), sum(e - s for s, e in comp)
    both = overlap(comm, comp)
    ms = lambda v: v / n_steps / 1e6  # noqa: E731
    print(f"\ncollectives (NCCL kernels, peer copies) beside the rest, ms per step: collectives running {ms(c_len):.2f}, of "
          f"which beside other work {ms(both):.2f} ({100 * both / c_len:.1f}%) and alone {ms(c_len - both):.2f}; "
          f"other work running {ms(p_len):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline")
    ap.add_argument("--marker", default="sumsq_ranges_total", help="substring of a kernel name that runs once per step")
    ap.add_argument("--skip", type=int, default=1, help="steps to leave out at the start (warm-up)")
    ap.add_argument("--gap-us", type=float, default=10.0, help="idle gaps shorter than this are not listed")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()

    gpu, host = [], []
    with open(a.timeline) as f:
        for r in csv.DictReader(f):
            rec = (int(r["start_ns"]), int(r["end_ns"]), r["name"], r["kind"])
            (host if r["kind"] == "host" else gpu).append(rec)
    gpu.sort()
    host.sort()
    marks = sorted(e for s, e, n, k in gpu if k == "kernel" and a.marker in n)
    if len(marks) < a.skip + 2:
        sys.exit(f"summary.py: {len(marks)} kernels match --marker '{a.marker}'; need at least {a.skip + 2} "
                 f"(one per step: train more steps or pick another marker)")
    windows = list(zip(marks[a.skip:-1], marks[a.skip + 1:]))
    t0, t1 = windows[0][0], windows[-1][1]
    n_steps = len(windows)

    # The union of GPU work in [t0, t1), walking intervals by start: gaps are where nothing runs.
    busy = 0
    gaps = []  # (length, start, end, before, after)
    cur_end, before = t0, "(step start)"
    for s, e, n, k in gpu:
        if e <= t0 or s >= t1:
            continue
        s, e = max(s, t0), min(e, t1)
        if s > cur_end:
            gaps.append((s - cur_end, cur_end, s, before, n))
        if e > cur_end:
            busy += e - max(s, cur_end)
            cur_end, before = e, n
    if t1 > cur_end:
        gaps.append((t1 - cur_end, cur_end, t1, before, "(step end)"))
    wall = t1 - t0
    idle = wall - busy

    print(f"{n_steps} steps after the first {a.skip}, {wall / n_steps / 1e6:.2f} ms per step on the GPU clock: "
          f"busy {busy / n_steps / 1e6:.2f} ms ({100 * busy / wall:.1f}%), idle {idle / n_steps / 1e6:.2f} ms "
          f"({100 * idle / wall:.1f}%)")
    long_gaps = [g for g in gaps if g[0] >= a.gap_us * 1e3]
    print(f"idle in {len(long_gaps) / n_steps:.1f} gaps of >= {a.gap_us:g} us per step: "
          f"{sum(g[0] for g in long_gaps) / n_steps / 1e6:.3f} ms per step; in shorter gaps: "
          f"{(idle - sum(g[0] for g in long_gaps)) / n_steps / 1e6:.3f} ms per step")

    # Host calls during each long gap: the longest running call overlapping it names the cause.
    import bisect
    host_starts = [h[0] for h in host]
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for length, s, e, b, nxt in long_gaps:
        lo = bisect.bisect_left(host_starts, s - 2_000_000_000)  # calls may start well before
        cause, longest = "(no host call)", 0
        for hs, he, hn, _ in host[lo:bisect.bisect_right(host_starts, e)]:
            ov = min(he, e) - max(hs, s)
            if ov > longest:
                cause, longest = hn, ov
        key = (short(b, 40), short(nxt, 40), cause)
        by_kind[key][0] += 1
        by_kind[key][1] += length
    print(f"\n{'ms/step':>8s} {'gaps/step':>9s}  {'after':40s}  {'before':40s}  host call during the gap")
    for (b, nxt, cause), (cnt, tot) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{tot / n_steps / 1e6:8.3f} {cnt / n_steps:9.1f}  {b:40s}  {nxt:40s}  {cause}")

    comm_beside_compute(gpu, t0, t1, n_steps)

    per = collections.defaultdict(float)
    calls = collections.Counter()
    for s, e, n, k in gpu:
        if s >= t0 and e <= t1:
            per[short(n, 90)] += e - s
            calls[short(n, 90)] += 1
    total = sum(per.values())
    print(f"\nGPU work as it ran, {total / n_steps / 1e6:.2f} ms per step summed over streams")
    print(f"{'ms/step':>9s} {'share':>6s} {'calls/step':>10s}  name")
    for n, v in sorted(per.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{v / n_steps / 1e6:9.3f} {100 * v / total:5.1f}% {calls[n] / n_steps:10.1f}  {n}")


if __name__ == "__main__":
    main()
