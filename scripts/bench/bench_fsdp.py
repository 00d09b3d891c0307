#!/usr/bin/env python3
"""PyTorch FSDP2 baseline of the trainer's model on several GPUs, for multi-GPU throughput figures.

The model is scripts/bench/bench_torch.py's (imported from it, not copied): the same Llama-style
decoder, shapes, FP8 "tensorwise" linears for compile_fp8 and FLOP count. Here it is trained
data parallel over every rank that torchrun starts, with PyTorch's FSDP2
(torch.distributed.fsdp.fully_shard), the way torchtitan sets it up:

- the model is built on the meta device, so no rank ever holds it whole; each transformer
  block is one FSDP unit (one all-gather of its weights in forward, one in backward unless
  --no-reshard-after-forward, one reduce-scatter of its gradients) and the root (embedding,
  final norm, LM head) another, applied block by block and then to the root; the weights are
  then materialised shard by shard on the GPUs and initialised as bench_torch.py initialises
  them (nn.Linear and nn.Embedding defaults, norms at one);
- the parameters themselves stay fp32 (the optimizer's master weights); the mixed-precision
  policy all-gathers them as bf16 for forward and backward (param_dtype=bfloat16) and reduces
  the gradients in fp32 (reduce_dtype=float32), so the gradient shards and both AdamW moments
  are fp32 too: 16 bytes a parameter, divided by the number of GPUs. Forward inputs are not
  cast (the rotary tables stay fp32, as in bench_torch.py), and the step runs under bf16
  autocast as bench_torch.py's does;
- fused AdamW (lr 3e-4, weight decay 0.1) over the sharded parameters, no gradient clipping
  unless --grad-clip (the trainer clips at 1.0 by default; the clip costs one all-reduce);
- eager: as built; compile: torch.compile on each transformer block (per-block compile, before
  fully_shard; the FSDP hooks run outside the compiled graphs, the embedding, LM head and loss
  stay eager); compile_fp8: the blocks' linear layers in FP8 as bench_torch.py's compile_fp8
  (its conversion: weights are all-gathered in bf16, then cast to FP8 with a per-tensor scale
  in each GEMM), then the same per-block compile;
- --ac full recomputes each block in backward (activation checkpointing around the block,
  applied before compile and fully_shard), like the trainer's train.recompute=full;
- every rank trains on its own random batch of --batch sequences (drawn once, as in
  bench_torch.py): the job's global batch is --batch times the number of GPUs.

Prints, from rank 0, one line: tokens/s of the whole job and per GPU, model TFLOP/s per GPU,
MFU (bench_torch.py's formula: flops per token = 6 N + 12 L d T, N the parameters without the
embedding table; peak 989.4 TFLOP/s per GPU, H100/H200 BF16 dense, unless --peak-tflops), ms
per step, and the peak memory of the fullest GPU (the largest torch.cuda.max_memory_allocated
and max_memory_reserved over the ranks, over the timed steps, and the device's memory in use after
them, torch.cuda.mem_get_info, as the trainer counts its own); --json FILE writes the same
figures. Time is the slowest rank's wall time over --steps steps after --warmup untimed ones.

Memory of the 7b shape with 2 sequences per GPU on 4 GPUs (PyTorch 2.11, the fullest GPU's peak
allocated / reserved): compile 57 / 68 GiB, compile_fp8 46 / 57, compile --ac full 29 / 35,
compile --no-reshard-after-forward 69 / 79, eager 71 / 81; on 80 GB GPUs the last two need
--ac full.

NCCL's NVLink multicast (NVLS) is off unless NCCL_NVLS_ENABLE is already set. --help needs no
PyTorch; a run needs PyTorch 2.6 or later (fully_shard under torch.distributed.fsdp).

  # the 7b shape on 4 GPUs, 2 sequences of 4096 per GPU, bf16 and FP8 linears
  torchrun --standalone --nproc-per-node 4 scripts/bench/bench_fsdp.py --shape 7b --batch 2 --mode compile
  torchrun --standalone --nproc-per-node 4 scripts/bench/bench_fsdp.py --shape 7b --batch 2 --mode compile_fp8
  # the same with every block recomputed in backward (less activation memory)
  torchrun --standalone --nproc-per-node 4 scripts/bench/bench_fsdp.py --shape 7b --batch 2 --mode compile --ac full
  # the 1b shape data parallel over 4 GPUs, 4 sequences of 2048 per GPU
  torchrun --standalone --nproc-per-node 4 scripts/bench/bench_fsdp.py --shape 1b --batch 4 --mode compile

scripts/bench/bench_fsdp_vs_trainer.sh runs this and the trainer on the same shape, batch and steps.
"""
import argparse
import json
import os
import sys
import time

# Before torch.distributed starts NCCL: NVLink multicast stays off unless asked for.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("eager", "compile", "compile_fp8")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="7b",
                    help="a shape of bench_torch.py's SHAPES table: 124m, 1b, 7b-layers, 7b (default 7b)")
    ap.add_argument("--batch", type=int, default=0,
                    help="sequences per GPU per step (default: the shape's default batch, 2 for 7b)")
    ap.add_argument("--mode", default="compile", choices=MODES, help="default compile")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first, compilation included (default 5)")
    ap.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                    help="free each block's gathered weights after its forward and gather them again in "
                         "backward (default); --no-reshard-after-forward keeps them from forward to backward "
                         "(one all-gather less per block, more memory). The root unit keeps FSDP's own choice")
    ap.add_argument("--ac", default="none", choices=("none", "full"),
                    help="activation checkpointing: none (default) or full (each block recomputed in backward)")
    ap.add_argument("--grad-clip", type=float, default=0.0,
                    help="clip the global gradient norm to this (0 = off, the default, as bench_torch.py)")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="one GPU's dense peak, for MFU")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE as one JSON object")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.batch < 0:
        ap.error("--steps must be at least 1, --warmup and --batch not negative")
    return ap, a


def main():
    ap, a = parse_args()
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if var not in os.environ:
            ap.error(f"{var} is not set: launch with torchrun --nproc-per-node N {sys.argv[0]} ...")

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.checkpoint import checkpoint

    sys.path.insert(0, HERE)
    from bench_torch import SHAPES, Model, RMSNorm, flops_per_token, rope_tables, set_fp8

    if a.shape not in SHAPES:
        ap.error(f"unknown --shape {a.shape}: use one of {', '.join(SHAPES)}")
    s = SHAPES[a.shape]
    batch = a.batch or s["batch"]

    class Recomputed(nn.Module):
        """A block whose forward is recomputed in backward (activation checkpointing)."""

        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x, cos, sin):
            return checkpoint(self.block, x, cos, sin, use_reentrant=False, preserve_rng_state=False)

    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local_rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",))
    torch.backends.cuda.matmul.allow_tf32 = True
    if rank == 0:
        print(f"# {torch.cuda.get_device_name()} x {world} torch {torch.__version__}; FSDP2, fp32 parameters, "
              f"bf16 compute, fp32 gradient reduction; reshard_after_forward {a.reshard_after_forward}, "
              f"ac {a.ac}; flops/token = 6N + 12 L d T; peak {a.peak_tflops} TFLOP/s per GPU; "
              f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}", flush=True)

    # Build without storage, wrap (FP8, recompute, compile, shard), then materialise the shards.
    with torch.device("meta"):
        model = Model(s)
    set_fp8(model, a.mode == "compile_fp8")
    if a.ac == "full":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = Recomputed(block)
    if a.mode.startswith("compile"):
        for block in model.blocks:
            block.compile()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=a.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=dev)
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.w.fill_(1.0)
            elif isinstance(m, (nn.Linear, nn.Embedding)) and not (s["tied"] and m is model.lm_head):
                m.reset_parameters()  # a tied head shares the embedding's weights, as in bench_torch.py
        cos, sin = rope_tables(s, dev)
        model.cos.copy_(cos)
        model.sin.copy_(sin)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)

    torch.manual_seed(1 + rank)  # each rank its own batch
    tokens = torch.randint(0, s["V"], (batch, s["T"] + 1), device=dev)
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(inp, tgt)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0

    # The slowest rank's time, the fullest GPU's memory, the mean loss over the ranks' batches.
    # The device's own count too (cudaMemGetInfo: CUDA context, NCCL and the caching allocator's
    # pool included), as the trainer measures its memory; the pool is not returned, so after the
    # timed steps it holds their peak.
    free, total = torch.cuda.mem_get_info()
    figs = torch.tensor([elapsed, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), total - free],
                        dtype=torch.float64, device=dev)
    dist.all_reduce(figs, op=dist.ReduceOp.MAX)
    loss = loss.detach().float()
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    dt = figs[0].item() / a.steps
    tps_gpu = batch * s["T"] / dt
    fpt, n = flops_per_token(s)
    tflops = tps_gpu * fpt / 1e12
    alloc, reserved, in_use = figs[1].item() / 2**30, figs[2].item() / 2**30, figs[3].item() / 2**30
    if rank == 0:
        print(f"{a.shape:10s} {a.mode:11s} fsdp{world} batch {batch:3d}/GPU  {tps_gpu * world:12.0f} tok/s  "
              f"{tps_gpu:10.0f} tok/s/GPU  {tflops:7.1f} TFLOP/s/GPU  MFU {100 * tflops / a.peak_tflops:5.1f}%  "
              f"{dt * 1e3:8.1f} ms/step  peak mem {alloc:6.1f} GiB ({reserved:6.1f} reserved, {in_use:.1f} in use)  "
              f"N(no emb) {n / 1e6:.0f}M  loss {loss.item():.3f}", flush=True)
        if a.json:
            rec = {"shape": a.shape, "mode": a.mode, "gpus": world, "batch_per_gpu": batch, "seq_len": s["T"],
                   "tokens_per_step": batch * s["T"] * world, "steps": a.steps, "warmup": a.warmup,
                   "reshard_after_forward": a.reshard_after_forward, "ac": a.ac, "grad_clip": a.grad_clip,
                   "tokens_per_s": tps_gpu * world, "tokens_per_s_per_gpu": tps_gpu, "tflops_per_gpu": tflops,
                   "mfu": tflops / a.peak_tflops, "peak_tflops": a.peak_tflops, "ms_per_step": dt * 1e3,
                   "peak_mem_allocated_gib": alloc, "peak_mem_reserved_gib": reserved, "mem_in_use_gib": in_use,
                   "params_no_emb": n,
                   "loss": loss.item(), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
            with open(a.json, "w") as f:
                json.dump(rec, f, indent=1)
                f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
