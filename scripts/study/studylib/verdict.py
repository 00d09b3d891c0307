"""The study's verdict: failed variants; for a compare, each candidate's speedup over the
baseline and whether its loss curve agrees; for a scaling study, each point's efficiency
against the smallest; and the expectations of the machine kind (--check, --update-expectations)."""
import json
import os

from . import stats

EXPECT_FIGURES = ("tokens_per_s_per_device", "tflops_per_device", "mfu", "efficiency", "speedup")


def num(x, digits=3):
    """12,345 for large figures, 3 significant digits for small ones, - for none."""
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def rel(x):
    """A relative difference as a person reads it: 0.4%, or 3.1e-07 when tiny."""
    if x == 0:
        return "0"
    return f"{100 * x:.3g}%" if x >= 1e-4 else f"{x:.2g}"


def interval(r, pct=False):
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.2f}")
    return f"95% interval {f(r['lo'])}-{f(r['hi'])}, over {r['over']}"


def loss_agreement(base, cand):
    """Largest relative difference of two loss curves over the steps both logged."""
    b, c = dict(base["losses"]), dict(cand["losses"])
    common = sorted(set(b) & set(c))
    if not common:
        return None
    worst, at = max((abs(c[s] - b[s]) / abs(b[s]) if b[s] else abs(c[s] - b[s]), s) for s in common)
    return {"max_rel_diff": worst, "at_step": at, "steps": len(common)}


def _loss_check(study, base, cand, failures):
    """The loss part of a verdict line; adds a failure when the curves differ by more than loss_rtol."""
    la = loss_agreement(base, cand)
    if la is None:
        failures.append(f"{cand['name']}: no loss step in common with {base['name']}")
        return "no loss steps in common"
    tol = study.loss_rtol
    la.update(tolerance=tol, ok=la["max_rel_diff"] <= tol)
    cand["loss_check"] = la
    if la["ok"]:
        return f"loss curves agree: largest relative difference {rel(la['max_rel_diff'])} over {la['steps']} steps " \
               f"(tolerance {rel(tol)})"
    failures.append(f"{cand['name']}: loss curve differs from {base['name']}'s: largest relative difference "
                    f"{rel(la['max_rel_diff'])} at step {la['at_step']} (tolerance {rel(tol)})")
    return f"loss curves differ: largest relative difference {rel(la['max_rel_diff'])} at step {la['at_step']} of " \
           f"{la['steps']} (tolerance {rel(tol)})"


def _expect_check(study, name, sp, failures):
    if study.expect == "faster" and sp["lo"] <= 1.0:
        failures.append(f"{name}: expect: faster, but the 95% interval {sp['lo']:.2f}-{sp['hi']:.2f} "
                        f"{'includes' if sp['hi'] >= 1.0 else 'is below'} 1.0")
    if study.expect == "not_slower" and sp["hi"] < 1.0:
        failures.append(f"{name}: expect: not_slower, but the 95% interval {sp['lo']:.2f}-{sp['hi']:.2f} is below 1.0")


def _compare(study, res, plans, lines, failures, notes):
    """Each candidate against the baseline; returns the baseline's name."""
    base = res[study.baseline]
    for v in study.variants:
        c = res[v.name]
        if v.name == study.baseline or c["status"] == "not run":
            if c["status"] == "not run":
                notes.append(f"{v.name}: not run yet")
            continue
        if base["status"] != "ok" or c["status"] != "ok":
            if base["status"] == "not run":
                notes.append(f"{v.name}: baseline {base['name']} not run yet, so no speedup")
            continue
        sp = stats.ratio(c["step_values"], base["step_values"])
        c["speedup"] = sp
        text = f"{v.name} {sp['value']:.2f} x {base['name']} ({interval(sp)})" if sp else f"{v.name}: no speedup"
        if study.loss_rtol is not None:
            text += "; " + _loss_check(study, base, c, failures)
        if sp:
            _expect_check(study, v.name, sp, failures)
        lines.append(text)
    return study.baseline


def reference(study, plans):
    """The smallest point of a scaling study: the baseline if it has the fewest devices, else the
    first variant that does."""
    fewest = min(plans[v.name]["devices"] for v in study.variants)
    if plans[study.baseline]["devices"] == fewest:
        return study.baseline
    return next(v.name for v in study.variants if plans[v.name]["devices"] == fewest)


def _batch_rule(study, res, plans, notes):
    """Weak scaling keeps the sequences per rank, strong the global batch: a note where not."""
    dry = {v.name: plans[v.name]["dry"] for v in study.variants if plans[v.name]["dry"].get("global_batch")}
    if study.scaling == "weak":
        per = {n: d["global_batch"] / plans[n]["ranks"] for n, d in dry.items()}
        what = "sequences per rank"
    else:
        per = {n: d["global_batch"] for n, d in dry.items()}
        what = "global batch"
    if len(set(per.values())) > 1:
        notes.append(f"{study.scaling} scaling keeps the {what} equal, but it differs: " +
                     ", ".join(f"{n} {x:g}" for n, x in per.items()))


def _scaling(study, res, plans, lines, failures, notes):
    """Each point's efficiency against the smallest; returns the smallest point's name."""
    ref_name = reference(study, plans)
    ref = res[ref_name]
    _batch_rule(study, res, plans, notes)
    for v in study.variants:
        r, pv = res[v.name], plans[v.name]
        if r["status"] == "not run":
            notes.append(f"{v.name}: not run yet")
        if r["status"] != "ok" or ref["status"] != "ok":
            continue
        eff = {"value": 1.0, "lo": 1.0, "hi": 1.0, "over": "-"} if v.name == ref_name else \
            stats.ratio(r["step_values"], ref["step_values"])
        r["efficiency"] = eff
        unit = pv["unit"] + ("s" if pv["devices"] > 1 else "")
        staged = (f" ({pv['ranks']} ranks share {'it' if pv['devices'] == 1 else 'them'} over staged MPI: not a "
                  f"scaling figure)" if pv["staged"] else "")
        text = f"{v.name}: {pv['devices']} {unit}{staged}, {100 * eff['value']:.1f}% of {ref_name} per {pv['unit']}"
        if v.name != ref_name:
            text += f" ({interval(eff, pct=True)})"
            if study.loss_rtol is not None:
                text += "; " + _loss_check(study, ref, r, failures)
        lines.append(text)
    return ref_name


def evaluate(study, res, plans):
    """PASS or FAIL, a line per candidate or point, the failures and notes."""
    lines, failures, notes = [], [], []
    for v in study.variants:
        for f in res[v.name]["failures"]:
            failures.append(f"{f['stem']}: {f['why']}")
    ref = (_compare if study.kind == "compare" else _scaling)(study, res, plans, lines, failures, notes)
    if study.loss_falls:
        for v in study.variants:
            ls = res[v.name]["losses"]
            if res[v.name]["status"] == "ok" and not ls[-1][1] < ls[0][1]:
                failures.append(f"{v.name}: loss does not fall ({ls[0][1]:.4f} at step {ls[0][0]} -> "
                                f"{ls[-1][1]:.4f} at step {ls[-1][0]})")
    return {"verdict": "FAIL" if failures else "PASS", "reference": ref, "lines": lines, "failures": failures,
            "notes": notes}


def _measured(r):
    out = {k: r["figures"][k]["value"] for k in EXPECT_FIGURES if k in r.get("figures", {})}
    for k in ("efficiency", "speedup"):
        if r.get(k) and r[k]["over"] != "-":  # not the reference point's 1.0
            out[k] = r[k]["value"]
    return out


def expect_path(expect_dir, slug):
    return os.path.join(expect_dir, f"{slug}.json")


def check_expectations(study, res, plans, path):
    """Rows (variant, figure, expected, measured, tolerance, ok) and failures: a figure more than
    its tolerance below the expected one fails."""
    if not os.path.exists(path):
        return [], [], f"no expectations for this machine kind ({path})"
    with open(path) as f:
        recorded = json.load(f).get("studies", {}).get(study.name, {})
    rows, failures = [], []
    for v in study.variants:
        entry, r = recorded.get(v.name), res[v.name]
        if not entry or r["status"] != "ok":
            continue
        if entry.get("devices") != plans[v.name]["devices"] or entry.get("ranks") != plans[v.name]["ranks"]:
            rows.append({"variant": v.name, "figure": "-", "note": f"recorded on {entry.get('devices')} devices, "
                         f"{entry.get('ranks')} ranks: not compared"})
            continue
        got = _measured(r)
        for fig, e in entry["figures"].items():
            if fig not in got:
                continue
            ok = got[fig] >= e["value"] * (1 - e["tolerance"])
            rows.append({"variant": v.name, "figure": fig, "expected": e["value"], "measured": got[fig],
                         "tolerance": e["tolerance"], "ok": ok})
            if not ok:
                failures.append(f"{v.name}: {fig} {num(got[fig], 4)} is {rel(1 - got[fig] / e['value'])} below the "
                                f"expected {num(e['value'], 4)} (tolerance {rel(e['tolerance'])}, {path})")
    return rows, failures, None


def update_expectations(study, res, plans, path, headline, recorded):
    """Records the successful variants' figures as the expectations of this machine kind,
    keeping each figure's tolerance where one was stated."""
    data = {"machine": headline, "studies": {}}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    entries = data.setdefault("studies", {}).setdefault(study.name, {})
    n = 0
    for v in study.variants:
        r = res[v.name]
        if r["status"] != "ok":
            continue
        old = entries.get(v.name, {}).get("figures", {})
        entries[v.name] = {"ranks": plans[v.name]["ranks"], "devices": plans[v.name]["devices"], "recorded": recorded,
                           "figures": {k: {"value": round(x, 6), "tolerance": old.get(k, {}).get(
                               "tolerance", study.expect_tolerance)} for k, x in _measured(r).items()}}
        n += 1
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    return n
