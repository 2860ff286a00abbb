"""``lartpc sweep``: job scripts for models x GPU counts x seeds, plus a manifest.

Writes ``<out-dir>/jobs/<model>-n<N>-s<seed>.<sbatch|lsf>``, ``<out-dir>/logs/`` for the
scheduler's output and ``<out-dir>/manifest.json``; each job trains into
``<out-dir>/<model>-n<N>-s<seed>``. ``--dry-run`` prints the scripts (checked with
``bash -n``, never run) and the launcher line each would run, writing nothing, and says
on stderr whether the data fits (exit 0 either way);
``--submit`` also submits them (sbatch/bsub), skipping points already completed, queued
or running (asked of squeue/bjobs for every point first: if that fails, nothing is
submitted), and records the job ids in the manifest. Every value that goes into a script
(queue, account, time, paths, ``--set``, ``--sbatch-arg``) is checked first, ``--set``
against each point's resolved config, and the data against every point.
``--site NAME`` takes a cluster's options from ``jobs/sites/NAME.toml``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lartpc.jobs.plan import SweepRequest


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_points(p)
    _add_layout(p)
    _add_extras(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print, write nothing")
    mode.add_argument("--submit", action="store_true", help="write, then sbatch/bsub each "
                      "point not already completed, queued or running")


def _add_points(p: argparse.ArgumentParser) -> None:
    """What runs: site, models and configs, GPU counts, seeds, launcher, data, out folder."""
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


def _add_layout(p: argparse.ArgumentParser) -> None:
    """How each job is laid out and charged: time, nodes, cores, account, queue."""
    p.add_argument("--time", default=None, help="wall time per job in SLURM's syntax: M, "
                   "M:SS, H:MM:SS, D-H, D-H:MM or D-H:MM:SS (default 04:00:00; LSF gets it "
                   "as -W H:MM)")
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


def _add_extras(p: argparse.ArgumentParser) -> None:
    """More scheduler options, the node's prelude, the network job, requeues, --set."""
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
                   "allocation (SLURM; refused when that is 1 GPU): OUT-DIR/network.json for "
                   "`lartpc analyze predict --cluster-file`; the points start after it")
    p.add_argument("--max-requeues", type=int, default=20, metavar="N",
                   help="most requeues (SLURM) or resubmissions (LSF) of one point's job, "
                   "written into its script (default 20); a point that has spent its "
                   "budget (train.budget_s, training time) is requeued no more")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V",
                   help="extra train override for every point (repeatable; no spaces)")


#: SweepRequest fields that are not options of their own (set from the mode options or
#: by the site).
_NOT_OPTIONS = {"check_data", "data_advice", "submit", "srun_mpi"}


def request(args: argparse.Namespace) -> SweepRequest:
    """The parsed options as a :class:`lartpc.jobs.plan.SweepRequest`."""
    from lartpc.jobs.plan import SweepRequest

    names = [f.name for f in dataclasses.fields(SweepRequest) if f.name not in _NOT_OPTIONS]
    return SweepRequest(**{n: getattr(args, n) for n in names}, submit=args.submit,
                        check_data=not args.no_data_check, data_advice=args.dry_run)


def check_out_dir(out_dir: Path) -> None:
    """Refuse an ``--out-dir`` that is, or lies under, something other than a folder (a
    file there was blamed as an unreadable ``manifest.json`` inside it).

    Raises
    ------
    LartpcError
        Naming the path that is not a folder.
    """
    from lartpc.errors import LartpcError

    for path in (out_dir, *out_dir.parents):
        if path.exists():  # the nearest that does, links followed
            if path.is_dir():
                return
            where = "" if path == out_dir else f"{path} "
            raise LartpcError(f"--out-dir {out_dir}: {where}is a file, not a folder; "
                              "choose another --out-dir")


def run(args: argparse.Namespace) -> int:
    from lartpc.jobs import plan as sweeplib

    check_out_dir(args.out_dir)
    sweep = sweeplib.plan(request(args))
    if args.dry_run:  # render and check only: no script is run
        sweeplib.render(sweep, sys.stdout)
        if not args.no_data_check:  # what writing or submitting would say of the data
            fits = f"--data {args.data} fits every point"
            print(f"lartpc sweep --dry-run: {sweep.data_problem or fits}"
                  + (" (writing or submitting would refuse it)" if sweep.data_problem
                     else ""), file=sys.stderr)
        return 0
    result = sweeplib.submit(sweep) if args.submit else sweeplib.write(sweep)
    if result.network_job:
        print(f"{sweep.network_script}  job {result.network_job}")
    for p in sweep.points:
        print(f"{p.script}" + (f"  job {p.job_id}" if p.job_id else ""))
    for p, why in result.skipped:
        print(f"{p.name}: not submitted, {why}")
    print(f"manifest: {result.manifest}")
    if not args.submit:
        print(f"submit each with: {sweep.submit_command} <script>")
    return 0
