#!/usr/bin/env python3
"""Checks an export of build/export_hf with Hugging Face transformers: loads it with
LlamaForCausalLM.from_pretrained (no missing, unexpected or mismatched tensors allowed),
computes the loss of the trainer's first batch, and compares it with the trainer's step-1 loss.

    python3 scripts/tools/hf_check.py EXPORT_DIR --global-batch 8 [--metrics FILE | --trainer-loss X]
            [--data 'data/corpus/train_*.bin'] [--seed 1234] [--device cuda] [--dtype float32]
            [--rtol 1e-4] [--engine transformers|numpy]

--engine numpy computes the same loss without torch: the safetensors files parsed here and
Llama's forward written out in numpy (float64), as transformers' modeling_llama defines it
(the CPU tests use it; it checks the data order and the conventions, not transformers).

The batch is rebuilt here from the token shards, the way the trainer reads them
(docs/data.md): update 1 reads samples 0 .. global_batch-1 of the training stream, sample s is
window perm_0[s] (epoch 0's permutation of train.seed), and a window's first seq_len tokens are
the inputs, its last seq_len the targets. seq_len is the export's max_position_embeddings. The
trainer's loss of step 1 is the mean cross-entropy of that batch under the weights before the
first update, i.e. the exported weights when the run starts from them (checkpoint.init_from).
Needs torch, transformers and numpy; reads nothing from the network. Exit 0 when the losses
agree to rtol.
"""
import argparse
import glob
import json
import math
import os
import sys

import numpy as np

M = 2**64 - 1


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def perm(seed, epoch, n):
    """The window order of an epoch (docs/data.md, pinned by tests/unit/test_data.c)."""
    state = mix(seed ^ mix((epoch + 0x632BE59BD9B4E019) & M))
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        threshold = (2**64 - bound) % bound
        while True:
            state = (state + 0x9E3779B97F4A7C15) & M
            r = mix(state)
            if r >= threshold:
                break
        j = r % bound
        p[i], p[j] = p[j], p[i]
    return p


def read_shard(path):
    """Tokens of one shard: this project's TRNTOK format or an llm.c shard."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw[:8].tobytes() == b"TRNTOK\0\0":
        token_bytes = int(raw[12:16].view("<u4")[0])
        n = int(raw[16:24].view("<i8")[0])
        return raw[64:64 + n * token_bytes].view("<u2" if token_bytes == 2 else "<i4").astype(np.int64)
    header = raw[:1024].view("<i4")
    if header[0] == 20240520:
        return raw[1024:1024 + 2 * int(header[2])].view("<u2").astype(np.int64)
    sys.exit("%s: not a token shard this script reads (docs/data.md)" % path)


def first_batch(pattern, seq_len, seed, n):
    """Windows of samples 0 .. n-1: (n, seq_len + 1) int64."""
    paths = sorted(glob.glob(pattern), key=lambda p: p.encode())
    if not paths:
        sys.exit("no shard matches %s" % pattern)
    windows = []  # (shard tokens, start) in window order
    for p in paths:
        tok = read_shard(p)
        windows += [(tok, k * seq_len) for k in range(max(len(tok) - 1, 0) // seq_len)]
    out = []
    for s in range(n):
        epoch, j = divmod(s, len(windows))
        tok, start = windows[perm(seed, epoch, len(windows))[j]]
        out.append(tok[start:start + seq_len + 1])
    return np.stack(out)


def read_weights(d):
    """{name: float64 array} of every safetensors file of an export."""
    files = glob.glob(os.path.join(d, "*.safetensors"))
    dtypes = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    out = {}
    for path in files:
        blob = np.fromfile(path, dtype=np.uint8)
        n = int(blob[:8].view("<u8")[0])
        header = json.loads(blob[8:8 + n].tobytes())
        header.pop("__metadata__", None)
        for name, t in header.items():
            b, e = t["data_offsets"]
            a = blob[8 + n + b:8 + n + e].view(dtypes[t["dtype"]])
            if t["dtype"] == "BF16":
                a = (a.astype(np.uint32) << 16).view(np.float32)
            out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def numpy_loss(d, cfg, batch):
    """Mean cross-entropy of batch (B, T + 1) under LlamaForCausalLM's forward, in float64."""
    w = read_weights(d)
    inp, tgt = batch[:, :-1], batch[:, 1:]
    B, T = inp.shape
    H, Hkv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    ang = np.arange(T)[:, None] * cfg.get("rope_theta", 1e4) ** (-np.arange(0, hd, 2) / hd)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]  # (T, 1, hd/2)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(q):  # rotate half: element i pairs with i + hd/2
        a, b = q[..., :hd // 2], q[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    mask = np.triu(np.full((T, T), -np.inf), 1)
    x = w["model.embed_tokens.weight"][inp]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(B, T, H, hd))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(B, T, Hkv, hd))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(B, T, Hkv, hd)
        k, v = np.repeat(k, H // Hkv, axis=2), np.repeat(v, H // Hkv, axis=2)  # query head j reads kv head j // rep
        s = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("bhts,bshd->bthd", s / s.sum(-1, keepdims=True), v).reshape(B, T, H * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = rms(x, w["model.norm.weight"]) @ head.T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, tgt[..., None], -1).mean())


def transformers_loss(args, batch):
    """The loss under transformers' LlamaForCausalLM, and a line describing the load."""
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import LlamaForCausalLM

    version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    dtype_kw = "dtype" if version >= (4, 56) else "torch_dtype"  # renamed in 4.56
    model, info = LlamaForCausalLM.from_pretrained(args.export_dir, output_loading_info=True,
                                                   attn_implementation="eager",
                                                   **{dtype_kw: getattr(torch, args.dtype)})
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit("from_pretrained did not load the export cleanly: %s" % problems)
    model.to(args.device).eval()
    ids = torch.from_numpy(batch).to(args.device)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    n_params = sum(p.numel() for p in model.parameters())
    return loss, "loaded by transformers %s's LlamaForCausalLM (%.2fM parameters, %s on %s), no missing or " \
        "unexpected tensors" % (transformers.__version__, n_params / 1e6, args.dtype, args.device)


def trainer_loss(args):
    if args.trainer_loss is not None:
        return args.trainer_loss
    for line in open(args.metrics):
        o = json.loads(line)
        if o.get("step") == 1:
            return o["loss"]
    sys.exit("%s holds no record of step 1: run the trainer with log.every=1" % args.metrics)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_dir")
    ap.add_argument("--global-batch", type=int, required=True, help="train.global_batch of the trainer run")
    ap.add_argument("--seed", type=int, default=1234, help="train.seed of the trainer run")
    ap.add_argument("--data", default="data/corpus/train_*.bin", help="data.train of the trainer run")
    ap.add_argument("--metrics", help="the trainer run's log.metrics file (its step-1 loss)")
    ap.add_argument("--trainer-loss", type=float, help="the trainer's step-1 loss, instead of --metrics")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--engine", default="transformers", choices=["transformers", "numpy"])
    args = ap.parse_args()
    if args.metrics is None and args.trainer_loss is None:
        ap.error("give --metrics or --trainer-loss")

    cfg = json.load(open(os.path.join(args.export_dir, "config.json")))
    seq_len = cfg["max_position_embeddings"]
    batch = first_batch(args.data, seq_len, args.seed, args.global_batch)
    if args.engine == "numpy":
        loss, what = numpy_loss(args.export_dir, cfg, batch), "read by numpy (float64 forward)"
    else:
        loss, what = transformers_loss(args, batch)
    want = trainer_loss(args)
    rel = abs(loss - want) / abs(want)
    ok = math.isfinite(loss) and rel <= args.rtol
    print("hf_check: %s %s" % (args.export_dir, what))
    print("hf_check: loss of the first batch (%d x %d tokens): %s %.7f, trainer %.7f, relative difference %.2e "
          "(rtol %g): %s" % (args.global_batch, seq_len, args.engine, loss, want, rel, args.rtol,
                             "agree" if ok else "DIFFER"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
