#!/usr/bin/env python3
"""The trainer's CPU AdamW (build/bench_adamw) against PyTorch's on the same host cores and
parameter count.

  python3 scripts/bench/bench_adamw.py --params 500e6 --threads 16 --bench build/bench_adamw
  python3 scripts/bench/bench_adamw.py --bench .gpu/bench_adamw --lib-path .gpu/lib   # a GPU build

PyTorch: torch.optim.AdamW over fp32 tensors of --tensor-elems elements (the last shorter),
foreach=True and fused=True (the latter where this PyTorch has a CPU fused AdamW), each timed
over --steps steps after one warm-up step that creates its state, torch.set_num_threads(threads).
Then bench_adamw runs the trainer's kernel over ranges of the same sizes, with the bf16 compute
copy written as the offload engine writes it (--copy), and a plain copy of the same 28 bytes per
parameter on the same threads: the memory-bandwidth ceiling AdamW is measured against.
--lib-path sets LD_LIBRARY_PATH for bench_adamw only. --modes none skips PyTorch.

Figures are the best step of --steps (the median is printed beside it).
"""
import argparse
import gc
import os
import platform
import re
import subprocess
import sys
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def time_torch(mode, n_params, tensor_elems, steps):
    """Best and median seconds per step of torch.optim.AdamW with foreach= or fused=True, or None."""
    import torch

    sizes = [min(tensor_elems, n_params - o) for o in range(0, n_params, tensor_elems)]
    params = [torch.nn.Parameter(torch.empty(n).uniform_(-0.02, 0.02)) for n in sizes]
    for p in params:
        p.grad = torch.empty_like(p).uniform_(-1e-3, 1e-3)
    kw = {"foreach": True} if mode == "foreach" else {"fused": True}
    try:
        opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
        opt.step()  # warm-up: creates the moments
    except (RuntimeError, TypeError, ValueError) as e:
        print(f"PyTorch AdamW {mode}=True not available on CPU here: {e}".splitlines()[0])
        return None
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    del opt, params
    gc.collect()
    times.sort()
    return times[0], times[len(times) // 2]


def run_bench(args):
    """Runs bench_adamw; returns its 'result' line as a dict of floats."""
    env = dict(os.environ)
    if args.lib_path:
        env["LD_LIBRARY_PATH"] = args.lib_path + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [args.bench, "-n", str(args.params), "-t", str(args.threads), "-r", str(args.steps),
           "-s", str(args.tensor_elems), "-c", args.copy]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.exit(f"bench_adamw failed (exit {out.returncode}): {out.stderr.strip()}")
    m = re.search(r"^result (.*)$", out.stdout, re.M)
    if not m:
        sys.exit("bench_adamw printed no 'result' line: is --bench the trainer's bench_adamw?")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=500e6, help="parameters (default 500e6)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="threads for both (default: the cores this process may run on)")
    ap.add_argument("--tensor-elems", type=int, default=1 << 24, help="elements per tensor / range (default 2^24)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps of each (default 5)")
    ap.add_argument("--modes", default="foreach,fused", help="PyTorch AdamW modes: foreach,fused (or none)")
    ap.add_argument("--bench", default="build/bench_adamw", help="the bench_adamw binary")
    ap.add_argument("--lib-path", default="", help="LD_LIBRARY_PATH for bench_adamw only (e.g. .gpu/lib)")
    ap.add_argument("--copy", default="bf16", choices=["bf16", "f32", "none"],
                    help="compute copy the trainer's kernel writes (default bf16)")
    args = ap.parse_args()
    args.params = int(args.params)
    if args.params < 1 or args.threads < 1 or args.steps < 1 or args.tensor_elems < 1:
        sys.exit("--params, --threads, --steps and --tensor-elems must be positive")
    modes = [m for m in args.modes.split(",") if m and m != "none"]
    if any(m not in ("foreach", "fused") for m in modes):
        sys.exit(f"--modes '{args.modes}': use foreach, fused, both (comma-separated) or none")
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"--bench {args.bench} is not an executable: build it (make -C build bench_adamw) or pass its path")

    torch_times = {}
    if modes:
        import torch
        torch.set_num_threads(args.threads)
        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
        for mode in modes:
            t = time_torch(mode, args.params, args.tensor_elems, args.steps)
            if t:
                torch_times[mode] = t
                print(f"PyTorch AdamW {mode}=True: {t[0]:.4f} s/step (median {t[1]:.4f} s)", flush=True)
    ours = run_bench(args)

    n = args.params
    base = torch_times.get("foreach")
    print(f"\n{time.strftime('%Y-%m-%d', time.gmtime())}, {cpu_model()}, {args.threads} threads, "
          f"{n / 1e6:g} M parameters in tensors of up to {args.tensor_elems}\n")
    print("| AdamW | s/step | G params/s | vs PyTorch foreach |")
    print("|---|---|---|---|")
    for mode, (best, _) in torch_times.items():
        ratio = f"{base[0] / best:.2f} x" if base else "-"
        print(f"| PyTorch {mode}=True | {best:.4f} | {n / best * 1e-9:.3f} | {ratio} |")
    ours_s = n / ours["params_per_s"]
    ratio = f"{base[0] / ours_s:.2f} x" if base else "-"
    print(f"| trainer ({args.copy} copy) | {ours_s:.4f} | {ours['params_per_s'] * 1e-9:.3f} | {ratio} |")
    print(f"\ncopy bandwidth (memcpy, 28 B/param moved): {ours['copy_gb_s']:.1f} GB/s; trainer AdamW "
          f"{ours['adamw_gb_s']:.1f} GB/s = {100 * ours['fraction']:.1f}% of it")


if __name__ == "__main__":
    main()
