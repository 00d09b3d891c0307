#!/usr/bin/env python3
"""PyTorch baseline of the trainer's model, for side-by-side throughput figures.

The same Llama-style decoder as model/block.c (RMSNorm, rotary "rotate half", grouped-query
causal attention through scaled_dot_product_attention, SwiGLU, untied LM head unless the shape
ties it), trained with bf16 autocast and fused AdamW, eager and torch.compile; compile_fp8 also
runs the block's linear layers in FP8 the way torchao's float8 "tensorwise" recipe does
(dynamic per-tensor scales from each tensor's amax, E4M3 inputs and weights, E5M2 gradients,
torch._scaled_mm for the forward, data-gradient and weight-gradient GEMMs, fast accumulation
in the forward only; the LM head stays bf16), under torch.compile.

  python3 scripts/bench/bench_torch.py --shape 124m --batch 16 --mode compile
  python3 scripts/bench/bench_torch.py --shape all            # every one-GPU shape, eager and compile
  python3 scripts/bench/bench_torch.py --shape 7b-layers --mode compile_fp8

Prints tokens/s, model TFLOP/s and MFU with the formula the trainer uses: flops per token =
6 N + 12 L d T, N the parameters without the embedding table; peak 989.4 TFLOP/s (H100/H200
BF16 dense) unless --peak-tflops says otherwise.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # d, layers, heads, kv heads, ffn, vocab, seq, tied, default batch
    "124m": dict(d=768, L=12, H=12, Hkv=12, ffn=2048, V=32000, T=1024, tied=False, batch=16),
    "1b": dict(d=2048, L=16, H=32, Hkv=8, ffn=8192, V=128256, T=2048, tied=True, batch=4),
    "7b-layers": dict(d=4096, L=8, H=32, Hkv=32, ffn=11008, V=32000, T=4096, tied=False, batch=2),
    "7b": dict(d=4096, L=32, H=32, Hkv=32, ffn=11008, V=32000, T=4096, tied=False, batch=2),
}
# --shape all: the shapes that fit one GPU. 7b does not (its fp32 weights, gradients and AdamW
# moments alone take 108 GB): scripts/bench/bench_fsdp.py shards it over several.
ONE_GPU = ["124m", "1b", "7b-layers"]


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.w


def rope(x, cos, sin):  # x (B, H, T, hd); pairs (i, i + hd/2)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def to_fp8(x, dtype):
    """x in FP8 with a dynamic per-tensor scale (its amax), and the inverse scale for the GEMM."""
    fmax = torch.finfo(dtype).max
    scale = fmax / x.abs().max().float().clamp(min=1e-12)
    return (x.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


class FP8Matmul(torch.autograd.Function):
    """y = x w^T with every GEMM in FP8 (_scaled_mm wants a row-major, b column-major)."""

    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = to_fp8(x2, torch.float8_e4m3fn)
        wq, ws = to_fp8(w, torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16, use_fast_accum=True)
        ctx.save_for_backward(x2, w)
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x2, w = ctx.saved_tensors
        gq, gs = to_fp8(gy.reshape(-1, gy.shape[-1]), torch.float8_e5m2)
        wq, ws = to_fp8(w, torch.float8_e4m3fn)
        xq, xs = to_fp8(x2, torch.float8_e4m3fn)
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=gs, scale_b=ws, out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(), scale_a=gs, scale_b=xs,
                              out_dtype=torch.float32)
        return dx.view(ctx.x_shape), dw.to(w.dtype)


class Linear(nn.Linear):
    """nn.Linear without bias, in FP8 when its fp8 attribute is set (compile_fp8)."""

    fp8 = False

    def forward(self, x):
        if not self.fp8:
            return super().forward(x)
        return FP8Matmul.apply(x.to(torch.bfloat16), self.weight.to(torch.bfloat16))


class Block(nn.Module):
    def __init__(self, s):
        super().__init__()
        d, H, Hkv, hd = s["d"], s["H"], s["Hkv"], s["d"] // s["H"]
        self.H, self.Hkv, self.hd = H, Hkv, hd
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.wq = Linear(d, H * hd, bias=False)
        self.wk = Linear(d, Hkv * hd, bias=False)
        self.wv = Linear(d, Hkv * hd, bias=False)
        self.wo = Linear(H * hd, d, bias=False)
        self.w_gate = Linear(d, s["ffn"], bias=False)
        self.w_up = Linear(d, s["ffn"], bias=False)
        self.w_down = Linear(s["ffn"], d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.Hkv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.Hkv != self.H)
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, -1))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


def rope_tables(s, device=None):
    """The rotary cos and sin tables, (T, head_dim / 2) in fp32."""
    hd = s["d"] // s["H"]
    inv = 10000.0 ** (-torch.arange(0, hd // 2, dtype=torch.float32, device=device) * 2 / hd)
    ang = torch.arange(s["T"], dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


class Model(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed = nn.Embedding(s["V"], s["d"])
        self.blocks = nn.ModuleList(Block(s) for _ in range(s["L"]))
        self.final_norm = RMSNorm(s["d"])
        self.lm_head = nn.Linear(s["d"], s["V"], bias=False)
        if s["tied"]:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(s)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def set_fp8(model, on):
    """Run the blocks' linear layers in FP8 (compile_fp8) or not; the LM head stays bf16."""
    for mod in model.modules():
        if isinstance(mod, Linear):
            mod.fp8 = on


def flops_per_token(s):
    d, L, T = s["d"], s["L"], s["T"]
    hd = d // s["H"]
    n = L * (2 * d + d * s["H"] * hd * 2 + 2 * d * s["Hkv"] * hd + 3 * d * s["ffn"]) + d
    if not s["tied"]:
        n += s["V"] * d
    return 6 * n + 12 * L * d * T, n


def bench(name, s, batch, mode, steps, warmup, peak):
    torch.manual_seed(0)
    dev = "cuda"
    model = Model(s).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    torch._dynamo.reset()  # each mode compiles afresh
    set_fp8(model, mode == "compile_fp8")
    step_fn_model = torch.compile(model) if mode.startswith("compile") else model
    tokens = torch.randint(0, s["V"], (batch, s["T"] + 1), device=dev)
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn_model(inp, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tps = batch * s["T"] / dt
    fpt, n = flops_per_token(s)
    tflops = tps * fpt / 1e12
    print(f"{name:10s} {mode:8s} batch {batch:3d}  {tps:12.0f} tok/s  {tflops:7.1f} TFLOP/s  "
          f"MFU {100 * tflops / peak:5.1f}%  peak mem {torch.cuda.max_memory_allocated() / 2**30:6.1f} GiB  "
          f"N(no emb) {n / 1e6:.0f}M  loss {loss.item():.3f}", flush=True)
    del model, opt
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="all", choices=["all"] + list(SHAPES),
                    help=f"all: {', '.join(ONE_GPU)} (default)")
    ap.add_argument("--batch", type=int, default=0, help="sequences per step (default: per shape)")
    ap.add_argument("--mode", default="both",
                    help="eager, compile, compile_fp8, a comma-separated list of them, or both (eager,compile)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    a = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; flops/token = 6N + 12 L d T; "
          f"peak {a.peak_tflops} TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = True
    modes = ["eager", "compile"] if a.mode == "both" else a.mode.split(",")
    bad = [m for m in modes if m not in ("eager", "compile", "compile_fp8")]
    if bad:
        ap.error(f"unknown --mode {','.join(bad)}: use eager, compile, compile_fp8 or both")
    for name in ONE_GPU if a.shape == "all" else [a.shape]:
        for mode in modes:
            bench(name, SHAPES[name], a.batch or SHAPES[name]["batch"], mode, a.steps, a.warmup, a.peak_tflops)


if __name__ == "__main__":
    main()
