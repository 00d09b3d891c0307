"""A study file (configs/studies/*.yaml): its keys, their defaults, and errors that name the file,
the line and the key. docs/studies.md describes every key."""
import dataclasses
import difflib
import os
import re


class StudyError(Exception):
    """A study that cannot run as written: the message names what is wrong and what to do."""


TOP_KEYS = ("name", "title", "kind", "scaling", "config", "steps", "warmup", "repeats", "overrides", "variants",
            "baseline", "loss_rtol", "loss_falls", "expect", "expect_tolerance", "launcher")
VARIANT_KEYS = ("name", "ranks", "config", "overrides", "gpus", "label")
LAUNCHER_KEYS = ("kind", "trainer", "mpirun", "mpirun_args", "env", "timeout_s", "partition", "account", "time",
                 "gpus_per_node", "sbatch_args", "srun_args", "serial")
DEFAULT_LOSS_RTOL = 0.01      # compare: candidates' loss curves within 1% of the baseline's
DEFAULT_EXPECT_TOLERANCE = 0.05  # expectations: a figure may fall 5% below the recorded one


@dataclasses.dataclass
class Variant:
    name: str
    ranks: int
    config: str                 # repository-relative (or absolute) path of its base config
    overrides: list             # "section.key=value", after the study's
    gpus: int = 0               # GPUs the variant uses; 0 = one a rank, as many as the machine lends
    label: str = ""
    extra: list = dataclasses.field(default_factory=list)  # overrides study.py adds (--share-gpus)


@dataclasses.dataclass
class Launcher:
    kind: str = "local"
    trainer: str = "build/trainer"
    mpirun: str = "mpirun"
    mpirun_args: list = dataclasses.field(default_factory=lambda: ["--bind-to", "none"])
    env: dict = dataclasses.field(default_factory=dict)
    timeout_s: float = 0.0      # a run longer than this is stopped; 0 = no limit
    partition: str = ""
    account: str = ""
    time: str = "01:00:00"
    gpus_per_node: int = 8
    sbatch_args: list = dataclasses.field(default_factory=list)
    srun_args: list = dataclasses.field(default_factory=list)
    serial: bool = False        # slurm: each job waits for the one before (no two share the network)


@dataclasses.dataclass
class Study:
    path: str
    text: str
    name: str
    title: str
    kind: str                   # scaling | compare
    scaling: str                # weak | strong (kind scaling)
    config: str
    steps: int
    warmup: int
    repeats: int
    overrides: list
    variants: list
    baseline: str
    loss_rtol: float            # None: no loss-curve check
    loss_falls: bool
    expect: str                 # compare: "" | faster | not_slower
    expect_tolerance: float
    launcher: Launcher
    cli_set: list = dataclasses.field(default_factory=list)  # --set: after every variant's overrides

    def variant(self, name):
        return next(v for v in self.variants if v.name == name)


def _line_of(text, key):
    """The first line that sets `key` (for error messages; PyYAML's result has no lines)."""
    for i, line in enumerate(text.split("\n"), 1):
        if re.search(r"(^|[\s{,-])%s\s*:" % re.escape(key), line.split("#")[0]):
            return i
    return None


def _err(study, msg, key=None):
    line = _line_of(study["_text"], key) if key else None
    return StudyError(f"{study['_path']}{':%d' % line if line else ''}: {msg}")


def _check_keys(study, mapping, allowed, where):
    for k in mapping:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, 1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise _err(study, f"unknown key '{k}' in {where} ({hint}keys: {', '.join(allowed)})", str(k))


def _typed(study, mapping, key, kind, default, where):
    """mapping[key] checked against kind (int, float, bool, str, list, dict), or the default."""
    v = mapping.get(key, default)
    if v is None and default is None:
        return None
    if kind is float and isinstance(v, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    ok = {int: lambda x: isinstance(x, int) and not isinstance(x, bool),
          float: lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
          bool: lambda x: isinstance(x, bool), str: lambda x: isinstance(x, str),
          list: lambda x: isinstance(x, list), dict: lambda x: isinstance(x, dict)}[kind](v)
    if not ok:
        raise _err(study, f"{where}{key}: expected {kind.__name__}, found {v!r}", key)
    return float(v) if kind is float else v


def override_value(v):
    """A YAML scalar as the trainer's command line writes it (true/false, empty for null)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    return str(v)


def _overrides(study, mapping, where):
    raw = _typed(study, mapping, "overrides", dict, {}, where)
    out = []
    for k, v in raw.items():
        if not re.fullmatch(r"[a-z_]+\.[a-z_0-9]+", str(k)):
            raise _err(study, f"{where}overrides: '{k}' is not a trainer key (section.key, docs/config.md)", str(k))
        if isinstance(v, (dict, list)):
            raise _err(study, f"{where}overrides: {k} must be a single value, found {v!r}", str(k))
        out.append(f"{k}={override_value(v)}")
    return out


def _config_path(study, root, path, where):
    full = path if os.path.isabs(path) else os.path.join(root, path)
    if not os.path.isfile(full):
        raise _err(study, f"{where}config '{path}' not found (paths are relative to the repository root, {root})",
                   "config")
    return path


def _variant(study, raw, i, root, base_config):
    where = f"variant {i + 1}: "
    if not isinstance(raw, dict):
        raise _err(study, f"{where}expected a mapping (name, ranks, overrides), found {raw!r}")
    _check_keys(study, raw, VARIANT_KEYS, f"variant {i + 1}")
    name = _typed(study, raw, "name", str, None, where)
    if not name or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        raise _err(study, f"{where}needs a name of letters, digits and _.+- (found {name!r})")
    where = f"variant '{name}': "
    ranks = _typed(study, raw, "ranks", int, 1, where)
    gpus = _typed(study, raw, "gpus", int, 0, where)
    if ranks < 1 or gpus < 0:
        raise _err(study, f"{where}ranks must be >= 1 and gpus >= 0", "ranks")
    config = _typed(study, raw, "config", str, None, where)
    config = _config_path(study, root, config, where) if config else base_config
    label = _typed(study, raw, "label", str, "", where)
    return Variant(name, ranks, config, _overrides(study, raw, where), gpus, label)


def _launcher(study, raw):
    raw = raw or {}
    if not isinstance(raw, dict):
        raise _err(study, f"launcher: expected a mapping, found {raw!r}", "launcher")
    _check_keys(study, raw, LAUNCHER_KEYS, "launcher")
    d = Launcher()
    if isinstance(raw.get("time"), int):  # YAML 1.1 reads an unquoted 01:00:00 as 3600 seconds
        t = raw["time"]
        raw = {**raw, "time": f"{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}"}
    for f in dataclasses.fields(Launcher):
        setattr(d, f.name, _typed(study, raw, f.name, f.type, getattr(d, f.name), "launcher."))
    if d.kind not in ("local", "slurm"):
        raise _err(study, f"launcher.kind: '{d.kind}' is not one of: local, slurm", "kind")
    d.mpirun_args = [str(a) for a in d.mpirun_args]
    d.sbatch_args = [str(a) for a in d.sbatch_args]
    d.srun_args = [str(a) for a in d.srun_args]
    d.env = {str(k): override_value(v) for k, v in d.env.items()}
    return d


def _load_yaml(text, path):
    try:
        import yaml
    except ImportError:
        raise StudyError("PyYAML is missing: install it (Debian: apt-get install python3-yaml)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise StudyError(f"{where}: malformed YAML: {getattr(e, 'problem', None) or e}")
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a mapping of study keys (docs/studies.md), found {type(data).__name__}")
    return data


def _check_rules(study, s):
    if s.kind not in ("scaling", "compare"):
        raise _err(study, f"kind: '{s.kind}' is not one of: scaling, compare", "kind")
    if s.kind == "scaling" and s.scaling not in ("weak", "strong"):
        raise _err(study, f"scaling: '{s.scaling}' is not one of: weak, strong (kind: scaling needs it)", "scaling")
    if s.kind == "compare" and s.scaling:
        raise _err(study, "scaling: only for kind: scaling", "scaling")
    if s.expect not in ("", "faster", "not_slower"):
        raise _err(study, f"expect: '{s.expect}' is not one of: faster, not_slower", "expect")
    if s.expect and s.kind != "compare":
        raise _err(study, "expect: only for kind: compare (a candidate against its baseline)", "expect")
    if s.steps < 1 or not 0 <= s.warmup < s.steps or s.repeats < 1:
        raise _err(study, f"steps {s.steps}, warmup {s.warmup}, repeats {s.repeats}: need steps >= 1, "
                          f"0 <= warmup < steps, repeats >= 1", "warmup")
    names = [v.name for v in s.variants]
    if not names:
        raise _err(study, "variants: the study names no variant", "variants")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _err(study, f"variants: the name '{dup[0]}' is used twice", "name")
    if s.baseline not in names:
        raise _err(study, f"baseline: '{s.baseline}' is not a variant (variants: {', '.join(names)})", "baseline")
    if s.kind == "compare" and len(names) < 2:
        raise _err(study, "kind: compare needs a baseline and at least one candidate", "variants")
    if s.loss_rtol is not None and s.loss_rtol < 0:
        raise _err(study, "loss_rtol: must be >= 0", "loss_rtol")


def parse(text, path, root):
    """The study in `text` (from `path`), configs resolved against the repository `root`."""
    data = _load_yaml(text, path)
    data["_text"], data["_path"] = text, path
    study = data
    _check_keys(study, {k: 1 for k in data if not k.startswith("_")}, TOP_KEYS, "the study")

    def get(key, kind, default):
        return _typed(study, data, key, kind, default, "")

    config = get("config", str, None)
    if not config:
        raise _err(study, "config: the study names no base config (e.g. config: configs/tiny.yaml)")
    config = _config_path(study, root, config, "")
    variants = [_variant(study, v, i, root, config) for i, v in enumerate(get("variants", list, []))]
    kind = get("kind", str, "compare")
    s = Study(path=path, text=text, name=get("name", str, os.path.splitext(os.path.basename(path))[0]),
              title=get("title", str, ""), kind=kind, scaling=get("scaling", str, ""), config=config,
              steps=get("steps", int, 20), warmup=get("warmup", int, 5), repeats=get("repeats", int, 1),
              overrides=_overrides(study, data, ""), variants=variants,
              baseline=get("baseline", str, variants[0].name if variants else ""),
              loss_rtol=get("loss_rtol", float, DEFAULT_LOSS_RTOL if kind == "compare" else None),
              loss_falls=get("loss_falls", bool, False), expect=get("expect", str, ""),
              expect_tolerance=get("expect_tolerance", float, DEFAULT_EXPECT_TOLERANCE),
              launcher=_launcher(study, data.get("launcher")))
    _check_rules(study, s)
    return s


def load(path, root):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise StudyError(f"{path}: cannot open the study file: {e.strerror}")
    return parse(text, path, root)


def apply_cli(s, mods):
    """Command-line changes (a JSON-able dict, kept in plan.json so --collect sees them too)."""
    for key in ("steps", "warmup", "repeats", "loss_rtol"):
        if mods.get(key) is not None:
            setattr(s, key, mods[key])
    s.cli_set = list(mods.get("set") or [])
    for key in ("trainer", "mpirun", "timeout_s"):
        if mods.get(key):
            setattr(s.launcher, key, mods[key])
    if mods.get("launcher"):
        s.launcher.kind = mods["launcher"]
    s.launcher.mpirun_args = s.launcher.mpirun_args + list(mods.get("mpirun_args") or [])
    s.launcher.env = {**s.launcher.env, **dict(kv.split("=", 1) for kv in mods.get("env") or [])}
    if s.steps < 1 or not 0 <= s.warmup < s.steps or s.repeats < 1:
        raise StudyError(f"steps {s.steps}, warmup {s.warmup}, repeats {s.repeats}: need steps >= 1, "
                         f"0 <= warmup < steps, repeats >= 1")
    for kv in mods.get("set") or []:
        if not re.fullmatch(r"[a-z_]+\.[a-z_0-9]+=.*", kv, re.S):
            raise StudyError(f"--set '{kv}': expected section.key=value (docs/config.md)")
    for kv in mods.get("env") or []:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", kv, re.S):
            raise StudyError(f"--env '{kv}': expected NAME=value")
    return s
