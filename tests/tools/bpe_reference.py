#!/usr/bin/env python3
"""An independent byte-level BPE, written from the format's description (Hugging Face
tokenizer.json, GPT-2's byte-to-unicode map and merge rule), for the fixtures of
tests/unit/test_bpe.c: it trains a small tokenizer and encodes test texts with the pre-tokenizer
patterns run by the `regex` module, where data/bpe.c matches them by hand.

    tests/tools/bpe_reference.py train TEXT N_MERGES STYLE OUT.json    STYLE: gpt2 or llama3
    tests/tools/bpe_reference.py encode TOKENIZER.json CASES.txt OUT.json
CASES.txt: test texts separated by lines holding only "%%" (escapes \\n \\r \\t \\\\ decoded).
OUT.json of encode: [{"text": ..., "ids": [...]}, ...].
"""
import json
import sys
from collections import Counter

import regex

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
          r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"


def byte_chars():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


BYTE = byte_chars()
UNBYTE = {c: b for b, c in BYTE.items()}


def mapped(s):
    return "".join(BYTE[b] for b in s.encode("utf-8"))


def merge_pair(sym, a, b):
    """sym with every occurrence of the adjacent pair a, b merged, left to right."""
    out, i = [], 0
    while i < len(sym):
        if i + 1 < len(sym) and sym[i] == a and sym[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(sym[i])
            i += 1
    return out


def train(text, n_merges, style):
    pat = regex.compile(GPT2 if style == "gpt2" else LLAMA3)
    words = Counter(tuple(mapped(w)) for w in pat.findall(text))
    vocab = {BYTE[b]: b for b in range(256)}
    merges = []
    while len(merges) < n_merges:
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        new = Counter()
        for w, c in words.items():
            new[tuple(merge_pair(w, a, b))] += c
        words = new
    eot = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": style == "gpt2"}
    pre = byte_level if style == "gpt2" else {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False}, byte_level]}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": eot, "content": EOT, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": style == "llama3", "vocab": vocab,
                      "merges": [f"{a} {b}" if style == "gpt2" else [a, b] for a, b in merges]}}


def encode(tok, text):
    model = tok["model"]
    vocab = model["vocab"]
    ranks = {}
    for r, m in enumerate(model["merges"]):
        a, b = m.split(" ") if isinstance(m, str) else m
        ranks.setdefault((a, b), r)
    pre = tok["pre_tokenizer"]
    pat = regex.compile(GPT2 if pre["type"] == "ByteLevel" else pre["pretokenizers"][0]["pattern"]["Regex"])
    added = sorted(((t["content"], t["id"]) for t in tok["added_tokens"]), key=lambda t: -len(t[0]))
    ids = []

    def word(w):
        m = mapped(w)
        if model.get("ignore_merges") and m in vocab:
            ids.append(vocab[m])
            return
        sym = list(m)
        while True:
            cands = [(ranks[p], p) for p in zip(sym, sym[1:]) if p in ranks]
            if not cands:
                break
            _, (a, b) = min(cands)
            sym = merge_pair(sym, a, b)
        ids.extend(vocab[s] for s in sym)

    i = start = 0
    while i <= len(text):
        hit = next(((c, d) for c, d in added if text.startswith(c, i)), None) if i < len(text) else None
        if hit or i == len(text):
            for w in pat.findall(text[start:i]):
                word(w)
            if hit:
                ids.append(hit[1])
                i += len(hit[0])
                start = i
                continue
        i += 1
    return ids


def unescape(s):
    return s.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "train":
        text = open(sys.argv[2], encoding="utf-8").read()
        tok = train(text, int(sys.argv[3]), sys.argv[4])
        json.dump(tok, open(sys.argv[5], "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    elif len(sys.argv) == 5 and sys.argv[1] == "encode":
        tok = json.load(open(sys.argv[2], encoding="utf-8"))
        cases = [unescape(c) for c in open(sys.argv[3], encoding="utf-8").read().split("\n%%\n") if c]
        json.dump([{"text": c, "ids": encode(tok, c)} for c in cases], open(sys.argv[4], "w", encoding="utf-8"),
                  ensure_ascii=False, indent=0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
