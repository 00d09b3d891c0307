#!/usr/bin/env python3
"""Scaling studies and speedup validation: runs the variants a study file names (configs/studies/,
docs/studies.md), each on its number of ranks, and reports per-GPU tokens/s, TFLOP/s, MFU, the
step split, the pipeline bubble and peak memory, with medians over the steps after warm-up and
95% intervals. A scaling study (weak or strong) sets each point's efficiency against the
smallest beside the ideal line; a compare sets each candidate against the baseline: its speedup
and whether its loss curve agrees. The study fails (exit 1, FAIL in the report) when a variant
fails, a loss curve differs by more than the study's tolerance, a study that expects the
candidate faster finds 1.0 inside the speedup's interval, or --check finds a figure more than
its tolerance below this machine kind's expectations (configs/studies/expect/). A study file
that cannot run as written is refused with one line naming the file, line and key (exit 2).

  study.py STUDY.yaml [--out DIR] [--trainer BIN] [--only VARIANT ...] [--set key=value ...]
           [--env NAME=value ...] [--mpirun-args=ARGS] [--steps N] [--warmup N] [--repeats N]
           [--share-gpus] [--launcher local|slurm] [--check] [--update-expectations]
  study.py --collect DIR [--check] [--update-expectations]    report from a finished study
  study.py --machine-info [--trainer BIN]                      this machine, as JSON

Outputs in DIR (default runs/studies/NAME): each run's STEM.jsonl, STEM.log and STEM.status,
plan.json, report.md, report.json and throughput.png, step_split.png, loss.png, memory.png.
The local launcher runs mpirun here, one run at a time; the slurm launcher writes an sbatch
script per run and DIR/submit.sh, and --collect DIR reports once the jobs have finished.
"""
import argparse
import glob
import json
import os
import shlex
import signal
import sys

from studylib import launch, machine, plots, report, runs, spec, verdict
from studylib.spec import StudyError

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", nargs="?", help="the study file (configs/studies/*.yaml)")
    ap.add_argument("--out", help="output folder (default runs/studies/NAME)")
    ap.add_argument("--collect", metavar="DIR", help="build the report from the runs a study left in DIR")
    ap.add_argument("--machine-info", action="store_true", help="print this machine's description as JSON")
    ap.add_argument("--trainer", help="the trainer binary (default: the study's launcher.trainer, build/trainer)")
    ap.add_argument("--launcher", choices=("local", "slurm"), help="override the study's launcher.kind")
    ap.add_argument("--only", nargs="+", metavar="VARIANT", help="run these variants only (the report covers "
                    "the others' runs already in the output folder)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a trainer override for every variant, after theirs (repeatable)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment of mpirun and the trainer, passed to every rank (repeatable)")
    ap.add_argument("--mpirun", help="the mpirun binary (default mpirun)")
    ap.add_argument("--mpirun-args", default="", metavar="=ARGS",
                    help="more mpirun arguments, one string: --mpirun-args='--oversubscribe --bind-to none'")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--warmup", type=int, help="steps left out of the medians")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--loss-rtol", type=float, help="loss-curve tolerance (overrides the study's loss_rtol)")
    ap.add_argument("--timeout", type=float, help="seconds a run may take before it is stopped")
    ap.add_argument("--share-gpus", action="store_true", help="variants with more ranks than visible GPUs share "
                    "them over the staged MPI communicator (parallel.gpu_comm=mpi), labelled staged")
    ap.add_argument("--gpus", type=int, help="GPUs visible to the study (default: nvidia-smi's count, cut to "
                    "CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--check", action="store_true", help="fail when a figure is below this machine kind's "
                    "expectation by more than its tolerance")
    ap.add_argument("--update-expectations", action="store_true", help="record this study's figures as the "
                    "machine kind's expectations")
    ap.add_argument("--expect-dir", default=os.path.join(ROOT, "configs", "studies", "expect"))
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    if not (a.study or a.collect or a.machine_info):
        ap.error("name a study file, --collect DIR or --machine-info")
    return a


def cli_mods(a):
    """The command line's changes to the study, kept in plan.json for --collect."""
    return {"steps": a.steps, "warmup": a.warmup, "repeats": a.repeats, "loss_rtol": a.loss_rtol, "set": a.set,
            "env": a.env, "trainer": os.path.abspath(a.trainer) if a.trainer else None, "launcher": a.launcher,
            "mpirun": a.mpirun, "mpirun_args": shlex.split(a.mpirun_args), "timeout_s": a.timeout}


def check_only(study, a):
    names = [v.name for v in study.variants]
    for n in a.only or []:
        if n not in names:
            raise StudyError(f"--only {n}: no such variant in {study.path} (variants: {', '.join(names)})")


def plan_study(study, a, trainer, env):
    """Each variant's plan: the trainer's dry run, devices, staging."""
    gpus = a.gpus if a.gpus is not None else machine.visible_gpus()[1]
    return {v.name: launch.plan_variant(study, v, trainer, env, ROOT, gpus, a.share_gpus) for v in study.variants}


def run_local(study, plans, selected, trainer, env, out):
    todo = [(v, k) for k in range(1, study.repeats + 1) for v in study.variants if v.name in selected]
    for i, (v, k) in enumerate(todo, 1):
        pv = plans[v.name]
        if pv["refused"]:
            launch.refuse(out, v, k, pv["refused"])
            print(f"== [{i}/{len(todo)}] {v.name} repeat {k}: not run: {pv['refused']}", flush=True)
            continue
        print(f"== [{i}/{len(todo)}] {v.name} repeat {k}: {v.ranks} rank(s), {pv['devices']} {pv['unit']}(s)"
              f"{', staged' if pv['staged'] else ''} ...", end=" ", flush=True)
        rc = launch.run_local(study, v, k, trainer, env, ROOT, out)
        print("ok" if rc == 0 else f"FAILED ({runs.describe_rc(rc)}; {launch.stem(v.name, k)}.log)", flush=True)


def write_slurm(study, plans, selected, trainer, out):
    """The slurm launcher: a refused variant's log says why; the others get their sbatch scripts."""
    todo = []
    for k in range(1, study.repeats + 1):
        for v in study.variants:
            if v.name in selected and plans[v.name]["refused"]:
                launch.refuse(out, v, k, plans[v.name]["refused"])
            elif v.name in selected:
                todo.append((v, k))
    for v in study.variants:
        if v.name in selected and plans[v.name]["refused"]:
            print(f"{v.name}: not run: {plans[v.name]['refused']}")
    me = os.path.abspath(__file__)
    driver = launch.write_slurm(study, todo, plans, trainer, ROOT, out, me)
    print(f"wrote {len(todo)} sbatch script(s) under {out}/slurm; submit them with: bash {driver}\n"
          f"then, once they have finished: python3 {me} --collect {out}")


def start(a):
    """Plans and runs (or, for slurm, writes) the study; returns (study, ctx, out, ran)."""
    mods = cli_mods(a)
    study = spec.apply_cli(spec.load(a.study, ROOT), mods)
    out = os.path.abspath(a.out or os.path.join(ROOT, "runs", "studies", study.name))
    check_only(study, a)
    trainer = launch.trainer_path(study, ROOT)
    env = launch.child_env(study)
    os.makedirs(out, exist_ok=True)
    plans = plan_study(study, a, trainer, env)
    selected = a.only or [v.name for v in study.variants]
    path = os.path.abspath(a.study)
    path = os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path
    ctx = {"version": 1, "study_file": path, "study_text": study.text,
           "mods": mods, "commit": machine.commit(ROOT), "date": machine.now(), "selected": selected,
           "command": shlex.join(["python3"] + sys.argv), "plans": plans,
           "machine": machine.describe(trainer, env) if study.launcher.kind == "local" else None}
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(ctx, f, indent=1)
    if study.launcher.kind == "slurm":
        write_slurm(study, plans, selected, trainer, out)
        return study, ctx, out, False
    run_local(study, plans, selected, trainer, env, out)
    return study, ctx, out, True


def collect(a):
    """The study, plan and output folder of --collect DIR; every variant must have run."""
    out = os.path.abspath(a.collect)
    try:
        with open(os.path.join(out, "plan.json")) as f:
            ctx = json.load(f)
    except (OSError, ValueError) as e:
        raise StudyError(f"{out}: no readable plan.json ({e}): not a study's output folder")
    study = spec.apply_cli(spec.parse(ctx["study_text"], ctx["study_file"], ROOT), ctx["mods"])
    for v in study.variants:
        v.extra = ctx["plans"][v.name]["extra"]
    for path in sorted(glob.glob(os.path.join(out, "*.machine.json"))):
        try:
            with open(path) as f:
                ctx["machine"] = json.load(f)
            break
        except (OSError, ValueError):
            continue
    ctx["selected"] = [v.name for v in study.variants]
    return study, ctx, out


def expectations(study, a, res, plans, ctx, rep_verdict):
    """--check and --update-expectations against configs/studies/expect/<machine kind>.json."""
    if not (a.check or a.update_expectations):
        return None
    on_gpu = any(p["unit"] == "GPU" for p in plans.values())
    path = verdict.expect_path(a.expect_dir, machine.kind_slug(ctx.get("machine") or {}, on_gpu))
    exp = {"file": path, "checked": a.check, "rows": [], "note": None}
    if a.check:
        exp["rows"], failures, exp["note"] = verdict.check_expectations(study, res, plans, path)
        rep_verdict["failures"] += failures
        rep_verdict["verdict"] = "FAIL" if rep_verdict["failures"] else rep_verdict["verdict"]
    if a.update_expectations:
        recorded = f"{ctx['date']}, commit {ctx['commit']}, {machine.headline(ctx.get('machine'))}"
        exp["updated"] = verdict.update_expectations(study, res, plans, path, machine.headline(ctx.get("machine")),
                                                     recorded)
    return exp


def finish(study, ctx, out, a):
    """Reads the runs, decides the verdict, writes the report and plots; returns the exit status."""
    plans = ctx["plans"]
    res = {v.name: runs.variant_result(study, v, plans[v.name], out, v.name in ctx["selected"])
           for v in study.variants}
    ver = verdict.evaluate(study, res, plans)
    few = [(v.name, f) for v in study.variants
           for f in [res[v.name]["figures"].get("tokens_per_s_per_device")] if f and f["coverage"] < 0.95]
    if few:
        ver["notes"].append(f"{', '.join(n for n, _ in few)}: {few[0][1]['n']} steps after warm-up are too few for a "
                            f"95% interval of a median, so the interval is the smallest to the largest step (it "
                            f"covers {100 * min(f['coverage'] for _, f in few):.0f}%)")
    exp = expectations(study, a, res, plans, ctx, ver)
    rep = report.build(study, ctx, res, plans, ver, exp)
    names, why = ([], "no plots (--no-plots)") if a.no_plots else plots.write(out, rep)
    if why:
        rep["notes"].append(why)
    report.write(out, rep, names)
    print(report.console(rep, out, names))
    return 0 if rep["verdict"] == "PASS" else 1


def main(argv):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # study.py ... | head: no traceback
    a = parse_args(argv)
    try:
        if a.machine_info:
            study_env = {**os.environ, **dict(kv.split("=", 1) for kv in a.env if "=" in kv)}
            print(json.dumps(machine.describe(a.trainer, study_env), indent=1))
            return 0
        if a.collect:
            study, ctx, out = collect(a)
        else:
            study, ctx, out, ran = start(a)
            if not ran:
                return 0
        return finish(study, ctx, out, a)
    except StudyError as e:
        print(f"study.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("study.py: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
