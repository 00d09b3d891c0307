#!/usr/bin/env python3
"""Writes a Megatron indexed dataset (PREFIX.bin + PREFIX.idx, the "MMIDIDX" format) holding the
tokens of one of this project's shards, for the tests of the reader in data/data.c. Written from
the layout in docs/data.md, independently of the C reader, so the two check each other.

    megatron_dataset.py SHARD PREFIX [--dtype uint16|int32|CODE] [--first-token ID] [--corrupt KIND]

The tokens are cut into documents of pseudo-random lengths (a fixed LCG), some of two sequences,
so the index has many sequences and fewer documents. --corrupt damages the written pair in one
way (see CORRUPT) for the bad-input tests.
"""
import argparse
import struct
import sys

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
# Megatron's dtype codes.
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
NAMES = {"uint16": 8, "int32": 4}
CORRUPT = ("magic", "version", "truncate-idx", "short-header", "gap", "bin-size", "modes")


def read_shard(path):
    """Tokens of a TRNTOK shard (64-byte header: magic, version, token bytes, count)."""
    raw = open(path, "rb").read()
    if raw[:8] != b"TRNTOK\x00\x00":
        sys.exit("error: %s is not a TRNTOK shard (magic %r); expected a shard written by build/prepare" % (path, raw[:8]))
    token_bytes, n = struct.unpack_from("<Iq", raw, 12)
    return np.frombuffer(raw, dtype=np.uint16 if token_bytes == 2 else np.int32, count=n, offset=64).astype(np.int64)


def split(n_tokens):
    """Sequence lengths (1..1500 tokens, summing to n_tokens) and the document indices: index k is
    the number of sequences before document k, starting with 0 and ending with the sequence count."""
    lengths, docs, state, left = [], [0], 12345, n_tokens
    while left > 0:
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        n = min(left, 1 + (state >> 33) % 1500)
        lengths.append(n)
        left -= n
        if (state >> 20) % 3:  # two of three documents end here; the rest take a second sequence
            docs.append(len(lengths))
    if docs[-1] != len(lengths):
        docs.append(len(lengths))
    return np.array(lengths, dtype=np.int32), np.array(docs, dtype=np.int64)


def write(prefix, tokens, code):
    lengths, docs = split(len(tokens))
    dtype = DTYPES[code] if code in DTYPES else np.uint16
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * itemsize
    with open(prefix + ".bin", "wb") as f:
        f.write(tokens.astype(dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(docs)))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(docs.astype("<i8").tobytes())
    return len(lengths)


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def corrupt(prefix, kind, n_seq):
    idx, binf = prefix + ".idx", prefix + ".bin"
    size = len(open(idx, "rb").read())
    if kind == "magic":
        patch(idx, 0, b"MMIDIDY")
    elif kind == "version":
        patch(idx, 9, struct.pack("<Q", 2))
    elif kind == "truncate-idx":
        with open(idx, "r+b") as f:
            f.truncate(size - 5)
    elif kind == "short-header":
        with open(idx, "r+b") as f:
            f.truncate(20)
    elif kind == "gap":  # sequence 1 starts 2 bytes after sequence 0 ends
        off = 34 + 4 * n_seq + 8
        (p,) = struct.unpack("<q", open(idx, "rb").read()[off:off + 8])
        patch(idx, off, struct.pack("<q", p + 2))
    elif kind == "bin-size":
        with open(binf, "ab") as f:
            f.write(b"\x00\x00")
    elif kind == "modes":  # a multimodal dataset: one int8 mode per sequence after the index
        with open(idx, "ab") as f:
            f.write(bytes(n_seq))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shard")
    ap.add_argument("prefix")
    ap.add_argument("--dtype", default="uint16", help="uint16, int32 or a Megatron dtype code (1..8, or any byte)")
    ap.add_argument("--first-token", type=int, help="replace the first token by this id")
    ap.add_argument("--corrupt", choices=CORRUPT)
    a = ap.parse_args()
    code = NAMES[a.dtype] if a.dtype in NAMES else int(a.dtype)
    tokens = read_shard(a.shard).copy()
    if a.first_token is not None:
        tokens[0] = a.first_token
    n_seq = write(a.prefix, tokens, code)
    if a.corrupt:
        corrupt(a.prefix, a.corrupt, n_seq)


if __name__ == "__main__":
    main()
