"""The report's plots, each 800 x 450 pixels: throughput.png (tokens/s per GPU and efficiency
against GPUs beside the ideal line, or for a compare each variant and its speedup), step_split.png
(a stacked bar of the step split per variant), loss.png (loss curves overlaid) and memory.png
(memory per rank)."""
import os

from .runs import SPLIT

SIZE, DPI = (8, 4.5), 100


def _err(figs, key, scale=1.0):
    """Values and asymmetric error bars of a figure across variants (0 where none)."""
    vals = [f[key]["value"] * scale if f.get(key) else 0 for f in figs]
    lo = [max(0, v - f[key]["lo"] * scale) if f.get(key) else 0 for v, f in zip(vals, figs)]
    hi = [max(0, f[key]["hi"] * scale - v) if f.get(key) else 0 for v, f in zip(vals, figs)]
    return vals, [lo, hi]


def title(rep, what):
    """A plot's title: the study and what the plot shows; where variants' ranks share GPUs over the
    staged communicator it names them, since their figures measure host copies, not scaling."""
    shared = [v["name"] for v in rep["variants"] if v.get("staged")]
    text = f"{rep['study']['name']}: {what}"
    return text + f"\n{', '.join(shared)}: ranks share GPUs over staged MPI, not a scaling figure" if shared else text


def _ok(rep):
    return [v for v in rep["variants"] if v["figures"]]


def _scaling(plt, rep, vs):
    u = rep["unit"]
    fig, (a, b) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    ref = next((v for v in vs if v["name"] == rep["study"]["baseline"]), vs[0])
    xs = [v["devices"] for v in vs]
    vals, err = _err([v["figures"] for v in vs], "tokens_per_s_per_device")
    a.errorbar(xs, vals, yerr=err, fmt="o", capsize=3, label="measured")
    a.axhline(ref["figures"]["tokens_per_s_per_device"]["value"], ls="--", color="gray", label=f"ideal ({ref['name']})")
    effs = [(v["devices"], v["efficiency"]) for v in vs if v.get("efficiency")]
    b.errorbar([x for x, _ in effs], [100 * e["value"] for _, e in effs],
               yerr=[[100 * (e["value"] - e["lo"]) for _, e in effs], [100 * (e["hi"] - e["value"]) for _, e in effs]],
               fmt="o", capsize=3, label="measured")
    b.axhline(100, ls="--", color="gray", label="ideal")
    for v, x, y in zip(vs, xs, vals):
        a.annotate(v["name"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for ax, yl in ((a, f"tokens/s per {u}"), (b, f"efficiency vs {ref['name']} (%)")):
        ax.set_xlabel(f"{u}s")
        ax.set_ylabel(yl)
        ax.set_xticks(sorted(set(xs)))
        ax.legend(fontsize=7)
        ax.set_ylim(bottom=0)
    fig.suptitle(title(rep, f"{rep['study']['scaling']} scaling"))
    return fig


def _compare(plt, rep, vs):
    u = rep["unit"]
    fig, (a, b) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    names = [v["name"] for v in vs]
    vals, err = _err([v["figures"] for v in vs], "tokens_per_s_per_device")
    a.bar(names, vals, yerr=err, capsize=3)
    a.set_ylabel(f"tokens/s per {u}")
    sp = [(v["name"], v["speedup"]) for v in vs if v.get("speedup")]
    b.bar([n for n, _ in sp], [s["value"] for _, s in sp], capsize=3,
          yerr=[[s["value"] - s["lo"] for _, s in sp], [s["hi"] - s["value"] for _, s in sp]])
    b.axhline(1.0, ls="--", color="gray", label=f"= {rep['study']['baseline']}")
    b.set_ylabel(f"speedup vs {rep['study']['baseline']}")
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.suptitle(title(rep, "compare"))
    return fig


def _split(plt, rep, vs):
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    names = [v["name"] for v in vs]
    bottom = [0.0] * len(vs)
    for key, label in SPLIT:
        h = [(v["figures"].get(key) or {}).get("value", 0) for v in vs]
        ax.bar(names, h, bottom=bottom, label=label)
        bottom = [b + x for b, x in zip(bottom, h)]
    for i, v in enumerate(vs):
        b = (v["figures"].get("report_bubble_pct") or {}).get("value")
        t = (v["figures"].get("report_bubble_theory_pct") or {}).get("value")
        if b is not None:
            ax.annotate(f"bubble {b:.0f}%\n(theory {t:.0f}%)", (i, bottom[i]), ha="center", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_ylabel("ms per step (median, rank 0)")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7)
    ax.set_title(title(rep, "step split"))
    return fig


def _loss(plt, rep, vs):
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for v in vs:
        ax.plot([s for s, _ in v["losses"]], [x for _, x in v["losses"]], label=v["name"], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=7)
    ax.set_title(title(rep, "loss curves"))
    return fig


def _memory(plt, rep, vs):
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    x = list(range(len(vs)))
    peak = [(v["figures"].get("report_peak_mem_gib") or {}).get("value", 0) for v in vs]
    rank0 = [(v["figures"].get("mem_gib") or {}).get("value", 0) for v in vs]
    ax.bar([i - 0.2 for i in x], peak, 0.4, label="peak, fullest rank (run report)")
    ax.bar([i + 0.2 for i in x], rank0, 0.4, label="rank 0, median per step")
    ax.set_xticks(x, [v["name"] for v in vs])
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.set_ylabel("GiB per rank")
    ax.legend(fontsize=7)
    ax.set_title(title(rep, "memory per rank"))
    return fig


def write(out, rep):
    """Writes the plots; returns (file names, None) or ([], why there are none)."""
    vs = _ok(rep)
    if not vs:
        return [], "no plots: no variant finished"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "no plots: matplotlib is missing (Debian: apt-get install python3-matplotlib)"
    kinds = [("throughput.png", _scaling if rep["study"]["kind"] == "scaling" else _compare),
             ("step_split.png", _split), ("loss.png", _loss), ("memory.png", _memory)]
    for name, fn in kinds:
        fig = fn(plt, rep, vs)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=DPI)
        plt.close(fig)
    return [name for name, _ in kinds], None
