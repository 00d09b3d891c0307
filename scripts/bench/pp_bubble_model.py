#!/usr/bin/env python3
"""A model of the pipeline schedule's idle time, to read a measured bubble against.

Runs every rank's exact step list (build/pp_schedule_dump) on model clocks: forwards and
backwards take the given times, and transfers take XFER milliseconds once both sides have posted
them. Three ways to run the transfers (--semantics):
  groups  a rank blocks on each group until all its transfers are done (parallel/step/pp_exec.c
          without parallel.pp_overlap);
  side    the same groups on one side stream, compute waiting only for its own receives;
  links   one stream per directed link, each transfer starting once its sender has computed it
          and the link's previous transfer is done, compute waiting only for what it reads
          (parallel.pp_overlap).
Prints the schedule's length and each rank's idle share of it: (length - own compute) / length,
as the run report measures it.

  scripts/bench/pp_bubble_model.py [--bin build] [--pp 2] [--vpp 2] [--micro 8] [--layers 2,2,2,2]
      [--layer-ms 17.1] [--head-ms 14.8] [--fwd-share 0.333] [--xfer 0.9 ...] [--semantics groups]
  scripts/bench/pp_bubble_model.py --bin build --check-theory

--check-theory (a ctest): with equal stages, no head and free transfers every rank of several
shapes must be idle exactly (p-1)/(v*m+p-1) of the schedule, as the schedules are built to be,
under the groups and the links semantics (which also shows neither deadlocks on those shapes).

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


def key(op, mi, chunk, rank, pp):
    """What a transfer carries: (kind, micro, sending stage)."""
    s = chunk * pp + rank
    return {"sA": ("A", mi, s), "rA": ("A", mi, s - 1), "sG": ("G", mi, s), "rG": ("G", mi, s + 1)}[op]


def durations(pp, vpp, layers, layer_ms, head_ms, fwd):
    """duration(rank, op, chunk): the model time of a forward ("F") or backward of one micro-batch."""
    last = pp * vpp - 1

    def duration(rank, op, chunk):
        s = chunk * pp + rank
        work = layers[s] * layer_ms + (head_ms if s == last else 0.0)
        return work * (fwd if op == "F" else 1.0 - fwd)
    return duration


def outcome(stuck, length, compute):
    """(schedule length, each rank's compute, each rank's idle share), or an exit if a rank is stuck."""
    if stuck:
        raise SystemExit("the schedule deadlocks under these semantics")
    return length, compute, [(length - c) / length for c in compute]


def simulate(ranks, pp, vpp, layers, layer_ms, head_ms, fwd, xfer):
    last = pp * vpp - 1
    duration = durations(pp, vpp, layers, layer_ms, head_ms, fwd)

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
                ops = [(op[0], key(op, mi, c, r, pp)) for op, mi, c in step[1]]
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
    return outcome(any(nxt[r] < len(ranks[r]) for r in range(pp)), max(clock), compute)


def simulate_async(ranks, pp, vpp, layers, layer_ms, head_ms, fwd, xfer):
    """Transfers on a side stream: a rank's groups run in order on it, each starting once the
    compute queued before it is done (its sends read that compute) and the previous group has
    ended; a compute step waits only for the group holding the receive it reads."""
    last = pp * vpp - 1
    duration = durations(pp, vpp, layers, layer_ms, head_ms, fwd)

    groups = [[i for i, st in enumerate(steps) if st[0] == "G"] for steps in ranks]
    clock, compute = [0.0] * pp, [0.0] * pp
    ci, gi, side = [0] * pp, [0] * pp, [0.0] * pp  # compute cursor, next group, side-stream clock
    ready_at = [{} for _ in range(pp)]            # step index of a group -> compute done before it
    done = [{} for _ in range(pp)]                # (op, micro, chunk) received -> time it landed
    posted = {}
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            steps = ranks[r]
            while ci[r] < len(steps):  # compute cursor
                st = steps[ci[r]]
                if st[0] == "G":
                    ready_at[r][ci[r]] = clock[r]
                    ci[r] += 1
                    progress = True
                    continue
                need = ("rA" if st[0] == "F" else "rG", st[1], st[2])
                needs_recv = any(need == (op, mi, c) for g in groups[r] for op, mi, c in steps[g][1])
                if needs_recv and need not in done[r]:
                    break
                start = max(clock[r], done[r].get(need, 0.0))
                d = duration(r, st[0], st[2])
                clock[r] = start + d
                compute[r] += d
                ci[r] += 1
                progress = True
            while gi[r] < len(groups[r]):  # side stream
                g = groups[r][gi[r]]
                if g not in ready_at[r]:
                    break
                t_post = max(side[r], ready_at[r][g])
                ops = [(op, key(op, mi, c, r, pp), (op, mi, c)) for op, mi, c in steps[g][1]]
                for op, k, _ in ops:
                    posted.setdefault((op[0], k), t_post)
                if not all((("r" if op[0] == "s" else "s"), k) in posted for op, k, _ in ops):
                    break
                end = max(max(posted[("s", k)], posted[("r", k)]) + xfer for _, k, _ in ops)
                side[r] = end
                for op, _, full in ops:
                    if op[0] == "r":
                        done[r][full] = end
                gi[r] += 1
                progress = True
    return outcome(any(ci[r] < len(ranks[r]) or gi[r] < len(groups[r]) for r in range(pp)), max(max(clock), max(side)),
                   compute)


def simulate_links(ranks, pp, vpp, layers, layer_ms, head_ms, fwd, xfer):
    """Transfers on one stream per directed link (sender, receiver): each transfer starts once the
    compute producing it is done, the receiver has posted it and the link's previous transfer has
    ended; a compute step waits only for the transfer it reads. The executor posts a group while
    the compute step before it runs (the host waits for the GPU before each compute step that
    reads a transfer), which is when a receive counts as posted here."""
    last = pp * vpp - 1
    duration = durations(pp, vpp, layers, layer_ms, head_ms, fwd)

    # Per link (sender, receiver), the sender's sends in its order.
    sends = {}
    transfers = [(r, op, key(op, mi, c, r, pp)) for r in range(pp) for st in ranks[r] if st[0] == "G"
                 for op, mi, c in st[1]]
    for r, op, k in transfers:
        if op[0] == "s":
            sends.setdefault((r, (k[2] + (1 if k[0] == "A" else -1)) % pp), []).append(k)
    clock, compute = [0.0] * pp, [0.0] * pp
    ci = [0] * pp
    ready = {}    # transfer key -> time its producer finished (sender's compute stream)
    posted = {}   # transfer key -> time the receiver posted it
    started = [0.0] * pp  # start of each rank's last compute step
    landed = {}   # transfer key -> time it reached the receiver
    link_pos = {l: 0 for l in sends}
    link_clock = {l: 0.0 for l in sends}
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            steps = ranks[r]
            while ci[r] < len(steps):
                st = steps[ci[r]]
                if st[0] == "G":
                    for op, mi, c in st[1]:
                        if op[0] == "s":
                            ready[key(op, mi, c, r, pp)] = clock[r]
                        else:
                            posted[key(op, mi, c, r, pp)] = started[r]
                    ci[r] += 1
                    progress = True
                    continue
                s_ = st[2] * pp + r
                need = None
                if st[0] == "F" and s_ > 0:
                    need = ("A", st[1], s_ - 1)
                if st[0] == "B" and s_ < last:
                    need = ("G", st[1], s_ + 1)
                if need is not None and need not in landed:
                    break
                started[r] = max(clock[r], landed.get(need, 0.0))
                clock[r] = started[r] + duration(r, st[0], st[2])
                compute[r] += duration(r, st[0], st[2])
                ci[r] += 1
                progress = True
        for l, ks in sends.items():
            while link_pos[l] < len(ks) and ks[link_pos[l]] in ready and ks[link_pos[l]] in posted:
                k = ks[link_pos[l]]
                link_clock[l] = max(link_clock[l], ready[k], posted[k]) + xfer
                landed[k] = link_clock[l]
                link_pos[l] += 1
                progress = True
    return outcome(any(ci[r] < len(ranks[r]) for r in range(pp)), max(clock), compute)


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
    ap.add_argument("--semantics", choices=("groups", "side", "links"), default="groups",
                    help="groups: the executor blocks on each group; side: groups on one side stream; "
                    "links: one stream per directed link, receives posted ahead")
    a = ap.parse_args()
    if a.check_theory:
        bad = 0
        for pp, vpp, micro in ((2, 1, 1), (2, 1, 8), (2, 2, 8), (3, 1, 5), (4, 1, 8), (4, 2, 8), (4, 3, 12), (8, 2, 16)):
            theory = (pp - 1) / (vpp * micro + pp - 1)
            for sim in (simulate, simulate_links):
                _, _, idle = sim(schedules(a.bin, pp, vpp, micro), pp, vpp, [1] * (pp * vpp), 10.0, 0.0, 1 / 3, 0.0)
                ok = all(abs(v - theory) < 1e-9 for v in idle)
                bad += not ok
                print(f"pp {pp} vpp {vpp} m {micro} ({sim.__name__}): idle "
                      f"{' / '.join(f'{100 * v:.3f}%' for v in idle)}, theory {100 * theory:.3f}%{'' if ok else '  MISMATCH'}")
        raise SystemExit(1 if bad else 0)
    layers = [int(x) for x in a.layers.split(",")]
    if len(layers) != a.pp * a.vpp:
        raise SystemExit(f"--layers has {len(layers)} stages; pp * vpp = {a.pp * a.vpp}")
    ranks = schedules(a.bin, a.pp, a.vpp, a.micro)
    theory = (a.pp - 1) / (a.vpp * a.micro + a.pp - 1)
    print(f"pp {a.pp} vpp {a.vpp}, {a.micro} micro-batches, layers {layers}: theory {100 * theory:.1f}%")
    for x in a.xfer:
        length, compute, idle = {"groups": simulate, "side": simulate_async, "links": simulate_links}[a.semantics](ranks, a.pp, a.vpp, layers, a.layer_ms, a.head_ms, a.fwd_share, x)
        print(f"  {x:.2f} ms per transfer group: schedule {length:.1f} ms, compute "
              f"{' / '.join(f'{c:.1f}' for c in compute)} ms, idle {' / '.join(f'{100 * v:.1f}%' for v in idle)} "
              f"(busiest stage {100 * min(idle):.1f}%, {min(idle) / theory:.2f} x theory)")


if __name__ == "__main__":
    main()
