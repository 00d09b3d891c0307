"""The machine a study ran on, for the report's header: GPU model and count, driver, CUDA, NCCL
and MPI versions where they can be found, the CPU otherwise; the commit and the date."""
import datetime
import mmap
import os
import re
import subprocess


def _run(cmd, env=None):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
        return r.stdout if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def visible_gpus():
    """(model, count) of the GPUs this process may use: nvidia-smi's list, cut to
    CUDA_VISIBLE_DEVICES when set; (None, 0) without nvidia-smi."""
    rows = [r.split(", ") for r in _run(["nvidia-smi", "--query-gpu=name,driver_version",
                                         "--format=csv,noheader"]).strip().split("\n") if r.strip()]
    if not rows:
        return None, 0
    n = len(rows)
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([d for d in vis.split(",") if d.strip()]))
    return rows[0][0], n


def _linked_version(trainer, env, lib, pattern):
    """A version string found in the library `lib` the trainer loads (ldd, with the run's env)."""
    m = re.search(r"^\s*%s\S* => (\S+)" % re.escape(lib), _run(["ldd", trainer], env), re.M)
    if not m:
        return None
    try:
        with open(m.group(1), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            v = re.search(pattern, mm)
            return v.group(1).decode() if v else None
    except (OSError, ValueError):
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            return m.group(1).strip() if m else "unknown CPU"
    except OSError:
        return "unknown CPU"


def describe(trainer=None, env=None):
    """Everything the header names, as a JSON-able dict."""
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    rows = [r.split(", ") for r in smi.strip().split("\n") if r.strip()]
    model, count = visible_gpus()
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", _run(["nvidia-smi"]))
    mpi = _run(["mpirun", "--version"]).split("\n")[0]
    mpi = re.sub(r"^mpirun \((.*)\) (\S+).*$", r"\1 \2", mpi) if mpi else None
    info = {"gpu_model": model, "gpu_count": count, "driver": rows[0][1] if rows else None,
            "cuda": cuda.group(1) if cuda else None, "mpi": mpi, "nccl": None,
            "cpu_model": _cpu_model(), "cpu_cores": os.cpu_count()}
    if trainer and os.path.exists(trainer):
        info["nccl"] = _linked_version(trainer, env, "libnccl.so", rb"NCCL version (\d+\.\d+\.\d+[0-9A-Za-z.+]*)")
    return info


def headline(info):
    """One line: "1 x NVIDIA H100 80GB HBM3 (driver 570.1, CUDA 12.8, NCCL 2.27.3, Open MPI 4.1.4)"."""
    if not info:
        return "not recorded (the runs left no machine description)"
    parts = [f"{k} {info[v]}" for k, v in (("driver", "driver"), ("CUDA", "cuda"), ("NCCL", "nccl"))
             if info.get(v) and info.get("gpu_count")]
    if info.get("mpi"):
        parts.append(info["mpi"])
    if info.get("gpu_count"):
        what = f"{info['gpu_count']} x {info['gpu_model']}"
        parts.append(f"CPU {info['cpu_model']}, {info['cpu_cores']} cores")
    else:
        what = f"no GPU; CPU {info['cpu_model']}, {info['cpu_cores']} cores"
    return f"{what} ({', '.join(parts)})" if parts else what


def kind_slug(info, on_gpu):
    """The machine kind that names an expectations file: the GPU model, or the CPU's."""
    name = info.get("gpu_model") if on_gpu and info.get("gpu_model") else "cpu " + info.get("cpu_model", "unknown")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def commit(root):
    """The checkout's commit (with -dirty when tracked files differ from it), or "unknown"."""
    head = _run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"]).strip()
    if not head:
        return "unknown"
    dirty = subprocess.run(["git", "-C", root, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode
    return head + ("-dirty" if dirty == 1 else "")


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
