#!/usr/bin/env python3
"""A model of the pipeline schedule's idle time, to read a measured bubble against.

Runs every rank's exact step list (build/pp_schedule_dump) on model clocks: forwards and
backwards take the given times, a group of transfers completes when every transfer in it has
been posted by both sides plus XFER milliseconds, and a rank runs its steps in order, blocking on
each group (the executor's semantics, parallel/pp_exec.c). Prints the schedule's length and each
rank's idle share of it: (length - own compute) / length, as the run report measures it.

  scripts/pp_bubble_model.py [--bin build] [--pp 2] [--vpp 2] [--micro 8] [--layers 2,2,2,2]
      [--layer-ms 17.1] [--head-ms 14.8] [--fwd-share 0.333] [--xfer 0.9 ...]
  scripts/pp_bubble_model.py --bin build --check-theory

--check-theory (a ctest): with equal stages, no head and free transfers every rank of several
shapes must be idle exactly (p-1)/(v*m+p-1) of the schedule, as the schedules are built to be.

--layers: layers of each virtual stage (pp * vpp, stage s = chunk * pp + rank); --layer-ms and
--head-ms: forward + backward of one layer, and of the LM head and loss (on the last stage), per
micro-batch; --fwd-share: the forward's part of those. The defaults are the 7b-layers pp2 vpp2
run of docs/benchmarks.md.
"""
import argparse
import re
import subprocess


def schedules(bin_dir, pp, vpp, micro):
    out = subprocess.run([f"{bin_dir}/pp_schedule_dump", str(pp), str(vpp), str(micro)], check=True,
                         capture_output=True, text=True).stdout
    ranks = []
    for line in out.strip().split("\n"):
        steps, group = [], None
        for tok in line.split(":", 1)[1].split():
            if tok == "[":
                group = []
            elif tok == "]":
                steps.append(("G", group))
                group = None
            else:
                op, mi, c = re.fullmatch(r"(F|B|sA|rA|sG|rG)(\d+)\.(\d+)", tok).groups()
                (group if group is not None else steps).append((op, int(mi), int(c)))
        ranks.append(steps)
    return ranks


def simulate(ranks, pp, vpp, layers, layer_ms, head_ms, fwd, xfer):
    last = pp * vpp - 1

    def duration(rank, op, chunk):
        s = chunk * pp + rank
        work = layers[s] * layer_ms + (head_ms if s == last else 0.0)
        return work * (fwd if op == "F" else 1.0 - fwd)

    def key(op, mi, chunk, rank):  # what a transfer carries: (kind, micro, sending stage)
        s = chunk * pp + rank
        return {"sA": ("A", mi, s), "rA": ("A", mi, s - 1), "sG": ("G", mi, s), "rG": ("G", mi, s + 1)}[op]

    clock, compute, nxt, posted = [0.0] * pp, [0.0] * pp, [0] * pp, {}
    waiting = [False] * pp
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while nxt[r] < len(ranks[r]):
                step = ranks[r][nxt[r]]
                if step[0] != "G":
                    d = duration(r, step[0], step[2])
                    clock[r] += d
                    compute[r] += d
                    nxt[r] += 1
                    progress = True
                    continue
                ops = [(op[0], key(op, mi, c, r)) for op, mi, c in step[1]]
                if not waiting[r]:
                    for side, k in ops:
                        posted[(side, k)] = clock[r]
                    waiting[r] = True
                if not all((("r" if side == "s" else "s"), k) in posted for side, k in ops):
                    break
                clock[r] = max(max(posted[("s", k)], posted[("r", k)]) + xfer for _, k in ops)
                waiting[r] = False
                nxt[r] += 1
                progress = True
    if any(nxt[r] < len(ranks[r]) for r in range(pp)):
        raise SystemExit("the schedule deadlocks under these semantics")
    length = max(clock)
    return length, compute, [(length - c) / length for c in compute]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--vpp", type=int, default=2)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--layers", default="2,2,2,2")
    ap.add_argument("--layer-ms", type=float, default=17.1)
    ap.add_argument("--head-ms", type=float, default=14.8)
    ap.add_argument("--fwd-share", type=float, default=1 / 3)
    ap.add_argument("--xfer", type=float, nargs="+", default=[0.0, 0.45, 0.9])
    ap.add_argument("--check-theory", action="store_true")
    a = ap.parse_args()
    if a.check_theory:
        bad = 0
        for pp, vpp, micro in ((2, 1, 1), (2, 1, 8), (2, 2, 8), (3, 1, 5), (4, 1, 8), (4, 2, 8), (4, 3, 12), (8, 2, 16)):
            theory = (pp - 1) / (vpp * micro + pp - 1)
            _, _, idle = simulate(schedules(a.bin, pp, vpp, micro), pp, vpp, [1] * (pp * vpp), 10.0, 0.0, 1 / 3, 0.0)
            ok = all(abs(v - theory) < 1e-9 for v in idle)
            bad += not ok
            print(f"pp {pp} vpp {vpp} m {micro}: idle {' / '.join(f'{100 * v:.3f}%' for v in idle)}, theory "
                  f"{100 * theory:.3f}%{'' if ok else '  MISMATCH'}")
        raise SystemExit(1 if bad else 0)
    layers = [int(x) for x in a.layers.split(",")]
    if len(layers) != a.pp * a.vpp:
        raise SystemExit(f"--layers has {len(layers)} stages; pp * vpp = {a.pp * a.vpp}")
    ranks = schedules(a.bin, a.pp, a.vpp, a.micro)
    theory = (a.pp - 1) / (a.vpp * a.micro + a.pp - 1)
    print(f"pp {a.pp} vpp {a.vpp}, {a.micro} micro-batches, layers {layers}: theory {100 * theory:.1f}%")
    for x in a.xfer:
        length, compute, idle = simulate(ranks, a.pp, a.vpp, layers, a.layer_ms, a.head_ms, a.fwd_share, x)
        print(f"  {x:.2f} ms per transfer group: schedule {length:.1f} ms, compute "
              f"{' / '.join(f'{c:.1f}' for c in compute)} ms, idle {' / '.join(f'{100 * v:.1f}%' for v in idle)} "
              f"(busiest stage {100 * min(idle):.1f}%, {min(idle) / theory:.2f} x theory)")


if __name__ == "__main__":
    main()
