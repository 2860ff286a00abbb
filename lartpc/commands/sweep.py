"""``lartpc sweep``: job scripts for models x GPU counts x seeds, plus a manifest.

Writes ``<out-dir>/jobs/<model>-n<N>-s<seed>.<sbatch|lsf>``, ``<out-dir>/logs/`` for the
scheduler's output and ``<out-dir>/manifest.json``; each job trains into
``<out-dir>/<model>-n<N>-s<seed>``. ``--dry-run`` prints the scripts (checked with
``bash -n``, never run) and the launcher line each would run, writing nothing;
``--submit`` also submits them (sbatch/bsub), skipping points already completed, queued
or running (asked of squeue/bjobs for every point first: if that fails, nothing is
submitted), and records the job ids in the manifest. Every value that goes into a script
(queue, account, time, paths, ``--set``, ``--sbatch-arg``) is checked first, ``--set``
against each point's resolved config, and the data against every point.
``--site NAME`` takes a cluster's options from ``jobs/sites/NAME.toml``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import logging
from pathlib import Path

from lartpc.errors import LartpcError

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lartpc.jobs.sites import site_names
    from lartpc.jobs.sweep import CONFIG_PREFIXES, TEMPLATES

    p.add_argument("--site", default=None,
                   help=f"cluster options from jobs/sites/NAME.toml ({', '.join(site_names())}) "
                   "or a TOML path; options given here win")
    p.add_argument("--models", default=None,
                   help="comma-separated: jishnet,scnet (default: both, or --config's)")
    p.add_argument("--config", dest="configs", action="append", default=[],
                   metavar="PRESET_OR_TOML", help="config for the model it names (repeatable, "
                   "one per model); a TOML file is copied into the sweep's jobs/ folder")
    p.add_argument("--config-prefix", default=None, choices=CONFIG_PREFIXES,
                   help="without --config: presets <prefix>-<model> (tiny = events "
                   "downsampled by 4; default paper)")
    p.add_argument("--gpus", default="1,2,4", help="comma-separated GPU (rank) counts")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (train.seed)")
    p.add_argument("--scheduler", choices=sorted({s for s, _ in TEMPLATES}), default=None,
                   help="required unless the site sets it")
    p.add_argument("--launcher", choices=list(dict.fromkeys(lch for _, lch in TEMPLATES)),
                   default=None, help="slurm: horovod (srun --mpi), horovod-gloo "
                   "(horovodrun; srun across nodes), torchrun; lsf: jsrun, horovod "
                   "(horovodrun)")
    p.add_argument("--data", required=True, type=Path, help="event folder (lartpc simulate); "
                   "a quoted '$SCRATCH/events' is expanded by the job on the node")
    p.add_argument("--no-data-check", action="store_true",
                   help="skip checking --data against every point (data only on the cluster)")
    p.add_argument("--out-dir", default=Path("runs"), type=Path,
                   help="parent of the run folders, scripts, logs and manifest.json")
    p.add_argument("--time", default=None, help="wall time per job, [D-]HH:MM:SS "
                   "(default 04:00:00)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="ranks per node (default: 4 for slurm, 6 for lsf: IBM AC922 nodes, as the "
                   "paper's Summit)")
    p.add_argument("--cores-per-rank", type=int, default=None,
                   help="CPU cores per rank (default: the node's cores / its GPUs, from "
                   "--cores-per-node, the site or sinfo)")
    p.add_argument("--cores-per-node", type=int, default=None,
                   help="CPUs per node as the scheduler counts them (hardware threads)")
    p.add_argument("--cpu", action="store_true", help="request no GPUs (CPU-only runs)")
    p.add_argument("--account", default=None, help="account / project to charge")
    p.add_argument("--queue", default=None, help="SLURM partition or LSF queue")
    p.add_argument("--constraint", default=None, help="SLURM node features (-C), e.g. gpu")
    p.add_argument("--qos", default=None, help="SLURM quality of service, e.g. regular")
    p.add_argument("--reservation", default=None, help="SLURM --reservation / LSF -U")
    p.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[],
                   metavar="ARG", help="one more #SBATCH option, given with '=': "
                   "--sbatch-arg=--mail-type=END (repeatable; checked)")
    p.add_argument("--bsub-arg", dest="bsub_args", action="append", default=[],
                   metavar="ARG", help="one more #BSUB option, given with '=': "
                   "'--bsub-arg=-alloc_flags smt4' (repeatable; checked)")
    p.add_argument("--prelude", type=Path, default=None, metavar="FILE",
                   help="shell file sourced on the node before the launch (module load, "
                   "conda, container set-up); copied into the sweep's jobs/ folder")
    p.add_argument("--measure-network", action="store_true",
                   help="first run `lartpc bench allreduce` on the sweep's largest "
                   "allocation (SLURM): OUT-DIR/network.json for `lartpc analyze predict "
                   "--cluster-file`; the points start after it")
    p.add_argument("--max-requeues", type=int, default=20, metavar="N",
                   help="most requeues (SLURM) or resubmissions (LSF) of one point's job, "
                   "written into its script (default 20); a point that has spent its "
                   "budget (train.budget_s, training time) is requeued no more")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V",
                   help="extra train override for every point (repeatable; no spaces)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print, write nothing")
    mode.add_argument("--submit", action="store_true", help="write, then sbatch/bsub each "
                      "point not already completed, queued or running")


def _check_prelude(path: Path) -> str:
    """The prelude's text, after a ``bash -n`` syntax check."""
    from lartpc.jobs import sweep

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise LartpcError(f"--prelude {path}: cannot be read ({e})") from e
    try:
        sweep.check_syntax(text, f"prelude {path}")
    except LartpcError as e:
        raise LartpcError(f"--prelude {path}: {e}") from e
    return text


def _copies(args: argparse.Namespace, configs: dict[str, str], jobs_dir: Path
            ) -> tuple[dict[str, str], dict[Path, str]]:
    """Configs pointing at the sweep's own copies of TOML files, and the files to write."""
    files: dict[Path, str] = {}
    out = dict(configs)
    for model, ref in configs.items():
        if ref.endswith(".toml"):
            dest = jobs_dir / f"config-{model}.toml"
            files[dest] = Path(ref).read_text()
            out[model] = str(dest)
    if args.prelude is not None:
        files[jobs_dir / "prelude.sh"] = _check_prelude(Path(args.prelude))
    return out, files


def run(args: argparse.Namespace) -> int:
    from lartpc.cliparse import int_list
    from lartpc.fsutil import refuse_symlink, subfolder
    from lartpc.jobs import resolve, sweep
    from lartpc.jobs import submit as jobsubmit

    site = resolve.apply_site(args)
    if args.submit:  # fail before checking or writing anything if it cannot be submitted
        import shutil

        exe = sweep.SUBMIT[args.scheduler]
        if shutil.which(exe) is None:
            raise LartpcError(f"--submit --scheduler {args.scheduler}: `{exe}` not found on PATH")
    configs = resolve.configs(args)
    gpus = int_list(args.gpus, "--gpus", minimum=1, distinct=True)
    seeds = int_list(args.seeds, "--seeds", distinct=True)
    resolve.check_size(args, site, gpus)
    for option in ("queue", "account", "qos", "reservation"):
        sweep.check_name(getattr(args, option), f"--{option}")
    sweep.check_name(getattr(args, "srun_mpi", None), f"site {args.site}: srun_mpi")
    sweep.check_constraint(args.constraint)
    if args.scheduler == "lsf" and (args.constraint or args.qos):
        raise LartpcError("--constraint and --qos are SLURM options; with LSF use --bsub-arg")
    extra = [sweep.scheduler_arg(a, "--sbatch-arg", "slurm") for a in args.sbatch_args]
    extra_lsf = [sweep.scheduler_arg(a, "--bsub-arg", "lsf") for a in args.bsub_args]
    if (extra and args.scheduler != "slurm") or (extra_lsf and args.scheduler != "lsf"):
        raise LartpcError(f"--sbatch-arg is for SLURM and --bsub-arg for LSF; the sweep's "
                          f"scheduler is {args.scheduler}")
    sweep.parse_time_s(args.time)
    if args.max_requeues < 0:
        raise LartpcError(f"--max-requeues {args.max_requeues}: must be 0 or more")
    sweep.check_sets(args.sets, configs, seeds, args.launcher)
    cores = resolve.cores_per_rank(args)
    data = sweep.job_path(str(args.data), "--data")  # "$SCRATCH/events" stays for the job
    sweep.check_path(Path(data), "--data", directive=False)
    sweep.check_path(args.out_dir, "--out-dir", directive=True)
    out_dir = args.out_dir.resolve()
    sweep.check_path(out_dir, "--out-dir", directive=True)
    if not args.dry_run and not args.no_data_check:  # data only on the cluster: not here
        here = sweep.local_path(data)
        if here is None or not here.is_dir():
            raise LartpcError(f"--data {args.data}: no such folder here; --no-data-check "
                              "writes the scripts for data that exists only on the cluster")
        resolve.check_data(here, configs, gpus, seeds, args.sets)
    jobs_dir = out_dir / "jobs"
    configs, copies = _copies(args, configs, jobs_dir)
    shape = sweep.JobShape(scheduler=args.scheduler, launcher=args.launcher, time=args.time,
                           gpus_per_node=args.gpus_per_node, cores_per_rank=cores,
                           cpu=args.cpu, account=args.account, queue=args.queue,
                           constraint=args.constraint, qos=args.qos,
                           reservation=args.reservation, extra_args=extra or extra_lsf,
                           srun_mpi=getattr(args, "srun_mpi", None),
                           prelude=str(jobs_dir / "prelude.sh") if args.prelude else None,
                           max_requeues=args.max_requeues)
    logs_dir = out_dir / "logs"
    points = sweep.plan(configs, gpus, seeds, out_dir, jobs_dir, args.scheduler)
    scripts = sweep.build_scripts(points, shape, data, args.sets, logs_dir)
    network, network_env = sweep.network_script(points, shape, out_dir, logs_dir) \
        if args.measure_network else (None, None)
    if network is not None:
        sweep.check_syntax(network, "allreduce")
    submit_cmd = sweep.SUBMIT[args.scheduler] + (" <" if args.scheduler == "lsf" else "")

    for p in points:
        sweep.check_syntax(scripts[p.name], p.name)
    if args.dry_run:  # render and check only: no script is run
        template = sweep.template_path(shape)
        for path in copies:
            print(f"### would copy: {path}")
        if network is not None:
            print(f"### network: {jobs_dir / 'allreduce.sbatch'} -> {out_dir / 'network.json'}")
            print(network, end="")
            template_net = sweep.jobs_dir() / sweep.NETWORK_TEMPLATE
            print(f"### launch: {sweep.launch_line(template_net, network_env)}\n")
        for p in points:
            env = sweep.exports(p, shape, data, args.sets)
            print(f"### {p.name}: {p.script} -> run {p.run}")
            print(scripts[p.name], end="")
            print(f"### submit: {submit_cmd} {p.script}")
            print(f"### launch: {sweep.launch_line(template, env)}\n")
        return 0

    meta = {"created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "scheduler": args.scheduler, "launcher": args.launcher, "data": str(data),
            "configs": configs, "site": args.site, "time": args.time, "sets": args.sets,
            "cores_per_rank": cores, "scheduler_args": shape.extra_args}
    if args.prelude:
        text = copies[jobs_dir / "prelude.sh"]
        meta["prelude"] = {"from": str(Path(args.prelude).resolve()),
                           "sha256": hashlib.sha256(text.encode()).hexdigest()}
    manifest = out_dir / "manifest.json"
    reasons = None
    if args.submit:  # every point's job asked about first: a failed squeue submits nothing
        reasons = jobsubmit.skip_reasons(points, args.scheduler,
                                         jobsubmit.read_manifest(manifest))
    out_dir.mkdir(parents=True, exist_ok=True)
    whats = {sub: f"the sweep's {sub.name} folder" for sub in (jobs_dir, logs_dir)}
    for sub, what in whats.items():  # both checked before either is made
        refuse_symlink(sub, what)
    for sub, what in whats.items():  # the scheduler writes logs/ too (it will not create it)
        subfolder(out_dir, sub.name, what)
    for path, text in copies.items():
        jobsubmit.write_script(path, text)
    after = None
    if network is not None:
        net_script = jobs_dir / "allreduce.sbatch"
        jobsubmit.write_script(net_script, network, 0o755)
        meta["network"] = {"script": str(net_script), "profile": str(out_dir / "network.json"),
                           "job_id": None}
        if args.submit:
            old_doc = jobsubmit.read_manifest(manifest)
            after = jobsubmit.submit_network(str(net_script), out_dir / "network.json", old_doc)
            meta["network"]["job_id"] = after
            if after:
                print(f"{net_script}  job {after}")
    old = jobsubmit.write(points, scripts, manifest, meta)
    skipped = []
    if args.submit:
        skipped = jobsubmit.submit(points, args.scheduler, manifest, meta, old, after,
                                   reasons)
    for p in points:
        print(f"{p.script}" + (f"  job {p.job_id}" if p.job_id else ""))
    for p, why in skipped:
        print(f"{p.name}: not submitted, {why}")
    print(f"manifest: {manifest}")
    if not args.submit:
        print(f"submit each with: {submit_cmd} <script>")
    return 0
