"""Running a study's variants: the trainer's command line of each, a dry run that lets the
trainer's config check refuse a variant before anything starts, the local launcher (mpirun here,
one run at a time) and the slurm one (an sbatch script per run and a driver that submits them).

Every run leaves three files in the output folder, named by its stem (the variant's name, with
.rK for repeat K > 1): STEM.jsonl (the trainer's metrics), STEM.log (the command, then its
output) and STEM.status (its exit status; none while it runs or when a job was killed)."""
import math
import os
import re
import shlex
import signal
import subprocess

from .spec import StudyError

REFUSED = "study.py: not run:"  # how the log of a refused variant begins (runs.py reads it)


def stem(name, repeat):
    return name if repeat == 1 else f"{name}.r{repeat}"


def trainer_path(study, root):
    path = study.launcher.trainer
    full = path if os.path.isabs(path) else os.path.join(root, path)
    if not (os.path.isfile(full) and os.access(full, os.X_OK)):
        raise StudyError(f"trainer binary '{path}' not found or not executable (build it with "
                         f"bash scripts/setup/setup.sh build, or pass --trainer PATH)")
    return os.path.abspath(full)


def child_env(study):
    """The environment of the launcher and the trainer: this one plus the study's env (and
    --env), which study.py itself never runs under (e.g. LD_LIBRARY_PATH of the trainer's libraries)."""
    return {**os.environ, **study.launcher.env}


def trainer_args(study, v, trainer, metrics):
    """The trainer's argv for variant v: checkpoints off unless the study turns them on, the
    study's overrides, the variant's, --set, then what the study needs from every run."""
    return ([trainer, v.config, "checkpoint.dir="] + study.overrides + v.overrides + v.extra + study.cli_set +
            [f"train.steps={study.steps}", "log.every=1", f"log.metrics={metrics}"])


def _dry_info(text):
    """What the trainer's --dry-run says of a variant: layout, batch, sequence, device."""
    info = {}
    m = re.search(r"^plan: (\d+) ranks = tp (\d+) x dp (\d+) x pp (\d+) \(vpp (\d+)\)", text, re.M)
    if m:
        info.update(zip(("world", "tp", "dp", "pp", "vpp"), map(int, m.groups())))
    m = re.search(r"^batch: global (\d+) sequences = dp \d+ x (\d+) micro-batches x (\d+)", text, re.M)
    if m:
        info.update(zip(("global_batch", "n_micro", "micro_batch"), map(int, m.groups())))
    m = re.search(r"^model: .*\bseq (\d+)", text, re.M)
    if m:
        info["seq_len"] = int(m.group(1))
    m = re.search(r"as train\.device=(\w+) holds it", text)
    info["device"] = m.group(1) if m else "auto"
    return info


def _refusal(text, rc):
    errors = [line for line in text.split("\n") if re.match(r"\s*(error|\S+:\d+: )", line)]
    lines = errors or [line for line in text.strip().split("\n") if line.strip()][-5:]
    return " / ".join(lines).strip() or f"exit status {rc}, no output"


def preflight(study, v, trainer, env, root):
    """(info, refusal): the trainer's dry run of the variant; refusal is its message, or None."""
    cmd = trainer_args(study, v, trainer, "/dev/null") + ["--dry-run", "--world-size", str(v.ranks)]
    try:
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {}, "the trainer's dry run did not finish in 300 s"
    except OSError as e:
        raise StudyError(f"cannot run the trainer '{trainer}': {e.strerror}")
    text = r.stdout + r.stderr
    return _dry_info(text), (_refusal(text, r.returncode) if r.returncode != 0 else None)


def _staged(study, v):
    """True when the variant's ranks share GPUs over the staged MPI communicator."""
    args = study.overrides + v.overrides + v.extra + study.cli_set
    vals = [a.split("=", 1)[1] for a in args if a.startswith("parallel.gpu_comm=")]
    return bool(vals) and vals[-1] == "mpi"


def plan_variant(study, v, trainer, env, root, gpus, share_gpus):
    """The variant's plan: device, devices (GPUs, or CPU ranks), whether ranks share GPUs, the
    dry run's layout and a refusal (the trainer's message) or None."""
    slurm = study.launcher.kind == "slurm"
    v.extra = []
    if share_gpus and not slurm and 0 < gpus < v.ranks:
        v.extra = ["parallel.gpu_comm=mpi"]
    info, refused = preflight(study, v, trainer, env, root)
    device = info.get("device", "auto")
    if device == "auto":
        device = "cuda" if slurm or gpus > 0 else "cpu"
    if device == "cpu":
        devices = v.ranks
    elif v.gpus:
        devices = v.gpus
    elif slurm or gpus == 0:  # a GPU a rank (where none is visible, the trainer says so)
        devices = v.ranks
    else:
        devices = min(v.ranks, gpus)
    staged = device == "cuda" and devices < v.ranks
    if staged and not refused and not _staged(study, v):
        refused = (f"{v.ranks} ranks need {v.ranks} GPUs with NCCL and {gpus} visible here: --share-gpus runs "
                   f"them on {devices} over the staged MPI communicator (parallel.gpu_comm=mpi), or leave the "
                   f"variant out with --only")
    return {"ranks": v.ranks, "devices": devices, "unit": "GPU" if device == "cuda" else "CPU rank", "device": device,
            "staged": staged, "extra": v.extra, "dry": info, "refused": refused}


def _mpirun(study, ranks, env):
    la = study.launcher
    cmd = [la.mpirun, "-np", str(ranks)]
    if os.geteuid() == 0 and "Open MPI" in subprocess.run([la.mpirun, "--version"], capture_output=True,
                                                          text=True, env=env).stdout:
        cmd.append("--allow-run-as-root")
    cmd += la.mpirun_args
    for name in sorted(set(la.env) | ({"LD_LIBRARY_PATH"} if env.get("LD_LIBRARY_PATH") else set())):
        cmd += ["-x", name]
    return cmd


def _clear(out, s):
    for ext in ("jsonl", "log", "status", "machine.json"):
        p = os.path.join(out, f"{s}.{ext}")
        if os.path.exists(p):
            os.remove(p)


def write_status(out, s, rc):
    with open(os.path.join(out, f"{s}.status"), "w") as f:
        f.write(f"{rc}\n")


def _stop(p):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=15)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def run_local(study, v, repeat, trainer, env, root, out):
    """Runs one repeat of a variant under mpirun and waits; returns its exit status."""
    s = stem(v.name, repeat)
    _clear(out, s)
    cmd = _mpirun(study, v.ranks, env) + trainer_args(study, v, trainer, os.path.join(out, f"{s}.jsonl"))
    log = os.path.join(out, f"{s}.log")
    with open(log, "w") as f:
        f.write(f"# {shlex.join(cmd)}\n")
        f.flush()
        try:
            p = subprocess.Popen(cmd, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise StudyError(f"cannot start '{cmd[0]}': {e.strerror} (launcher.mpirun, --mpirun)")
        try:
            rc = p.wait(timeout=study.launcher.timeout_s or None)
        except subprocess.TimeoutExpired:
            _stop(p)
            f.write(f"\nstudy.py: stopped at the time limit of {study.launcher.timeout_s:g} s (launcher.timeout_s)\n")
            rc = 124
        except KeyboardInterrupt:
            _stop(p)
            write_status(out, s, 130)
            raise
    rc = 128 - rc if rc < 0 else rc
    write_status(out, s, rc)
    return rc


def refuse(out, v, repeat, message):
    """A variant the trainer's dry run refused: its log says why, its status is 2."""
    s = stem(v.name, repeat)
    _clear(out, s)
    with open(os.path.join(out, f"{s}.log"), "w") as f:
        f.write(f"{REFUSED} {message}\n")
    write_status(out, s, 2)


def _sbatch_script(study, v, pv, repeat, trainer, root, out, study_py):
    la, s = study.launcher, stem(v.name, repeat)
    per_node = min(pv["devices"], la.gpus_per_node) if pv["device"] == "cuda" else v.ranks
    nodes = math.ceil(pv["devices"] / la.gpus_per_node) if pv["device"] == "cuda" else 1
    head = [f"--job-name=study-{study.name}-{s}", f"--nodes={nodes}", f"--ntasks={v.ranks}",
            f"--ntasks-per-node={max(1, math.ceil(v.ranks / nodes))}", f"--time={la.time}",
            f"--output={os.path.join(out, 'slurm', s + '.out')}"]
    if pv["device"] == "cuda":
        head.append(f"--gpus-per-node={per_node}")
    head += [f"--partition={la.partition}"] * bool(la.partition) + [f"--account={la.account}"] * bool(la.account)
    cmd = ["srun"] + la.srun_args + trainer_args(study, v, trainer, os.path.join(out, f"{s}.jsonl"))
    p = lambda ext: shlex.quote(os.path.join(out, f"{s}.{ext}"))  # noqa: E731
    lines = ["#!/bin/bash", f"# Study {study.name}, variant {v.name}, repeat {repeat} (written by scripts/study/study.py)."]
    lines += [f"#SBATCH {a}" for a in head + la.sbatch_args]
    lines += [f"cd {shlex.quote(root)}"] + [f"export {k}={shlex.quote(val)}" for k, val in sorted(la.env.items())]
    lines += [f"rm -f {p('status')}",
              f"python3 {shlex.quote(study_py)} --machine-info --trainer {shlex.quote(trainer)} > {p('machine.json')} "
              f"2> /dev/null || true",
              f"echo {shlex.quote('# ' + shlex.join(cmd))} > {p('log')}",
              f"{shlex.join(cmd)} >> {p('log')} 2>&1", f"echo $? > {p('status')}"]
    return "\n".join(lines) + "\n"


def write_slurm(study, runs, plan, trainer, root, out, study_py):
    """An sbatch script per run and OUT/submit.sh, which submits them (each after the one before
    with launcher.serial). Returns the driver's path."""
    os.makedirs(os.path.join(out, "slurm"), exist_ok=True)
    scripts = []
    for v, repeat in runs:
        s = stem(v.name, repeat)
        _clear(out, s)
        path = os.path.join(out, "slurm", f"{s}.sbatch")
        with open(path, "w") as f:
            f.write(_sbatch_script(study, v, plan[v.name], repeat, trainer, root, out, study_py))
        scripts.append(os.path.relpath(path, out))
    driver = os.path.join(out, "submit.sh")
    with open(driver, "w") as f:
        f.write(f"""#!/bin/bash
# Submits study {study.name}'s {len(scripts)} jobs; once they have finished,
#   python3 {study_py} --collect {out}
# writes the report. Written by scripts/study/study.py.
set -euo pipefail
cd "$(dirname "$0")"
serial={int(study.launcher.serial)}
prev=""
for s in {' '.join(shlex.quote(s) for s in scripts)}; do
  dep=()
  [ "$serial" = 1 ] && [ -n "$prev" ] && dep=("--dependency=afterany:$prev")
  prev=$(sbatch --parsable "${{dep[@]}}" "$s")
  prev=${{prev%%;*}}
  echo "submitted $s: job $prev"
done
echo "when the jobs have finished: python3 {study_py} --collect {out}"
""")
    os.chmod(driver, 0o755)
    return driver
