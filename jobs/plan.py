"""The sweep as a library: a request, its plan, then render, write or submit.

:class:`SweepRequest` holds the sweep's options as ``lartpc sweep`` takes them;
:func:`plan` fills what the request leaves unset from its site (``jobs/sites``), checks
every value that goes into a script and renders each point's script, writing nothing.
The plan is then printed (:func:`render`, the dry run), written into the sweep's folder
(:func:`write`: scripts, copies of the configs and prelude, ``manifest.json``) or
written and submitted (:func:`submit`)::

    from lartpc.jobs.plan import SweepRequest, plan, write

    sweep = plan(SweepRequest(site="perlmutter", account="m1234_g", models="jishnet",
                              gpus="4,8", data="$SCRATCH/events", check_data=False))
    write(sweep)
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from lartpc.jobs import resolve, sweep
from lartpc.jobs import submit as jobsubmit
from lartpc.jobs.sweep import JobShape, Point

from lartpc.cliparse import int_list
from lartpc.errors import LartpcError
from lartpc.fsutil import refuse_symlink, subfolder

__all__ = ["SweepRequest", "SweepPlan", "SweepResult", "plan", "render", "write", "submit"]


@dataclass(kw_only=True, slots=True)
class SweepRequest:
    """A sweep's options, named as ``lartpc sweep``'s (see its ``--help``); None: the
    site's value, else the built-in default (:data:`lartpc.jobs.resolve.DEFAULTS`)."""

    data: str | Path  #: event folder; a ``$VAR`` in it is expanded by the job on the node
    out_dir: Path = Path("runs")  #: parent of the run folders, scripts, logs, manifest
    site: str | None = None  #: a name under jobs/sites or a TOML path
    models: str | None = None  #: comma-separated model names
    configs: list[str] = field(default_factory=list)  #: presets or TOML files, one a model
    config_prefix: str | None = None  #: presets <prefix>-<model> without ``configs``
    gpus: str = "1,2,4"  #: comma-separated GPU (rank) counts
    seeds: str = "0"  #: comma-separated seeds (train.seed)
    scheduler: str | None = None
    launcher: str | None = None
    time: str | None = None  #: wall time per job, [D-]HH:MM:SS
    gpus_per_node: int | None = None
    cores_per_rank: int | None = None
    cores_per_node: int | None = None
    cpu: bool = False  #: request no GPUs
    account: str | None = None
    queue: str | None = None
    constraint: str | None = None
    qos: str | None = None
    reservation: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    bsub_args: list[str] = field(default_factory=list)
    prelude: str | Path | None = None  #: shell file sourced on the node before the launch
    srun_mpi: str | None = None  #: srun --mpi plugin (a site's ``srun_mpi``)
    measure_network: bool = False
    max_requeues: int = 20
    sets: list[str] = field(default_factory=list)  #: train overrides for every point
    check_data: bool = True  #: check ``data`` here against every point
    #: with check_data: a misfit goes into :attr:`SweepPlan.data_problem` instead of
    #: being raised (``--dry-run``, which writes nothing, says it and goes on)
    data_advice: bool = False
    submit: bool = False  #: to be submitted: the scheduler's submit command must exist


@dataclass(kw_only=True, slots=True)
class SweepPlan:
    """Every point of a sweep with its rendered script, nothing written yet."""

    request: SweepRequest  #: the request with the site's values and defaults filled in
    shape: JobShape
    data: str  #: the data path as the jobs see it
    out_dir: Path  #: absolute
    configs: dict[str, str]  #: model -> config (the sweep's own copy of a TOML file)
    points: list[Point]
    scripts: dict[str, str]  #: point name -> script text
    copies: dict[Path, str]  #: files copied into the sweep's jobs/ folder -> their text
    network: str | None = None  #: the network measurement's script (measure_network)
    network_env: dict[str, str] | None = None
    #: why the data does not fit (or was not found here) when the request asked for
    #: ``data_advice``; None when it fits or was not checked
    data_problem: str | None = None

    @property
    def jobs_dir(self) -> Path:
        return self.out_dir / "jobs"

    @property
    def logs_dir(self) -> Path:
        return self.out_dir / "logs"

    @property
    def manifest(self) -> Path:
        return self.out_dir / "manifest.json"

    @property
    def network_script(self) -> Path:
        return self.jobs_dir / "allreduce.sbatch"

    @property
    def submit_command(self) -> str:
        """What submits one script by hand (``bsub`` reads it on stdin)."""
        scheduler = self.shape.scheduler
        return sweep.SUBMIT[scheduler] + (" <" if scheduler == "lsf" else "")


@dataclass(kw_only=True, slots=True)
class SweepResult:
    """What :func:`write` or :func:`submit` did; submitted points carry their ``job_id``."""

    manifest: Path
    network_job: str | None = None  #: the network measurement's job (submitted or queued)
    skipped: list[tuple[Point, str]] = field(default_factory=list)  #: not submitted, why


def plan(request: SweepRequest) -> SweepPlan:
    """Check ``request`` and render every point's script; nothing is written.

    Raises
    ------
    LartpcError
        Naming the option for any value that cannot go into a script, a ``--set`` a
        point's config rejects, or data that does not fit a point (``check_data``).
    """
    req = dataclasses.replace(request)
    site = resolve.apply_site(req)
    sweep.parse_time_s(req.time, "--time" if request.time is not None or not req.site
                       else f"site {req.site}: time")
    if req.submit:  # fail before checking or writing anything if it cannot be submitted
        exe = sweep.SUBMIT[req.scheduler]
        if shutil.which(exe) is None:
            raise LartpcError(f"--submit --scheduler {req.scheduler}: `{exe}` not found on PATH")
    configs = resolve.configs(req)
    gpus = int_list(req.gpus, "--gpus", minimum=1, distinct=True)
    seeds = int_list(req.seeds, "--seeds", distinct=True)
    resolve.check_size(req, site, gpus)
    extra = _check_options(req)
    sweep.check_sets(req.sets, configs, seeds, req.launcher)
    cores = resolve.cores_per_rank(req)
    data, out_dir = _check_paths(req)
    _check_manifest(out_dir / "manifest.json")
    problem = None
    if req.check_data:
        try:
            _check_data(req, data, configs, gpus, seeds)
        except LartpcError as e:
            if not req.data_advice:
                raise
            problem = str(e)
    jobs_dir = out_dir / "jobs"
    configs, copies = _copies(req, configs, jobs_dir)
    shape = JobShape(scheduler=req.scheduler, launcher=req.launcher, time=req.time,
                     gpus_per_node=req.gpus_per_node, cores_per_rank=cores, cpu=req.cpu,
                     account=req.account, queue=req.queue, constraint=req.constraint,
                     qos=req.qos, reservation=req.reservation, extra_args=extra,
                     srun_mpi=req.srun_mpi,
                     prelude=str(jobs_dir / "prelude.sh") if req.prelude else None,
                     max_requeues=req.max_requeues)
    return _render_scripts(SweepPlan(request=req, shape=shape, data=data, out_dir=out_dir,
                                     configs=configs, points=[], scripts={}, copies=copies,
                                     data_problem=problem), gpus, seeds)


def _check_manifest(path: Path) -> None:
    """Refuse an existing ``manifest.json`` that is not a sweep's own (an object with a
    list of points, each an object with a name, as :mod:`lartpc.jobs.submit` writes it):
    the sweep would replace it. Nothing is written.

    Raises
    ------
    LartpcError
        Naming the file.
    """
    doc = jobsubmit.read_manifest(path)  # not JSON, or a link: refused there
    if not path.exists():
        return
    points = doc.get("points")
    if not isinstance(points, list) or not all(
            isinstance(q, dict) and isinstance(q.get("name"), str) for q in points):
        raise LartpcError(f"{path}: not a sweep's manifest (no list of named points); "
                          "refusing to replace it: move it away or choose another --out-dir")


def _check_options(req: SweepRequest) -> list[str]:
    """Refuse scheduler values a directive line cannot carry; the checked extra args."""
    for option in ("queue", "account", "qos", "reservation"):
        sweep.check_name(getattr(req, option), f"--{option}")
    sweep.check_name(req.srun_mpi, f"site {req.site}: srun_mpi")
    sweep.check_constraint(req.constraint)
    if req.scheduler == "lsf" and (req.constraint or req.qos):
        raise LartpcError("--constraint and --qos are SLURM options; with LSF use --bsub-arg")
    extra = [sweep.scheduler_arg(a, "--sbatch-arg", "slurm") for a in req.sbatch_args]
    extra_lsf = [sweep.scheduler_arg(a, "--bsub-arg", "lsf") for a in req.bsub_args]
    if (extra and req.scheduler != "slurm") or (extra_lsf and req.scheduler != "lsf"):
        raise LartpcError(f"--sbatch-arg is for SLURM and --bsub-arg for LSF; the sweep's "
                          f"scheduler is {req.scheduler}")
    if req.max_requeues < 0:
        raise LartpcError(f"--max-requeues {req.max_requeues}: must be 0 or more")
    return extra or extra_lsf


def _check_paths(req: SweepRequest) -> tuple[str, Path]:
    """The data path as the job sees it and the absolute out folder, both checked."""
    data = sweep.job_path(str(req.data), "--data")  # "$SCRATCH/events" stays for the job
    sweep.check_path(Path(data), "--data", directive=False)
    sweep.check_path(Path(req.out_dir), "--out-dir", directive=True)
    out_dir = Path(req.out_dir).resolve()
    sweep.check_path(out_dir, "--out-dir", directive=True)
    return data, out_dir


def _check_data(req: SweepRequest, data: str, configs: dict[str, str], gpus: list[int],
                seeds: list[int]) -> None:
    """The data, found here, fits every point."""
    here = sweep.local_path(data)
    if here is None or not here.is_dir():
        raise LartpcError(f"--data {req.data}: no such folder here; --no-data-check "
                          "writes the scripts for data that exists only on the cluster")
    resolve.check_data(here, configs, gpus, seeds, req.sets)


def _check_prelude(path: Path) -> str:
    """The prelude's text, after a ``bash -n`` syntax check."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise LartpcError(f"--prelude {path}: cannot be read ({e})") from e
    try:
        sweep.check_syntax(text, f"prelude {path}")
    except LartpcError as e:
        raise LartpcError(f"--prelude {path}: {e}") from e
    return text


def _copies(req: SweepRequest, configs: dict[str, str], jobs_dir: Path
            ) -> tuple[dict[str, str], dict[Path, str]]:
    """Configs pointing at the sweep's own copies of TOML files, and the files to write."""
    files: dict[Path, str] = {}
    out = dict(configs)
    for model, ref in configs.items():
        if ref.endswith(".toml"):
            dest = jobs_dir / f"config-{model}.toml"
            files[dest] = Path(ref).read_text()
            out[model] = str(dest)
    if req.prelude is not None:
        files[jobs_dir / "prelude.sh"] = _check_prelude(Path(req.prelude))
    return out, files


def _render_scripts(p: SweepPlan, gpus: list[int], seeds: list[int]) -> SweepPlan:
    """``p`` with its points, their scripts and the network job, each ``bash -n`` checked."""
    req = p.request
    p.points = sweep.make_points(p.configs, gpus, seeds, p.out_dir, p.jobs_dir, req.scheduler)
    p.scripts = sweep.build_scripts(p.points, p.shape, p.data, req.sets, p.logs_dir)
    if req.measure_network:
        p.network, p.network_env = sweep.network_script(p.points, p.shape, p.out_dir,
                                                        p.logs_dir)
        sweep.check_syntax(p.network, "allreduce")
    for point in p.points:
        sweep.check_syntax(p.scripts[point.name], point.name)
    return p


def render(p: SweepPlan, out: TextIO) -> None:
    """The dry run: every file the plan would write and the launcher line each job would
    run (its template run with ``LARTPC_DRY_RUN=1``), printed to ``out``."""
    template = sweep.template_path(p.shape)
    for path in p.copies:
        print(f"### would copy: {path}", file=out)
    if p.network is not None:
        print(f"### network: {p.network_script} -> {p.out_dir / 'network.json'}", file=out)
        print(p.network, end="", file=out)
        template_net = sweep.jobs_dir() / sweep.NETWORK_TEMPLATE
        print(f"### launch: {sweep.launch_line(template_net, p.network_env)}\n", file=out)
    for point in p.points:
        env = sweep.exports(point, p.shape, p.data, p.request.sets)
        print(f"### {point.name}: {point.script} -> run {point.run}", file=out)
        print(p.scripts[point.name], end="", file=out)
        print(f"### submit: {p.submit_command} {point.script}", file=out)
        print(f"### launch: {sweep.launch_line(template, env)}\n", file=out)


def write(p: SweepPlan) -> SweepResult:
    """Write the plan's scripts, copies and manifest into its folder; submit nothing."""
    return _write(p, submitting=False)


def submit(p: SweepPlan) -> SweepResult:
    """Write as :func:`write` does, then submit the network measurement and every point
    not completed, out of study budget, queued or running (each asked of squeue/bjobs
    before anything is written: if that fails, nothing is written or submitted); job ids
    go into the manifest and onto the points."""
    return _write(p, submitting=True)


def _write(p: SweepPlan, *, submitting: bool) -> SweepResult:
    meta = _manifest_settings(p)
    reasons = None
    if submitting:  # every point's job asked about first: a failed squeue submits nothing
        reasons = jobsubmit.skip_reasons(p.points, p.shape.scheduler,
                                         jobsubmit.read_manifest(p.manifest), _budgets(p))
    _make_folders(p)
    for path, text in p.copies.items():
        jobsubmit.write_script(path, text)
    result = SweepResult(manifest=p.manifest)
    if p.network is not None:
        result.network_job = _write_network(p, meta, submitting)
    old = jobsubmit.write(p.points, p.scripts, p.manifest, meta)
    if submitting:
        result.skipped = jobsubmit.submit(p.points, p.shape.scheduler, p.manifest, meta, old,
                                          result.network_job, reasons)
    return result


def _budgets(p: SweepPlan) -> dict[str, float]:
    """Model -> ``train.budget_s`` its points train to (its config with the sweep's --set)."""
    from lartpc.config import load_config

    return {m: load_config(ref, p.request.sets).train.budget_s for m, ref in p.configs.items()}


def _manifest_settings(p: SweepPlan) -> dict:
    """This sweep's settings as the manifest records them."""
    req = p.request
    meta = {"created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "scheduler": req.scheduler, "launcher": req.launcher, "data": p.data,
            "configs": p.configs, "site": req.site, "time": req.time, "sets": req.sets,
            "cores_per_rank": p.shape.cores_per_rank, "scheduler_args": p.shape.extra_args}
    if req.prelude:
        text = p.copies[p.jobs_dir / "prelude.sh"]
        meta["prelude"] = {"from": str(Path(req.prelude).resolve()),
                           "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return meta


def _make_folders(p: SweepPlan) -> None:
    """The sweep's folder with its jobs/ and logs/ (the scheduler will not create logs/)."""
    p.out_dir.mkdir(parents=True, exist_ok=True)
    whats = {sub: f"the sweep's {sub.name} folder" for sub in (p.jobs_dir, p.logs_dir)}
    for sub, what in whats.items():  # both checked before either is made
        refuse_symlink(sub, what)
    for sub, what in whats.items():
        subfolder(p.out_dir, sub.name, what)


def _write_network(p: SweepPlan, meta: dict, submitting: bool) -> str | None:
    """Write the network measurement's script (and submit it); the job id to wait for."""
    jobsubmit.write_script(p.network_script, p.network, 0o755)
    profile = p.out_dir / "network.json"
    meta["network"] = {"script": str(p.network_script), "profile": str(profile),
                       "job_id": None}
    if not submitting:
        return None
    old_doc = jobsubmit.read_manifest(p.manifest)
    job = jobsubmit.submit_network(str(p.network_script), profile, old_doc)
    meta["network"]["job_id"] = job
    return job
