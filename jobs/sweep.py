"""Job scripts for a sweep: models x GPU counts x seeds, one script per point.

The scripts are the ones in ``jobs/slurm`` and ``jobs/lsf``, rendered: the template's
own ``#SBATCH``/``#BSUB`` lines are replaced by the point's, and the point's settings
are written as ``export LARTPC_...`` lines in front of the template's body, which reads
them (see ``jobs/slurm/common.sh``). The script logic exists once, in the templates.
Run folders are ``<out_dir>/<model>-n<gpus>-s<seed>``, so ``python -m lartpc.analysis report
<out_dir>`` finds every run of the sweep.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lartpc.config import choices
from lartpc.errors import LartpcError

log = logging.getLogger(__name__)

MODELS = choices("model.name")
CONFIG_PREFIXES = ("tiny", "paper")  #: presets <prefix>-<model> in lartpc/configs
#: (scheduler, launcher) -> template under jobs/
TEMPLATES: dict[tuple[str, str], str] = {
    ("slurm", "horovod"): "slurm/horovod-srun.sbatch",
    ("slurm", "horovod-gloo"): "slurm/horovod-gloo.sbatch",
    ("slurm", "torchrun"): "slurm/torchrun.sbatch",
    ("lsf", "jsrun"): "lsf/jsrun.lsf",
    ("lsf", "horovod"): "lsf/horovodrun.lsf",
}
#: The template whose launch reads LARTPC_SRUN_MPI (a site's srun_mpi): Horovod over MPI.
SRUN_MPI_TEMPLATE = "slurm/horovod-srun.sbatch"
SUBMIT = {"slurm": "sbatch", "lsf": "bsub"}
#: GPUs per node when not given: a typical SLURM GPU node, and an IBM AC922 LSF node's 6
#: (as the paper's Summit had; a site file or --gpus-per-node sets your cluster's).
DEFAULT_GPUS_PER_NODE = {"slurm": 4, "lsf": 6}
#: SLURM's warning before the wall time (``--signal=B:USR1@<this>``), in seconds: as the
#: templates' own line and common.sh's LARTPC_WARNING_LEAD_S (tests/test_jobs.py checks);
#: common.sh's 300 s LARTPC_TIME_MARGIN_S must exceed it plus a checkpoint's time.
WARNING_LEAD_S = 120
_DIRECTIVE = re.compile(r"^#(SBATCH|BSUB)\b")
#: A scheduler name (partition, queue, account): what SLURM and LSF accept, nothing a
#: shell or a directive line could read as more than one word.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+-]{0,127}")
#: A path that goes into a directive line (--output, -o), where no quoting exists.
_DIRECTIVE_PATH = re.compile(r"[\w./+,=@:~-]+")
#: An environment variable in a path the job expands on the node ($SCRATCH, ${HOME}).
_VAR = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\})")
#: The exports whose ``$VAR`` the job expands (the others are exported literally).
EXPANDED = ("LARTPC_DATA",)
#: A --constraint: node features joined by SLURM's operators (&, |, brackets, counts).
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.,+&|!*\[\]():-]{1,256}")
#: One word of a --sbatch-arg/--bsub-arg: nothing a shell or a directive reads as more.
_ARG_WORD = re.compile(r"[A-Za-z0-9_.,:+=@%/&|!*\[\]()-]+")
#: Scheduler options the sweep writes itself -> the sweep option that sets them.
OWNED_ARGS: dict[str, dict[str, str]] = {
    "slurm": {
        **dict.fromkeys(("--job-name", "-J"), "the point's name"),
        **dict.fromkeys(("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node",
                         "--gpus-per-node", "--gpus-per-task", "--gpus", "-G"),
                        "--gpus and --gpus-per-node"),
        **dict.fromkeys(("--cpus-per-task", "-c"), "--cores-per-rank"),
        **dict.fromkeys(("--time", "-t"), "--time"),
        **dict.fromkeys(("--output", "-o", "--open-mode", "--requeue", "--no-requeue",
                         "--signal"), "nothing: the job scripts need them as they are"),
        **dict.fromkeys(("--account", "-A"), "--account"),
        **dict.fromkeys(("--partition", "-p"), "--queue"),
        **dict.fromkeys(("--constraint", "-C"), "--constraint"),
        **dict.fromkeys(("--qos", "-q"), "--qos"),
        "--reservation": "--reservation",
    },
    "lsf": {"-J": "the point's name",
            **dict.fromkeys(("-nnodes", "-n", "-gpu"), "--gpus and --gpus-per-node"),
            "-W": "--time", "-o": "--out-dir", "-P": "--account", "-q": "--queue",
            "-U": "--reservation"},
}


@dataclass(kw_only=True, slots=True)
class JobShape:
    """How every point's job is laid out and limited."""

    scheduler: str
    launcher: str
    time: str = "04:00:00"  #: wall time, SLURM syntax ([D-]HH:MM:SS)
    gpus_per_node: int | None = None  #: None: DEFAULT_GPUS_PER_NODE[scheduler]
    cores_per_rank: int = 1
    cpu: bool = False  #: no GPUs requested (tests, CPU clusters)
    account: str | None = None
    queue: str | None = None  #: SLURM partition or LSF queue
    constraint: str | None = None  #: SLURM node features (-C)
    qos: str | None = None  #: SLURM quality of service
    reservation: str | None = None  #: SLURM --reservation / LSF -U
    extra_args: list[str] = field(default_factory=list)  #: checked --sbatch/--bsub-arg
    prelude: str | None = None  #: shell file sourced on the node before the launch
    srun_mpi: str | None = None  #: srun --mpi for Horovod over MPI (None: env.sh's pmix)
    #: most requeues (SLURM) or resubmissions (LSF) of one point's job; the study
    #: budget (train.budget_s) ends a chain before, when it is spent
    max_requeues: int = 20


@dataclass(kw_only=True, slots=True)
class Point:
    """One job of the sweep. ``job_id`` is filled in by :func:`submit`."""

    model: str
    gpus: int
    seed: int
    config: str
    name: str
    run: str
    script: str
    job_id: str | None = None


def jobs_dir() -> Path:
    """The ``jobs/`` folder holding the templates (``LARTPC_JOBS_DIR`` overrides)."""
    d = Path(os.environ.get("LARTPC_JOBS_DIR") or Path(__file__).resolve().parent)
    if not (d / "slurm" / "common.sh").is_file():
        raise LartpcError(f"job templates not found in {d} (jobs/slurm/common.sh); "
                          "use a source checkout or set LARTPC_JOBS_DIR")
    return d


TIME_FORMS = ("minutes, minutes:seconds, hours:minutes:seconds, days-hours, "
              "days-hours:minutes or days-hours:minutes:seconds")


def parse_time_s(text: str, option: str = "--time") -> int:
    """Seconds in a SLURM time (``M``, ``M:S``, ``H:M:S``, ``D-H[:M[:S]]``; as in
    common.sh), above zero, minutes and seconds below 60 where they are not the leading
    field (SLURM's own rule; ``99:99`` was written into job scripts before).

    Raises
    ------
    LartpcError
        Naming ``option`` and the value.
    """
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text) \
        if isinstance(text, str) else None
    if not m:
        raise LartpcError(f"{option} {text!r}: expected {TIME_FORMS}, e.g. 04:00:00 or "
                          "1-12:00:00")
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, s = a, b or 0, c or 0
    elif c is not None:
        h, mi, s = a, b, c
    elif b is not None:
        h, mi, s = 0, a, b
    else:
        h, mi, s = 0, a, 0
    # every form's fields after its first are minutes or seconds
    if any(v is not None and v >= 60 for v in (b, c)):
        raise LartpcError(f"{option} {text!r}: minutes and seconds after the first field "
                          f"must be below 60 ({TIME_FORMS})")
    total = (((d or 0) * 24 + h) * 60 + mi) * 60 + s
    if total <= 0:
        raise LartpcError(f"{option} {text!r}: must be positive")
    return total


def check_name(value: str | None, option: str) -> None:
    """Refuse a queue/account name that is not one plain word (it goes into a directive).

    Raises
    ------
    LartpcError
        Naming ``option`` when ``value`` holds spaces, newlines, quotes or other
        characters outside ``[A-Za-z0-9_.,+-]``.
    """
    if value is not None and not _NAME.fullmatch(value):
        raise LartpcError(f"{option} {value!r}: expected a scheduler name of letters, digits "
                          "and _.,+- (no spaces, quotes or newlines)")


def check_constraint(value: str | None) -> None:
    """Refuse a ``--constraint`` that is not one SLURM feature expression."""
    if value is not None and not _CONSTRAINT.fullmatch(value):
        raise LartpcError(f"--constraint {value!r}: expected node features and the operators "
                          "&|!*[]() (no spaces, quotes or newlines)")


def scheduler_arg(text: str, option: str, scheduler: str) -> str:
    """One ``--sbatch-arg``/``--bsub-arg``, checked, as it goes after ``#SBATCH``/``#BSUB``.

    It is an option and at most one value (``--mail-type=END``, ``--exclusive``,
    ``-alloc_flags "nvme smt4"``); quotes group a value with spaces, which is written
    back double-quoted. Anything a shell or a directive line could read as more than
    that (line breaks, ``;``, backticks, ``$``, other quotes) and the options the sweep
    writes itself are refused.

    Raises
    ------
    LartpcError
        Naming ``option`` and the text, with the reason, in one line.
    """
    def refuse(why: str) -> LartpcError:
        return LartpcError(f"{option} {text!r}: {why}")

    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise refuse("holds a line break or another control character")
    if any(c in text for c in "\\`$;"):
        raise refuse("only letters, digits and _.,:+=@%/&|!*[]()- are allowed "
                     "(no ; ` $ quotes or backslashes)")
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise refuse(f"cannot be split into words ({e})") from None
    if not 1 <= len(words) <= 2 or not words[0].startswith("-"):
        raise refuse("expected one scheduler option and at most one value, e.g. "
                     + ("--mail-type=END" if scheduler == "slurm" else "-alloc_flags smt4"))
    for w in words:
        if not all(_ARG_WORD.fullmatch(part) for part in w.split(" ")):
            raise refuse("only letters, digits and _.,:+=@%/&|!*[]()- are allowed "
                         "(no ; ` $ quotes or backslashes)")
    if " " in words[0]:
        raise refuse("the option name holds a space")
    name = words[0].split("=", 1)[0]
    owned = OWNED_ARGS[scheduler].get(name)
    if owned:
        raise refuse(f"{name} is written by the sweep; use {owned}")
    line = " ".join(f'"{w}"' if " " in w else w for w in words)
    if line != " ".join(text.replace("'", '"').split()):
        raise refuse('quotes may only group a value that holds spaces, as "nvme smt4"')
    return line


def job_path(text: str, option: str) -> str:
    """A path as the job will see it: absolute, or kept literally when it holds an
    environment variable (``$SCRATCH/events``) for the job's shell to expand on the node.

    Raises
    ------
    LartpcError
        For a path with variables that starts with neither one nor ``/`` (it would be
        relative to wherever the job starts).
    """
    if not _VAR.search(text):
        return str(Path(text).resolve())
    if not (_VAR.match(text) or text.startswith("/")):
        raise LartpcError(f"{option} {text!r}: a path with environment variables must start "
                          "with one or with / (the job expands it on the node)")
    return text


def local_path(text: str) -> Path | None:
    """``text`` with its environment variables expanded here; None when one is unset."""
    expanded = os.path.expandvars(text)
    return None if _VAR.search(expanded) else Path(expanded)


def shell_value(value: str) -> str:
    """``value`` as a shell word in which only its ``$VAR``/``${VAR}`` expand, each to
    an error that stops the job where the node does not set it (``${SCRATCH:?...}``):
    an empty one would turn ``$SCRATCH/events`` into ``/events``."""
    parts, pos = [], 0
    for m in _VAR.finditer(value):
        if m.start() > pos:
            parts.append(shlex.quote(value[pos:m.start()]))
        parts.append(f'"${{{m.group(1) or m.group(2)}:?is not set on this node}}"')
        pos = m.end()
    if pos < len(value) or not parts:
        parts.append(shlex.quote(value[pos:]))
    return "".join(parts)


def check_path(path: Path, option: str, *, directive: bool) -> None:
    """Refuse a path a job script cannot carry safely.

    Every path is exported shell-quoted, which holds anything but control characters;
    a path that also goes into a ``#SBATCH``/``#BSUB`` line (``directive``), where
    there is no quoting, must be one plain word.
    """
    text = str(path)
    if directive and _VAR.search(text):
        raise LartpcError(f"{option} {text!r}: goes into #SBATCH/#BSUB lines, which expand no "
                          "environment variables; give the path itself (unquoted $SCRATCH "
                          "is expanded by your shell)")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise LartpcError(f"{option} {text!r}: control characters (newline, tab...) in a path")
    if directive and not _DIRECTIVE_PATH.fullmatch(text):
        raise LartpcError(f"{option} {text!r}: goes into #SBATCH/#BSUB lines, so it must be "
                          "letters, digits and ./_+,=@:~- only (no spaces, quotes or %)")


#: The backend each launcher starts (``dist.backend=auto`` finds it from the environment).
LAUNCHER_BACKEND = {"horovod": "horovod", "horovod-gloo": "horovod", "jsrun": "horovod",
                    "torchrun": "torch"}


def check_sets(sets: list[str], configs: dict[str, str], seeds: list[int],
               launcher: str | None = None) -> None:
    """Resolve every point's config with ``sets`` now, so a typo fails before any job queues.

    Raises
    ------
    LartpcError
        For a ``--set`` with whitespace (the job splits them on spaces), one that
        contradicts what the sweep itself decides (``train.seed`` from ``--seeds``,
        ``model.name`` from ``--models``, ``dist.backend`` from ``--launcher``), or one the
        config rejects (unknown key, wrong type, out of range), naming the preset.
    """
    from lartpc.config import load_config
    from lartpc.errors import ConfigError

    owned = {"train.seed": "--seeds", "model.name": "--models"}
    for kv in sets:
        if "=" not in kv or re.search(r"\s", kv) or "." not in kv.split("=", 1)[0]:
            raise LartpcError(f"--set {kv!r}: expected section.key=value without spaces")
        key, value = (t.strip() for t in kv.split("=", 1))
        if key in owned:
            raise LartpcError(f"--set {kv!r}: the sweep sets {key}; use {owned[key]}")
        wanted = LAUNCHER_BACKEND.get(launcher or "")
        if key == "dist.backend" and wanted and value not in ("auto", wanted):
            raise LartpcError(f"--set {kv!r} contradicts --launcher {launcher}, which starts "
                              f"{wanted} ranks; leave dist.backend=auto or use {wanted}")
    for model, ref in configs.items():
        for seed in seeds:
            try:
                load_config(ref, [f"train.seed={seed}", *sets])
            except ConfigError as e:
                raise LartpcError(f"config {ref} (model {model}) --seeds {seed}: {e}") from e


def parse_models(text: str) -> list[str]:
    """``"jishnet,scnet"`` -> ``["jishnet", "scnet"]``; unknown or repeated names are errors."""
    models = [t.strip().lower() for t in text.split(",") if t.strip()]
    unknown = [m for m in models if m not in MODELS]
    if not models or unknown:
        raise LartpcError(f"--models {text!r}: unknown model {', '.join(unknown) or '(none)'}; "
                          f"expected some of {', '.join(MODELS)}")
    if len(set(models)) != len(models):
        raise LartpcError(f"--models {text!r}: repeated model")
    return models


def make_points(configs: dict[str, str], gpus: list[int], seeds: list[int], out_dir: Path,
                scripts_dir: Path, scheduler: str) -> list[Point]:
    """Every (model, gpus, seed) point with its config, run folder and script path."""
    ext = "sbatch" if scheduler == "slurm" else "lsf"
    points = []
    for model, ref in configs.items():
        for n in gpus:
            for seed in seeds:
                name = f"{model}-n{n}-s{seed}"
                points.append(Point(model=model, gpus=n, seed=seed,
                                    config=ref, name=name,
                                    run=str(out_dir / name),
                                    script=str(scripts_dir / f"{name}.{ext}")))
    return points


def layout(n: int, shape: JobShape) -> tuple[int, int]:
    """(nodes, ranks per node) for ``n`` ranks, filling nodes of ``gpus_per_node``."""
    per = shape.gpus_per_node or DEFAULT_GPUS_PER_NODE[shape.scheduler]
    tpn = min(n, per)
    nodes = math.ceil(n / tpn)
    if shape.launcher == "torchrun" and n % tpn:
        raise LartpcError(f"--gpus {n} with {per} GPUs per node: torchrun needs the same number "
                          "of ranks on every node; choose a multiple of --gpus-per-node")
    return nodes, tpn


def directives(p: Point, shape: JobShape, logs_dir: Path) -> list[str]:
    """The scheduler lines for one point."""
    if shape.scheduler == "lsf":
        return _lsf_directives(p, shape, logs_dir)
    nodes, tpn = layout(p.gpus, shape)
    c = shape.cores_per_rank
    lines = [f"--job-name=lartpc-{p.name}", f"--nodes={nodes}"]
    if shape.launcher == "torchrun":  # one torchrun per node starts the node's ranks
        lines += ["--ntasks-per-node=1", f"--cpus-per-task={tpn * c}"]
        lines += [f"--gpus-per-node={tpn}"] * (not shape.cpu)
    else:
        # Every rank sees the node's GPUs (NCCL's peer-to-peer paths need them) and
        # lartpc pins its own by local rank.
        lines += [f"--ntasks={p.gpus}", f"--ntasks-per-node={tpn}", f"--cpus-per-task={c}"]
        lines += [f"--gpus-per-node={tpn}"] * (not shape.cpu)
    lines += [f"--time={shape.time}", f"--output={logs_dir / p.name}-%j.out",
              "--open-mode=append", "--requeue", f"--signal=B:USR1@{WARNING_LEAD_S}"]
    return [f"#SBATCH {x}" for x in [*lines, *_site_lines(shape)]]


def _lsf_directives(p: Point, shape: JobShape, logs_dir: Path) -> list[str]:
    """The ``#BSUB`` lines for one point."""
    nodes, tpn = layout(p.gpus, shape)
    mins = math.ceil(parse_time_s(shape.time) / 60)
    if shape.launcher == "jsrun":  # IBM CSM allocates whole nodes; jsrun places the ranks
        size = [f"-nnodes {nodes}"]
    else:
        # Without CSM, -nnodes does not exist (LSF gives one slot and no GPUs): ranks as
        # slots, tpn per host, each slot with the rank's cores (a slot alone is one core,
        # and the rank runs cores_per_rank threads), and that host's GPUs (LSF >= 10.1's
        # -gpu, per host).
        size = [f"-n {p.gpus}",
                f'-R "span[ptile={tpn}] affinity[core({shape.cores_per_rank})]"']
        size += [f'-gpu "num={tpn}"'] * (not shape.cpu)
    lines = [f"-J lartpc-{p.name}", *size, f"-W {mins // 60}:{mins % 60:02d}",
             f"-o {logs_dir / p.name}.%J.out"]
    lines += [f"-P {shape.account}"] * bool(shape.account)
    lines += [f"-q {shape.queue}"] * bool(shape.queue)
    lines += [f"-U {shape.reservation}"] * bool(shape.reservation)
    return [f"#BSUB {x}" for x in [*lines, *shape.extra_args]]


def _site_lines(shape: JobShape) -> list[str]:
    """SLURM options every job of the sweep carries (account, partition, ...)."""
    lines = [f"--account={shape.account}"] * bool(shape.account)
    lines += [f"--partition={shape.queue}"] * bool(shape.queue)
    lines += [f"--constraint={shape.constraint}"] * bool(shape.constraint)
    lines += [f"--qos={shape.qos}"] * bool(shape.qos)
    lines += [f"--reservation={shape.reservation}"] * bool(shape.reservation)
    return [*lines, *shape.extra_args]


#: The job that measures the network before the sweep (``--measure-network``).
NETWORK_TEMPLATE = "slurm/allreduce.sbatch"
NETWORK_TIME = "00:15:00"


def network_script(points: list[Point], shape: JobShape, out_dir: Path,
                   logs_dir: Path) -> tuple[str, dict[str, str]]:
    """The allreduce job for the sweep's largest allocation (one rank per node; on one
    node, that node's ranks) and its settings; its profile is ``out_dir/network.json``.
    A sweep of 1-GPU points only is refused: it has no allreduce to measure."""
    if shape.scheduler != "slurm":
        raise LartpcError("--measure-network needs --scheduler slurm")
    nodes, tpn = max(layout(p.gpus, shape) for p in points)
    if nodes == 1 and tpn == 1 and not shape.cpu:  # two ranks would share one GPU (NCCL
        # refuses: "Duplicate GPU detected"), and a 1-GPU sweep has no network to measure
        raise LartpcError("--measure-network: the sweep's largest point has 1 GPU and an "
                          "allreduce needs 2; add a larger point to --gpus or drop the option")
    per_node = 1 if nodes > 1 else max(2, tpn)
    lines = ["--job-name=lartpc-allreduce", f"--nodes={nodes}",
             f"--ntasks-per-node={per_node}", f"--cpus-per-task={shape.cores_per_rank}",
             f"--time={NETWORK_TIME}", f"--output={logs_dir}/allreduce-%j.out"]
    lines += [f"--gpus-per-node={tpn}"] * (not shape.cpu)
    env = {"LARTPC_JOBS_DIR": str(jobs_dir()),
           "LARTPC_NETWORK_OUT": str(out_dir / "network.json"),
           "LARTPC_NNODES": str(nodes), "LARTPC_TASKS_PER_NODE": str(per_node),
           "LARTPC_CORES_PER_TASK": str(shape.cores_per_rank)}
    if shape.prelude:
        env["LARTPC_PRELUDE"] = shape.prelude
    if sys.prefix != sys.base_prefix:
        env["LARTPC_VENV"] = sys.prefix
    text = render((jobs_dir() / NETWORK_TEMPLATE).read_text(),
                  [f"#SBATCH {x}" for x in [*lines, *_site_lines(shape)]], env)
    return text, env


def exports(p: Point, shape: JobShape, data: Path | str, sets: list[str]) -> dict[str, str]:
    """The ``LARTPC_*`` settings the template reads (see jobs/slurm/common.sh)."""
    nodes, tpn = layout(p.gpus, shape)
    env = {
        "LARTPC_JOBS_DIR": str(jobs_dir()),
        "LARTPC_CONFIG": p.config, "LARTPC_DATA": str(data), "LARTPC_RUN": p.run,
        "LARTPC_SET": " ".join([f"train.seed={p.seed}", *sets]),
        "LARTPC_TIME": shape.time, "LARTPC_NTASKS": str(p.gpus), "LARTPC_NNODES": str(nodes),
        "LARTPC_TASKS_PER_NODE": str(tpn), "LARTPC_CORES_PER_TASK": str(shape.cores_per_rank),
        "LARTPC_GPUS_PER_TASK": "0" if shape.cpu else "1", "LARTPC_SCRIPT": p.script,
        "LARTPC_MAX_REQUEUES": str(shape.max_requeues),
        # where an LSF job records its resubmission of itself (one chain per point)
        "LARTPC_MANIFEST": str(Path(p.run).parent / "manifest.json"), "LARTPC_POINT": p.name,
    }
    if shape.prelude:
        env["LARTPC_PRELUDE"] = shape.prelude
    if shape.srun_mpi and TEMPLATES.get((shape.scheduler, shape.launcher)) == SRUN_MPI_TEMPLATE:
        env["LARTPC_SRUN_MPI"] = shape.srun_mpi  # the one launch that runs srun --mpi
    if sys.prefix != sys.base_prefix:  # a virtual environment: activate it on the node
        env["LARTPC_VENV"] = sys.prefix
    return env


def render(template: str, lines: list[str], env: dict[str, str]) -> str:
    """The template with its scheduler lines replaced and ``env`` exported up front."""
    bad = [ln for ln in lines if "\n" in ln or "\r" in ln]
    if bad:  # a value that slipped past the checks would start a shell line of its own
        raise LartpcError(f"scheduler line {bad[0]!r}: holds a line break")
    head, *body = template.splitlines()
    body = [ln for ln in body if not _DIRECTIVE.match(ln)]
    block = ["# --- this sweep point (written by `lartpc sweep`) ---"]
    block += [f"export {k}={shell_value(v) if k in EXPANDED else shlex.quote(v)}"
              for k, v in env.items()]
    return "\n".join([head, *lines, *block, *body]) + "\n"


def template_path(shape: JobShape) -> Path:
    """The job script under jobs/ for the shape's scheduler and launcher."""
    key = (shape.scheduler, shape.launcher)
    if key not in TEMPLATES:
        ok = ", ".join(f"{s}/{lch}" for s, lch in TEMPLATES)
        raise LartpcError(f"--scheduler {shape.scheduler} --launcher {shape.launcher}: "
                          f"no such job script; available: {ok}")
    return jobs_dir() / TEMPLATES[key]


def build_scripts(points: list[Point], shape: JobShape, data: Path | str, sets: list[str],
                  logs_dir: Path) -> dict[str, str]:
    """Script text per point name."""
    template = template_path(shape).read_text()
    return {p.name: render(template, directives(p, shape, logs_dir),
                           exports(p, shape, data, sets)) for p in points}


def check_syntax(script: str, name: str) -> None:
    """Parse ``script`` with ``bash -n``: a syntax check that executes nothing."""
    bash = shutil.which("bash")
    if bash is None:
        raise LartpcError("bash not found on PATH: cannot check the job scripts")
    out = subprocess.run([bash, "-n"], input=script, text=True, capture_output=True)
    if out.returncode != 0:
        raise LartpcError(f"job script {name}: bash syntax error: {out.stderr.strip()}")


def launch_line(template: Path, env: dict[str, str]) -> str:
    """The launcher command a point's job would run.

    Runs the unmodified ``template`` with the point's settings as environment variables
    and ``LARTPC_DRY_RUN=1``, under which it prints the command and launches nothing.
    The rendered script is never run: its directive and export lines hold the values
    the user typed, and environment values are data to bash, never code.
    """
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "LSB_", "LARTPC_"))}
    out = subprocess.run(["bash", str(template)], text=True, capture_output=True,
                         env={**base, **env, "LARTPC_DRY_RUN": "1"}, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise LartpcError(f"{template} dry run failed: {out.stderr.strip()}")
    return out.stdout.strip()
