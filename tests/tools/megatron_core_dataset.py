#!/usr/bin/env python3
"""Writes the dataset tests/tools/megatron_dataset.py writes (the same tokens, sequences and
documents) with Megatron-Core's own IndexedDatasetBuilder, for e2e_data_megatron where Megatron-Core
can be imported: installed (`megatron.core`), or a copy of its file
megatron/core/datasets/indexed_dataset.py named by --module, loaded with stand-ins for the
object-storage helpers it imports (a local path never reaches them), and for torch where it is not
installed (the file takes from it only a base class and type names; the builder writes through
numpy).

    megatron_core_dataset.py SHARD PREFIX [--dtype uint16|int32] [--module PATH]
    megatron_core_dataset.py --probe [--module PATH]    exit 0 where the builder can be imported
"""
import argparse
import importlib.util
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_dataset import read_shard, split  # noqa: E402  (the documents the other writer makes)


def stand_ins():
    """The modules indexed_dataset.py imports besides numpy and torch, reduced to what a dataset
    on a local path uses: files opened with open(), no logging."""
    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        m.__path__ = []
        sys.modules.setdefault(name, m)
        return sys.modules[name]

    unused = lambda *a, **k: None  # noqa: E731
    module("megatron")
    module("megatron.core")
    module("megatron.core.datasets")
    module("megatron.core.datasets.object_storage_utils", S3Config=object, ObjectStorageConfig=object,
           cache_index_file=unused, dataset_exists=unused, get_index_cache_path=unused,
           get_object_storage_access=unused, is_object_storage_path=lambda path: False, parse_s3_path=unused)
    module("megatron.core.msc_utils", MultiStorageClientFeature=type("MSC", (), {"is_enabled": staticmethod(lambda: False)}),
           maybe_msc=types.SimpleNamespace(open=open))
    module("megatron.core.utils", log_single_rank=unused)
    if importlib.util.find_spec("torch") is None:
        module("torch", Tensor=object, utils=types.SimpleNamespace(data=types.SimpleNamespace(Dataset=object)))


def builder_class(path):
    if path is None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        return IndexedDatasetBuilder
    stand_ins()
    spec = importlib.util.spec_from_file_location("megatron.core.datasets.indexed_dataset", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.IndexedDatasetBuilder


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shard", nargs="?")
    ap.add_argument("prefix", nargs="?")
    ap.add_argument("--dtype", choices=["uint16", "int32"], default="uint16")
    ap.add_argument("--module", help="path of megatron/core/datasets/indexed_dataset.py (default: the installed one)")
    ap.add_argument("--probe", action="store_true")
    a = ap.parse_args()
    builder = builder_class(a.module)
    if a.probe:
        return
    if not a.shard or not a.prefix:
        ap.error("SHARD and PREFIX are needed")
    tokens = read_shard(a.shard)
    lengths, docs = split(len(tokens))
    b = builder(a.prefix + ".bin", dtype=np.uint16 if a.dtype == "uint16" else np.int32)
    at = 0
    for k in range(1, len(docs)):
        seqs = [int(n) for n in lengths[docs[k - 1]:docs[k]]]
        b.add_document(tokens[at:at + sum(seqs)], seqs)
        at += sum(seqs)
    b.finalize(a.prefix + ".idx")
    print(f"wrote {a.prefix}.bin and .idx with Megatron-Core's IndexedDatasetBuilder: {len(tokens)} tokens, "
          f"{len(lengths)} sequences, {len(docs) - 1} documents")


if __name__ == "__main__":
    main()
