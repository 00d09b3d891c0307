#!/usr/bin/env python3
"""When compressed DP gradients pay (docs/compression.md): the DP part of a step under each
format of parallel.grad_compress, from the quantise / dequantise cost measured on the GPU and
the link bandwidth as a parameter, for the 1b and 7B shapes; and the bandwidth below which int8
beats bf16.

  compress_model.py --commbench FILE [--dp P] [--window-ms W] [--bandwidth GBPS ...]

FILE is the output of commbench on ONE GPU with the compressed rows (the exchange is a local copy
there, so each row's time is the codec's cost; the fp32 row's copy is subtracted):
  build/commbench --compress none,bf16,fp16,int8 --min-bytes 268435456 --max-bytes 1073741824
The largest size of each table gives k, seconds per fp32 gradient element, for the all-reduce
(plain DP) and reduce-scatter (distributed optimizer) forms. Per rank and step, with N gradient
elements, f = (P - 1) / P, B the link's bytes/s per rank and W the part of backward a reduction
can hide behind:
  plain DP   fp32 / bf16 / fp16: k N + max(0, w N / B - W), w = 8f / 4f / 4f bytes an element
             int8: k N + max(0, 1.016 f N / B - W) + 1.016 f N / B  (the all-gather runs after
             backward, so it is never hidden)
  dist. opt. fp32 / bf16 / fp16: k N + max(0, w N / B - W), w = 4f / 2f / 2f
             int8: k N + max(0, 1.016 f N / B - W)
(1.016 = 1 + 4 / 256: a code per element and an fp32 scale per block of 256.)
"""
import argparse
import re
import sys

SHAPES = {"1b": 1.236e9, "7B": 6.74e9}  # gradient elements per rank with tp = pp = 1 (the trainer's model line)
FORMATS = ("none", "bf16", "fp16", "int8")


def parse_commbench(path):
    """k[(format, scatter)] = seconds per fp32 element at the largest size, less fp32's copy."""
    rows, cur = {}, None
    for line in open(path):
        m = re.match(r"# compressed (all_reduce|reduce_scatter) \((\w+)\)", line)
        if m:
            cur = (m.group(2), m.group(1) == "reduce_scatter")
            continue
        cols = line.split()
        if cur and len(cols) == 6 and cols[0].isdigit():
            rows[cur] = float(cols[2]) * 1e-6 / float(cols[1])  # later rows are larger
    if not all((f, s) in rows for f in FORMATS for s in (False, True)):
        sys.exit(f"{path}: expected commbench tables for {', '.join(FORMATS)} (--compress none,bf16,fp16,int8)")
    return {(f, s): max(0.0, rows[(f, s)] - rows[("none", s)]) for f in FORMATS for s in (False, True)}


def dp_seconds(fmt, scatter, k, n, p, bw, window):
    f = (p - 1) / p
    if fmt == "int8":
        w = 1.016 * f
        return k * n + max(0.0, w * n / bw - window) + (0.0 if scatter else w * n / bw)
    w = {"none": 4.0, "bf16": 2.0, "fp16": 2.0}[fmt] * f * (1 if scatter else 2)
    return k * n + max(0.0, w * n / bw - window)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commbench", required=True, help="commbench output of one GPU with --compress")
    ap.add_argument("--dp", type=int, default=8, help="data-parallel ranks P")
    ap.add_argument("--window-ms", type=float, default=0.0, help="backward time a reduction can hide behind")
    ap.add_argument("--bandwidth", type=float, nargs="+", default=[12.5, 25, 50, 100, 450],
                    help="link bandwidths per rank, GB/s (400 Gb/s InfiniBand: 50)")
    a = ap.parse_args()
    k = parse_commbench(a.commbench)
    for (fmt, s), v in sorted(k.items()):
        print(f"k {fmt:5s} {'reduce_scatter' if s else 'all_reduce':14s} {v * 1e12:8.2f} ps per fp32 element")
    window = a.window_ms * 1e-3
    for shape, n in SHAPES.items():
        for scatter in (False, True):
            kind = "distributed optimizer" if scatter else "plain DP"
            print(f"\n{shape} ({n / 1e9:.2f}e9 gradient elements per rank), {kind}, dp {a.dp}, window {a.window_ms} ms:"
                  " DP seconds per step")
            print("GB/s   " + "".join(f"{fmt:>10s}" for fmt in FORMATS))
            for gb in a.bandwidth:
                t = [dp_seconds(fmt, scatter, k[(fmt, scatter)], n, a.dp, gb * 1e9, window) for fmt in FORMATS]
                print(f"{gb:6.1f} " + "".join(f"{x:10.4f}" for x in t))
            dk = k[("int8", scatter)] - k[("bf16", scatter)]
            f = (a.dp - 1) / a.dp
            gain = (0.984 if scatter else 1.968) * f  # bytes an element int8 saves over bf16 when fully exposed
            if dk > 0:
                print(f"int8 beats bf16 below {gain / dk / 1e9:.1f} GB/s per rank (communication fully exposed: window 0)")
            else:
                print("int8 beats bf16 at every bandwidth: its codec costs no more than bf16's (communication fully exposed: window 0)")


if __name__ == "__main__":
    main()
