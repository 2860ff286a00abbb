"""``lartpc sweep``: job scripts for models x GPU counts x seeds, plus a manifest.

Writes ``<out-dir>/jobs/<model>-n<N>-s<seed>.<sbatch|lsf>``, ``<out-dir>/logs/`` for the
scheduler's output and ``<out-dir>/manifest.json``; each job trains into
``<out-dir>/<model>-n<N>-s<seed>``. ``--dry-run`` prints the scripts (checked with
``bash -n``, never run) and the launcher line each would run, writing nothing;
``--submit`` also submits them (sbatch/bsub) and records the job ids in the manifest.
Every value that goes into a script (queue, account, time, paths, ``--set``) is
checked first; ``--set`` against each point's resolved config.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from lartpc.errors import LartpcError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="jishnet,scnet", help="comma-separated: jishnet,scnet")
    p.add_argument("--gpus", default="1,2,4", help="comma-separated GPU (rank) counts")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (train.seed)")
    p.add_argument("--scheduler", choices=("slurm", "lsf"), required=True)
    p.add_argument("--launcher", choices=("horovod", "horovod-gloo", "torchrun", "jsrun"),
                   required=True, help="slurm: horovod (srun --mpi=pmix), horovod-gloo "
                   "(horovodrun), torchrun; lsf: jsrun, horovod (horovodrun)")
    p.add_argument("--data", required=True, type=Path, help="event folder (lartpc simulate)")
    p.add_argument("--out-dir", default=Path("runs"), type=Path,
                   help="parent of the run folders, scripts, logs and manifest.json")
    p.add_argument("--config-prefix", default="paper", choices=("tiny", "paper"),
                   help="presets <prefix>-<model> (tiny = events downsampled by 4)")
    p.add_argument("--time", default="04:00:00", help="wall time per job, [D-]HH:MM:SS")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="ranks per node (default: 4 for slurm, 6 for lsf as on Summit)")
    p.add_argument("--cores-per-rank", type=int, default=1, help="CPU cores per rank")
    p.add_argument("--cpu", action="store_true", help="request no GPUs (CPU-only runs)")
    p.add_argument("--account", default=None, help="account / project to charge")
    p.add_argument("--queue", default=None, help="SLURM partition or LSF queue")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V",
                   help="extra train override for every point (repeatable; no spaces)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print, write nothing")
    mode.add_argument("--submit", action="store_true", help="write, then sbatch/bsub each")


def run(args: argparse.Namespace) -> int:
    from jobs import sweep

    models = sweep.parse_models(args.models)
    gpus = sweep.parse_list(args.gpus, "--gpus", positive=True)
    seeds = sweep.parse_list(args.seeds, "--seeds")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise LartpcError(f"--gpus-per-node {args.gpus_per_node}: must be at least 1")
    if args.cores_per_rank < 1:
        raise LartpcError(f"--cores-per-rank {args.cores_per_rank}: must be at least 1")
    sweep.check_name(args.queue, "--queue")
    sweep.check_name(args.account, "--account")
    sweep.parse_time_s(args.time)
    sweep.check_sets(args.sets, models, seeds, args.config_prefix, args.launcher)
    data = args.data.resolve()
    sweep.check_path(data, "--data", directive=False)
    sweep.check_path(args.out_dir.resolve(), "--out-dir", directive=True)
    if not args.dry_run and not data.is_dir():
        raise LartpcError(f"--data {args.data}: no such folder")
    shape = sweep.JobShape(scheduler=args.scheduler, launcher=args.launcher, time=args.time,
                           gpus_per_node=args.gpus_per_node, cores_per_rank=args.cores_per_rank,
                           cpu=args.cpu, account=args.account, queue=args.queue)
    out_dir = args.out_dir.resolve()
    logs_dir = out_dir / "logs"
    points = sweep.plan(models, gpus, seeds, out_dir, out_dir / "jobs", args.config_prefix,
                        args.scheduler)
    scripts = sweep.build_scripts(points, shape, data, args.sets, logs_dir)
    submit_cmd = sweep.SUBMIT[args.scheduler] + (" <" if args.scheduler == "lsf" else "")

    if args.submit:  # fail before writing anything if it cannot be submitted
        import shutil

        exe = sweep.SUBMIT[args.scheduler]
        if shutil.which(exe) is None:
            raise LartpcError(f"--submit --scheduler {args.scheduler}: `{exe}` not found on PATH")
    for p in points:
        sweep.check_syntax(scripts[p.name], p.name)
    if args.dry_run:  # render and check only: no script is run
        template = sweep.template_path(shape)
        for p in points:
            env = sweep.exports(p, shape, data, args.sets)
            print(f"### {p.name}: {p.script} -> run {p.run}")
            print(scripts[p.name], end="")
            print(f"### submit: {submit_cmd} {p.script}")
            print(f"### launch: {sweep.launch_line(template, env)}\n")
        return 0

    meta = {"created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "scheduler": args.scheduler, "launcher": args.launcher, "data": str(data),
            "config_prefix": args.config_prefix, "time": args.time, "sets": args.sets}
    logs_dir.mkdir(parents=True, exist_ok=True)  # the scheduler will not create it
    manifest = out_dir / "manifest.json"
    sweep.write(points, scripts, manifest, meta)
    if args.submit:
        sweep.submit(points, args.scheduler, manifest, meta)
    for p in points:
        print(f"{p.script}" + (f"  job {p.job_id}" if p.job_id else ""))
    print(f"manifest: {manifest}")
    if not args.submit:
        print(f"submit each with: {submit_cmd} <script>")
    return 0
