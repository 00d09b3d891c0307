"""What the runs left in the output folder (launch.py names the files), read back into each
variant's status and figures: medians over the steps after warm-up of the per-step metrics
(app/report.c writes them), and the run report's whole-run figures (peak memory, bubble)."""
import json
import os
import re

from . import stats
from .launch import REFUSED, stem

# Per-step metrics summarised per variant: key in the metrics record -> how a rank's figure
# becomes one of the variant's (per device: a GPU, or a CPU rank).
STEP_KEYS = ("tokens_per_s", "tflops_per_rank", "mfu", "ms_per_step", "ms_compute", "ms_tp_comm", "ms_pp_comm",
             "ms_dp_comm", "ms_optimizer", "ms_data", "mem_gib")
REPORT_KEYS = ("peak_mem_gib", "exposed_comm_pct", "bubble_pct", "bubble_busiest_pct", "bubble_theory_pct",
               "final_loss", "final_val_loss", "wall_s")
SPLIT = (("ms_compute", "compute"), ("ms_tp_comm", "tp comm"), ("ms_pp_comm", "pipeline comm + bubble"),
         ("ms_dp_comm", "exposed dp comm"), ("ms_optimizer", "optimizer"), ("ms_data", "data"))
LOG_TAIL = 12


def _read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _records(text):
    """The metrics file's JSON objects; a line cut short by a crash is left out."""
    rows = []
    for line in (text or "").split("\n"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _without_banners(lines):
    """The log less Open MPI's boxed notices (between rules of dashes), so that its last lines
    are the trainer's own."""
    out, box = [], None
    for line in lines:
        if re.fullmatch(r"-{20,}", line.strip()):
            if box is None:
                box = []
            else:
                if not re.search(r"mpirun|Primary job|MPI_ABORT|prterun", " ".join(box)):
                    out += box
                box = None
            continue
        (box if box is not None else out).append(line)
    return out + (box or [])


def _errors(lines, n=5):
    """The log's first error lines: the trainer prints its errors to stderr, which may land in
    the log before the buffered stdout that precedes them, so they are not always its last lines."""
    pat = re.compile(r"\s*(error|fatal)\b|.*\b(CHECK|Assertion).*fail", re.I)
    return [x.strip() for x in lines if pat.match(x)][:n]


def read_run(out, s):
    """One run: its exit status (None: none recorded), step records, run report, log tail, backend."""
    status = _read_text(os.path.join(out, f"{s}.status"))
    log = _read_text(os.path.join(out, f"{s}.log"))
    rows = _records(_read_text(os.path.join(out, f"{s}.jsonl")))
    reports = [r for r in rows if r.get("report")]
    backend = re.search(r"^model: .*?, (\w+) backend,", log or "", re.M)
    try:
        rc = int(status.strip()) if status is not None else None
    except ValueError:
        rc = None
    return {"stem": s, "found": any(x is not None for x in (status, log)) or bool(rows), "rc": rc,
            "steps": [r for r in rows if "step" in r and "loss" in r], "report": reports[-1] if reports else None,
            "log_tail": _without_banners(log.rstrip("\n").split("\n"))[-LOG_TAIL:] if log else [],
            "errors": _errors(log.split("\n")) if log else [],
            "backend": backend.group(1) if backend else None,
            "refused": log[len(REFUSED):].strip() if log and log.startswith(REFUSED) else None}


def _why_failed(run):
    if run["refused"]:
        return f"not run: {run['refused']}"
    if run["rc"] is None:
        return ("no exit status recorded (the job did not finish: still running, cancelled or past its time "
                "limit?)" if run["found"] else "not run: no log, metrics or status in the output folder")
    if run["rc"] != 0:
        return describe_rc(run["rc"]) + (f": {run['errors'][0]}" if run["errors"] else "")
    if run["report"] is None:
        return "exit status 0, but the metrics file holds no run report"
    return None


def describe_rc(rc):
    if rc == 124:
        return "exit status 124 (stopped at the time limit)"
    if rc > 128:
        return f"exit status {rc} (signal {rc - 128})"
    return f"exit status {rc}"


def _per_device(run, pv, key):
    """A step metric of the run after warm-up, per device where the key is per rank or total."""
    scale = {"tokens_per_s": 1 / pv["devices"], "tflops_per_rank": pv["ranks"] / pv["devices"],
             "mfu": pv["ranks"] / pv["devices"]}.get(key, 1)
    return [r[key] * scale for r in run["steps"] if r["step"] > run["warmup"] and r.get(key) is not None]


def figures(ok_runs, pv):
    """The variant's figures from its successful runs (one per repeat)."""
    names = {"tokens_per_s": "tokens_per_s_per_device", "tflops_per_rank": "tflops_per_device", "mfu": "mfu"}
    figs = {}
    for key in STEP_KEYS:
        f = stats.summarize([_per_device(r, pv, key) for r in ok_runs])
        if f is not None:
            figs[names.get(key, key)] = f
    if "tokens_per_s_per_device" in figs:
        f = stats.summarize([[x * pv["devices"] for x in _per_device(r, pv, "tokens_per_s")] for r in ok_runs])
        figs["tokens_per_s"] = f
    for key in REPORT_KEYS:
        vals = [r["report"][key] for r in ok_runs if r["report"].get(key) is not None]
        if vals:
            m, lo, hi = stats.mean_interval(vals)
            figs["report_" + key] = {"value": m, "lo": lo, "hi": hi, "n": len(vals), "over": "runs"}
    return figs


def variant_result(study, v, pv, out, required):
    """Status, failures, figures and loss curve of variant v. `required`: a variant with no files
    is a failure (it was run, or --collect needs it), else it is only "not run"."""
    runs = [read_run(out, stem(v.name, k)) for k in range(1, study.repeats + 1)]
    for r in runs:
        r["warmup"] = study.warmup
    if not required and not any(r["found"] for r in runs):
        return {"name": v.name, "status": "not run", "runs": runs, "failures": [], "figures": {}, "losses": []}
    failures = [(r, _why_failed(r)) for r in runs if _why_failed(r)]
    ok = [r for r in runs if not _why_failed(r)]
    too_short = [r for r in ok if not any(s["step"] > study.warmup for s in r["steps"])]
    for r in too_short:
        failures.append((r, f"no step after the {study.warmup} warm-up steps in its metrics"))
    ok = [r for r in ok if r not in too_short]
    return {"name": v.name, "status": "failed" if failures else "ok", "runs": runs,
            "failures": [{"stem": r["stem"], "why": why, "rc": r["rc"], "errors": r["errors"],
                          "log_tail": r["log_tail"]} for r, why in failures],
            "figures": figures(ok, pv) if ok else {}, "backend": next((r["backend"] for r in ok), None),
            "losses": [[s["step"], s["loss"]] for s in ok[0]["steps"]] if ok else [],
            "step_values": [_per_device(r, pv, "tokens_per_s") for r in ok]}
