#!/usr/bin/env python3
"""PyTorch's NCCL collectives on the GPUs torchrun starts, timed as build/commbench times the
trainer's: the reference for the bus bandwidth the machine gives NCCL.

Same definitions as commbench: size is the largest buffer of the call (the gathered output, the
scattered input), algbw = size / time, busbw = algbw x (all_reduce 2(n-1)/n; all_gather,
reduce_scatter (n-1)/n; broadcast 1); time is the mean over --iters calls after --warmup, taken
with CUDA events on rank 0 after a barrier, the calls issued back to back on the default stream.
fp32 by default. Prints one row per op and size, as commbench does, and the busbw at the largest
size per op.

    torchrun --standalone --nproc-per-node 4 scripts/bench/bench_nccl_torch.py \
        --min-bytes 1048576 --max-bytes 1073741824 --factor 4

NVLink multicast stays off unless NCCL_NVLS_ENABLE is set (as the trainer's scripts run).
"""
import argparse
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + " ".join(OPS))
    a = p.parse_args()
    a.ops = a.ops.split(",")
    for op in a.ops:
        if op not in OPS:
            p.error(f"unknown op {op}; ops are {' '.join(OPS)}")
    if a.factor < 2 or a.min_bytes < 1 or a.max_bytes < a.min_bytes:
        p.error("need --factor >= 2 and 1 <= --min-bytes <= --max-bytes")
    return a


def one_call(op, big, small):
    if op == "all_reduce":
        dist.all_reduce(big)
    elif op == "all_gather":
        dist.all_gather_into_tensor(big, small)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(small, big)
    else:
        dist.broadcast(big, 0)


def main():
    a = parse()
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    esize = torch.tensor([], dtype=dtype).element_size()
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "broadcast": 1.0}
    if rank == 0:
        print(f"# PyTorch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} ranks, "
              f"{torch.cuda.get_device_name()}, {a.dtype}, {a.iters} iterations after {a.warmup}")
    for op in a.ops:
        if rank == 0:
            print(f"# {op}")
            print(f"{'size(B)':>14s} {'count':>12s} {'time(us)':>12s} {'algbw(GB/s)':>12s} {'busbw(GB/s)':>12s}")
        last = None
        size = a.min_bytes
        while size <= a.max_bytes:
            count = max(n, size // esize // n * n)  # whole elements per rank
            big = torch.ones(count, dtype=dtype, device="cuda")
            small = torch.ones(count // n, dtype=dtype, device="cuda")
            for _ in range(a.warmup):
                one_call(op, big, small)
            torch.cuda.synchronize()
            dist.barrier()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(a.iters):
                one_call(op, big, small)
            t1.record()
            torch.cuda.synchronize()
            us = t0.elapsed_time(t1) * 1e3 / a.iters
            nbytes = count * esize
            algbw = nbytes / (us * 1e-6) / 1e9
            last = (nbytes, algbw * factor[op])
            if rank == 0:
                print(f"{nbytes:14d} {count:12d} {us:12.1f} {algbw:12.2f} {algbw * factor[op]:12.2f}")
            del big, small
            size *= a.factor
        if rank == 0 and last:
            print(f"# {op} busbw at {last[0]} bytes: {last[1]:.2f} GB/s")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
