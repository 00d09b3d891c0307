#!/usr/bin/env python3
"""An independent reader and writer for the Hugging Face interop tests: the safetensors format
parsed with the standard library and numpy alone (not the trainer's C reader), the trainer's
checkpoints read with h5py.

    hf_export_check.py check CKPT EXPORT_DIR fp32|bf16
        every tensor of the export equals the checkpoint's (bitwise, or the checkpoint rounded
        to bf16 to nearest even), and the header and config.json are well formed
    hf_export_check.py write-fp16 CKPT OUT_DIR CONFIG_JSON
        writes the checkpoint's model as F16 safetensors in two shards with an index
    hf_export_check.py equals NEW_CKPT CKPT fp32|bf16|fp16
        NEW_CKPT's model tensors equal CKPT's rounded to that dtype, and its optimizer state is 0
"""
import json
import os
import struct
import sys

import h5py
import numpy as np

PER_LAYER = {
    "attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm", "w_gate": "mlp.gate_proj",
    "w_up": "mlp.up_proj", "w_down": "mlp.down_proj",
}
GLOBAL = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def hf_name(name):
    if name in GLOBAL:
        return GLOBAL[name]
    _, layer, kind = name.split(".")
    return "model.layers.%s.%s.weight" % (layer, PER_LAYER[kind])


def ckpt_model(path):
    with h5py.File(path, "r") as f:
        return {k: f["model"][k][...] for k in f["model"]}


def bf16_bits(x):
    """fp32 -> bf16 bits, rounded to nearest even (NaN kept NaN)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def as_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a.astype(np.float32)


def read_safetensors(path):
    """Header dict and {name: array}, checking the layout as the format describes it."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "%s: header runs past the file" % path
    assert (8 + n) % 8 == 0, "%s: data does not start 8-byte aligned" % path
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    assert header.pop("__metadata__") == {"format": "pt"}, "%s: __metadata__" % path
    data, out, end = blob[8 + n:], {}, 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert b == end, "%s: %s starts at %d, the previous tensor ends at %d" % (path, name, b, end)
        dt = np.dtype(DTYPES[t["dtype"]])
        assert e - b == dt.itemsize * int(np.prod(t["shape"])), "%s: %s size" % (path, name)
        out[name] = np.frombuffer(data[b:e], dtype=dt.newbyteorder("<")).reshape(t["shape"])
        end = e
    assert end == len(data), "%s: %d bytes after the last tensor" % (path, len(data) - end)
    return header, out


def read_export(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        assert not os.path.exists(index), "both a single file and an index"
        return read_safetensors(os.path.join(d, "model.safetensors"))[1]
    weight_map = json.load(open(index))["weight_map"]
    tensors, total = {}, 0
    for file in sorted(set(weight_map.values())):
        _, t = read_safetensors(os.path.join(d, file))
        assert all(weight_map[k] == file for k in t), "%s holds a tensor the index puts elsewhere" % file
        tensors.update(t)
        total += sum(a.nbytes for a in t.values())
    assert json.load(open(index))["metadata"]["total_size"] == total, "total_size"
    assert set(weight_map) == set(tensors), "index and files list different tensors"
    return tensors


def check(ckpt, d, dtype):
    model = ckpt_model(ckpt)
    tensors = read_export(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["torch_dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[dtype]
    assert cfg["hidden_size"] == model["embed"].shape[1] and cfg["vocab_size"] == model["embed"].shape[0]
    assert cfg["num_hidden_layers"] == sum(1 for k in model if k.endswith(".wq"))
    assert cfg["tie_word_embeddings"] == ("lm_head" not in model)
    hd = cfg["head_dim"]
    assert cfg["num_attention_heads"] * hd == model["layers.0.wq"].shape[0]
    assert cfg["num_key_value_heads"] * hd == model["layers.0.wk"].shape[0]
    assert set(tensors) == {hf_name(k) for k in model}, "tensor names differ: %s" % (
        set(tensors) ^ {hf_name(k) for k in model})
    for name, a in model.items():
        t = tensors[hf_name(name)]
        want = a.astype(np.float32) if dtype == "fp32" else bf16_bits(a)
        assert t.shape == want.shape and t.dtype == want.dtype, "%s: %s %s" % (name, t.shape, t.dtype)
        assert np.array_equal(t.view(np.uint8), want.view(np.uint8)), "%s: values differ" % name
    print("export %s (%s): %d tensors equal the checkpoint's%s" % (d, dtype, len(model),
                                                               "" if dtype == "fp32" else " rounded to bf16"))


def write_safetensors(path, tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in tensors.values():
            f.write(a.astype("<f2").tobytes())


def write_fp16(ckpt, d, config_json):
    model = ckpt_model(ckpt)
    os.makedirs(d, exist_ok=True)
    names = sorted(model, reverse=True)  # another order than the exporter's
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for k, part in enumerate(halves):
        file = "model-%05d-of-00002.safetensors" % (k + 1)
        write_safetensors(os.path.join(d, file), {hf_name(n): model[n].astype(np.float16) for n in part})
        weight_map.update({hf_name(n): file for n in part})
    total = sum(model[n].size * 2 for n in names)
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))
    cfg = json.load(open(config_json))
    cfg["torch_dtype"] = "float16"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    print("wrote %d fp16 tensors in 2 files to %s" % (len(names), d))


def equals(new, ckpt, dtype):
    want, got = ckpt_model(ckpt), ckpt_model(new)
    assert set(want) == set(got), "tensor sets differ"
    for name, a in want.items():
        r = {"fp32": lambda x: x, "bf16": lambda x: as_f32(bf16_bits(x)),
             "fp16": lambda x: x.astype(np.float16).astype(np.float32)}[dtype](a.astype(np.float32))
        assert np.array_equal(got[name].view(np.uint32), r.view(np.uint32)), "%s differs" % name
    with h5py.File(new, "r") as f:
        moments = []
        f["optim"].visit(lambda k: moments.append(k) if isinstance(f["optim"][k], h5py.Dataset) else None)
        nonzero = [k for k in moments if np.any(f["optim"][k][...] != 0)]
        assert moments and not nonzero, "optimizer state not fresh: %s" % nonzero[:3]
    print("%s: %d model tensors equal %s's in %s; %d optimizer tensors are zero" % (new, len(want), ckpt, dtype,
                                                                                  len(moments)))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"check": check, "write-fp16": write_fp16, "equals": equals}[cmd](*args)
