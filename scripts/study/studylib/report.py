"""The study's report: report.json (every figure, machine-readable) and report.md (the header,
the verdict, tables of the runs and of the step split, failed variants with their logs' last
lines, expectations, plots), and the few lines printed at the end of a study."""
import json
import os

from . import machine
from .runs import SPLIT
from .verdict import num, rel


def cell(f, scale=1.0, pct=False):
    """A figure with its interval: "62,671 (62,100-63,000)"."""
    if not f:
        return "-"
    g = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: num(x * scale))
    if f.get("lo") is None or f["lo"] == f["hi"]:
        return g(f["value"])
    return f"{g(f['value'])} ({g(f['lo'])}-{g(f['hi'])})"


def unit_of(plans):
    return "GPU" if any(p["unit"] == "GPU" for p in plans.values()) else "CPU rank"


def build(study, ctx, res, plans, verdict, expect):
    """The report.json object. ctx: the call's plan (file, commit, date, command, machine)."""
    variants = []
    for v in study.variants:
        r, pv = res[v.name], plans[v.name]
        variants.append({
            "name": v.name, "label": v.label, "config": v.config, "overrides": v.overrides + pv["extra"],
            "ranks": pv["ranks"], "devices": pv["devices"], "unit": pv["unit"], "staged": pv["staged"],
            "layout": pv["dry"], "status": r["status"], "failures": r["failures"], "figures": r["figures"],
            "efficiency": r.get("efficiency"), "speedup": r.get("speedup"), "loss_check": r.get("loss_check"),
            "losses": r["losses"], "runs": [{"stem": x["stem"], "rc": x["rc"]} for x in r["runs"]]})
    over = "repeats" if study.repeats > 1 else "steps"
    return {"study": {"name": study.name, "title": study.title, "file": ctx["study_file"], "kind": study.kind,
                      "scaling": study.scaling or None, "config": study.config, "steps": study.steps,
                      "warmup": study.warmup, "repeats": study.repeats, "interval_over": over,
                      "baseline": verdict["reference"], "loss_rtol": study.loss_rtol, "loss_falls": study.loss_falls,
                      "expect": study.expect or None, "overrides": study.overrides, "set": study.cli_set},
            "machine": ctx.get("machine"), "machine_line": machine.headline(ctx.get("machine")),
            "commit": ctx["commit"], "date": ctx["date"], "command": ctx["command"], "unit": unit_of(plans),
            "verdict": verdict["verdict"], "lines": verdict["lines"], "failures": verdict["failures"],
            "notes": verdict["notes"], "expectations": expect, "variants": variants}


def _how(rep):
    s = rep["study"]
    first = s["warmup"] + 1
    if s["interval_over"] == "repeats":
        how = (f"the mean over the {s['repeats']} repeats of each repeat's median over steps {first}-{s['steps']}, "
               f"with a 95% Student-t interval over the repeats")
    else:
        plural = "s" if s["warmup"] != 1 else ""
        how = (f"medians over steps {first}-{s['steps']} (after {s['warmup']} warm-up step{plural}), with a 95% "
               f"interval over the steps (order statistics of the median; a speedup or efficiency: bootstrap of "
               f"the ratio of medians)")
    return (f"Figures are {how}. Tokens/s are all ranks' tokens per second divided by the {rep['unit']}s of the "
            f"run; the step split and the per-step memory are rank 0's (tp comm counts as compute on GPUs unless "
            f"log.time_tp=true); peak memory (the fullest rank), exposed communication and the pipeline bubble "
            f"come from each run's report (steps after the first).")


def _ratio_cell(v, rep):
    """A variant's efficiency (scaling) or speedup (compare) with its interval."""
    if rep["study"]["kind"] == "scaling":
        return cell(v["efficiency"], pct=True)
    if v["speedup"]:
        sp = v["speedup"]
        return f"{sp['value']:.2f} x ({sp['lo']:.2f}-{sp['hi']:.2f})"
    return "baseline" if v["name"] == rep["study"]["baseline"] else "-"


def _runs_table(rep):
    u = rep["unit"]
    kind = "efficiency" if rep["study"]["kind"] == "scaling" else "speedup"
    out = [f"| variant | ranks | {u}s | tokens/s per {u} | {kind} | TFLOP/s per {u} | MFU | ms/step | peak mem GiB "
           f"| final loss | status |", "|---" * 11 + "|"]
    for v in rep["variants"]:
        f = v["figures"]
        devices = f"{v['devices']} ({v['ranks']} ranks, staged)" if v["staged"] else str(v["devices"])
        status = v["status"] if v["status"] != "failed" else "FAILED: " + "; ".join(x["why"] for x in v["failures"])
        cells = [v["name"], str(v["ranks"]), devices, cell(f.get("tokens_per_s_per_device")), _ratio_cell(v, rep),
                 cell(f.get("tflops_per_device")), cell(f.get("mfu"), pct=True), cell(f.get("ms_per_step")),
                 num((f.get("report_peak_mem_gib") or {}).get("value")),
                 num((f.get("report_final_loss") or {}).get("value"), 5), status]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _split_table(rep):
    out = ["| variant | " + " | ".join(n for _, n in SPLIT) + " | step | exposed comm | bubble measured (busiest "
           "stage) | bubble in theory |", "|---" * (len(SPLIT) + 5) + "|"]
    for v in rep["variants"]:
        f = v["figures"]
        if not f:
            continue
        r = lambda k: (f.get("report_" + k) or {}).get("value")  # noqa: E731
        bubble = f"{r('bubble_pct'):.1f}% ({r('bubble_busiest_pct'):.1f}%)" if r("bubble_pct") is not None else "-"
        theory = f"{r('bubble_theory_pct'):.1f}%" if r("bubble_theory_pct") is not None else "-"
        exposed = f"{r('exposed_comm_pct'):.1f}%" if r("exposed_comm_pct") is not None else "-"
        out.append(f"| {v['name']} | " + " | ".join(num((f.get(k) or {}).get("value")) for k, _ in SPLIT) +
                   f" | {num((f.get('ms_per_step') or {}).get('value'))} | {exposed} | {bubble} | {theory} |")
    return out


def _expect_section(exp):
    if not exp:
        return []
    out = ["", "## Expectations", ""]
    if exp.get("note"):
        out.append(exp["note"] + ".")
    if exp.get("updated") is not None:
        out.append(f"Recorded {exp['updated']} variants' figures in `{exp['file']}` (--update-expectations).")
    rows = exp.get("rows") or []
    if rows:
        out += ["", "| variant | figure | expected | measured | tolerance | |", "|---|---|---|---|---|---|"]
        for r in rows:
            if r.get("note"):
                out.append(f"| {r['variant']} | - | - | - | - | {r['note']} |")
            else:
                out.append(f"| {r['variant']} | {r['figure']} | {num(r['expected'], 4)} | {num(r['measured'], 4)} | "
                           f"{rel(r['tolerance'])} | {'ok' if r['ok'] else 'BELOW'} |")
    return out


def _failed_section(rep):
    out = []
    for v in rep["variants"]:
        for f in v["failures"]:
            out += ["", f"### {f['stem']}: {f['why']}", ""]
            if f["errors"]:
                out += ["Error lines of its log:", "", "```"] + f["errors"] + ["```", ""]
            out += ["Last lines of its log:", "", "```"] + (f["log_tail"] or ["(no log)"]) + ["```"]
    return (["", "## Failed variants"] + out) if out else []


def markdown(rep, plots):
    s = rep["study"]
    title = f"Study {s['name']}" + (f": {s['title']}" if s["title"] else "")
    what = f"{s['scaling']} scaling" if s["kind"] == "scaling" else f"compare against {s['baseline']}"
    out = [f"# {title}", "", f"**{rep['verdict']}**" + (": " + "; ".join(rep["failures"]) if rep["failures"] else ""),
           "", f"- Machine: {rep['machine_line']}",
           f"- Commit: {rep['commit']} (the checkout scripts/study/study.py ran from)",
           f"- Date: {rep['date']}", f"- Command: `{rep['command']}`",
           f"- Study: `{s['file']}`, {what}, base config `{s['config']}`, {s['steps']} steps, {s['warmup']} warm-up, "
           f"{s['repeats']} repeat{'s' if s['repeats'] > 1 else ''}" +
           (f"; every variant also: `{' '.join(s['set'])}`" if s["set"] else ""), "", _how(rep), "", "## Verdict", ""]
    out += [f"- {line}" for line in rep["lines"]] + [f"- FAIL: {x}" for x in rep["failures"]]
    out += [f"- note: {n}" for n in rep["notes"]]
    if any(v["staged"] for v in rep["variants"]):
        out += ["", "Staged variants run more ranks than GPUs, sharing them over the staged MPI communicator "
                    "(parallel.gpu_comm=mpi): their per-GPU figures measure the sharing and the host copies, not "
                    "scaling."]
    out += ["", "## Runs", ""] + _runs_table(rep) + ["", "## Step split (ms per step, medians, rank 0)", ""]
    out += _split_table(rep) + _failed_section(rep) + _expect_section(rep["expectations"])
    if plots:
        out += ["", "## Plots", ""] + [f"![{os.path.splitext(p)[0]}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def write(out, rep, plots):
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(rep, plots))


def console(rep, out, plots):
    """What study.py prints at the end: the verdict, its lines and the runs table."""
    lines = ["", f"study {rep['study']['name']}: {rep['verdict']}"]
    lines += [f"  {x}" for x in rep["lines"]] + [f"  note: {x}" for x in rep["notes"]]
    lines += [f"  FAIL: {x}" for x in rep["failures"]] + [""] + _runs_table(rep)
    lines.append(f"\nreport: {os.path.join(out, 'report.md')}, report.json" + "".join(", " + p for p in plots))
    return "\n".join(lines)
