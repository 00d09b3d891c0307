#!/usr/bin/env python3
"""Holds the sources to the layer order (README, docs/design.md): a file may include headers of
its own layer and of the layers below it, never of a layer above, and a folder's *_internal.h
only from that folder.

    kernels/base -> kernels -> kernels/cuda, data -> model -> model/format -> parallel/comm
                 -> parallel/comm/nccl -> parallel/step -> app

kernels/base holds what every layer uses (check and allocation macros, MPI checks, tracing,
JSON); model/format the file formats (checkpoints, safetensors, Hugging Face). parallel/ lies
wholly above model/: the model reaches its collectives through model/model_comm.h, which
parallel/comm implements.

Usage: check_includes.py [SOURCE_ROOT]   (prints each violation; exit 1 if there is one)
       check_includes.py --self-check   (the checker finds violations planted in a scratch tree)
"""
import os
import re
import sys
import tempfile

# Each layer and the layers its files may include (their own included). Longest prefix wins.
ALLOWED = {
    "kernels/base": {"kernels/base"},
    "kernels": {"kernels/base", "kernels"},
    "kernels/cuda": {"kernels/base", "kernels", "kernels/cuda"},
    "data": {"kernels/base", "kernels", "data"},
    "model": {"kernels/base", "kernels", "model"},
    "model/format": {"kernels/base", "kernels", "model", "model/format"},
    "parallel/comm": {"kernels/base", "kernels", "model", "parallel/comm"},
    "parallel/comm/nccl": {"kernels/base", "kernels", "kernels/cuda", "model", "parallel/comm", "parallel/comm/nccl"},
    "parallel/step": {"kernels/base", "kernels", "model", "parallel/comm", "parallel/step"},
    "app": {"kernels/base", "kernels", "kernels/cuda", "data", "model", "model/format", "parallel/comm",
            "parallel/comm/nccl", "parallel/step", "app"},
}
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    best = None
    for layer in ALLOWED:
        if (path == layer or path.startswith(layer + "/")) and (best is None or len(layer) > len(best)):
            best = layer
    return best


def violations(root):
    found = []
    for layer in sorted(ALLOWED):
        top = os.path.join(root, layer)
        for folder, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                if layer_of(path) != layer:
                    continue  # a deeper layer's file: checked under that layer
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        to = layer_of(target)
                        where = f"{path}:{n}: includes \"{target}\""
                        if not os.path.exists(os.path.join(root, target)):
                            found.append(f"{where}, which is not a file of the source tree (paths are from the root)")
                        elif to is None:
                            found.append(f"{where}, which is in no layer (only tests and scripts may use it)")
                        elif to not in ALLOWED[layer]:
                            found.append(f"{where}: layer {to} may not be included from layer {layer} (includes "
                                         "point down, README); move the code down or call it from a higher layer")
                        elif target.endswith("_internal.h") and os.path.dirname(target) != os.path.dirname(path):
                            found.append(f"{where}: an _internal.h header is private to its folder")
    return found


def self_check():
    planted = {
        "kernels/a.h": '#include "model/m.h"\n',               # up
        "model/m.h": '#include "model/m_internal.h"\n',       # fine: same folder
        "model/m_internal.h": "",
        "app/x.c": '#include "model/m_internal.h"\n',         # private header from elsewhere
        "parallel/comm/c.c": '#include "kernels/cuda/k.h"\n',  # the MPI layer may not use CUDA
        "kernels/cuda/k.h": '#include "kernels/missing.h"\n',  # no such file
        "parallel/step/s.c": '#include "model/m.h"\n#include "parallel/comm/nccl/n.h"\n',  # model fine; nccl up
        "parallel/comm/nccl/n.h": '#include "parallel/comm/c.h"\n',
        "parallel/comm/c.h": "",
        "model/b.c": '#include "parallel/comm/c.h"\n',      # the model may not reach a communicator
        "model/format/f.h": '#include "model/m.h"\n',       # fine: formats lie above the model
        "kernels/base/u.h": '#include "kernels/a.h"\n',     # base utilities lie below the kernels
    }
    with tempfile.TemporaryDirectory() as root:
        for path, text in planted.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        got = violations(root)
    want = ["kernels/a.h:1", "app/x.c:1", "parallel/comm/c.c:1", "kernels/cuda/k.h:1", "parallel/step/s.c:2",
            "model/b.c:1", "kernels/base/u.h:1"]
    ok = len(got) == len(want) and all(any(v.startswith(w + ":") for v in got) for w in want)
    print("\n".join(got))
    print(f"self-check: {len(got)} violations found, {len(want)} planted: {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-check"]:
        return self_check()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    found = violations(root)
    for v in found:
        print(v)
    print(f"include order: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
