"""What a sweep's options come to: site defaults, a config per model, cores per rank,
and a check that the data fits every point before any script is written."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from lartpc.jobs import sweep
from lartpc.jobs.sites import load_site

from lartpc.errors import ConfigError, LartpcError

if TYPE_CHECKING:
    from lartpc.jobs.plan import SweepRequest

log = logging.getLogger(__name__)

#: Built-in values of options that neither the command line nor a site sets.
DEFAULTS = {"time": "04:00:00", "config_prefix": "paper"}
#: Most nodes one point may ask for when the site does not declare ``nodes``: above the
#: GPU node count of any machine in service, so only a mistyped --gpus reaches it.
MAX_NODES = 10_000


def apply_site(args: SweepRequest) -> dict:
    """Fill the request's options left unset from ``--site`` (then DEFAULTS), in place.

    The command line wins, a site's ``sbatch_args``/``bsub_args`` come before the
    command line's. Returns the site (empty without ``--site``).
    """
    site = load_site(args.site) if args.site else {}
    for key in ("scheduler", "launcher", "gpus_per_node", "cores_per_node", "time", "queue",
                "constraint", "qos", "reservation", "prelude", "srun_mpi"):
        if getattr(args, key, None) is None and key in site:
            setattr(args, key, site[key])
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.sbatch_args = [*site.get("sbatch_args", []), *args.sbatch_args]
    args.bsub_args = [*site.get("bsub_args", []), *args.bsub_args]
    for option in ("scheduler", "launcher"):
        if getattr(args, option) is None:
            raise LartpcError(f"--{option} is required (or a --site that sets it)")
    if site.get("account_required") and not args.account:
        raise LartpcError(f"--site {args.site}: --account is required; "
                          f"{site.get('account_hint', 'give the project to charge')}")
    return site


def check_size(args: SweepRequest, site: dict, gpus: list[int]) -> None:
    """Refuse a layout the machine cannot hold: more GPUs per node than the site's nodes
    have, or a GPU count that needs more nodes than the site has (``MAX_NODES`` when it
    does not say).

    Raises
    ------
    LartpcError
        Naming the option (``--gpus-per-node`` or ``--gpus``) and the site's size.
    """
    per = args.gpus_per_node
    if per is not None and per < 1:
        raise LartpcError(f"--gpus-per-node {per}: must be at least 1")
    per = per or sweep.DEFAULT_GPUS_PER_NODE[args.scheduler]
    name = f"site {args.site}" if site else "the sweep"
    site_per = site.get("gpus_per_node")
    if site_per is not None and per > site_per:
        raise LartpcError(f"--gpus-per-node {per}: {name} has {site_per} GPUs per node")
    most = site.get("nodes", MAX_NODES)
    for n in gpus:
        nodes = -(-n // min(n, per))
        if nodes > most:
            where = (f"{name} has {most} nodes" if "nodes" in site else
                     f"more than {MAX_NODES} nodes; a site file with `nodes = ...` sets "
                     "the limit of a larger machine")
            raise LartpcError(f"--gpus {n}: needs {nodes} nodes of {per} GPUs; {where}")


def configs(args: SweepRequest) -> dict[str, str]:
    """model -> config (preset name or TOML path) for every model of the sweep.

    ``--config`` names presets or TOML files, each for the model it declares;
    otherwise ``--models`` with the ``--config-prefix`` presets.
    """
    from lartpc.config import load_config

    if not args.configs:
        models = sweep.parse_models(args.models or "jishnet,scnet")
        return {m: f"{args.config_prefix}-{m}" for m in models}
    out: dict[str, str] = {}
    for ref in args.configs:
        path = Path(ref)
        if path.suffix == ".toml" and not path.is_file():
            raise LartpcError(f"--config {ref}: no such file")
        try:
            cfg = load_config(str(path.resolve()) if path.suffix == ".toml" else ref, [])
        except ConfigError as e:
            raise LartpcError(f"--config {ref}: {e}") from e
        if cfg.model.name in out:
            raise LartpcError(f"--config {ref}: a second config for model {cfg.model.name}")
        out[cfg.model.name] = str(path.resolve()) if path.suffix == ".toml" else ref
    if args.models:
        wanted = sweep.parse_models(args.models)
        if sorted(wanted) != sorted(out):
            raise LartpcError(f"--models {args.models} does not match the models of --config "
                              f"({', '.join(out)}); leave --models out")
    return out


def node_cpus(queue: str | None) -> int | None:
    """CPUs per node that SLURM reports for the partition (the smallest), or None."""
    if shutil.which("sinfo") is None:
        return None
    cmd = ["sinfo", "-h", "-o", "%c", *(["-p", queue] if queue else [])]
    out = subprocess.run(cmd, capture_output=True, text=True)
    values = [int(v.rstrip("+")) for v in out.stdout.split() if v.rstrip("+").isdigit()]
    return min(values) if out.returncode == 0 and values else None


def cores_per_rank(args: SweepRequest) -> int:
    """``--cores-per-rank``, or the node's cores divided by its GPUs (ranks per node).

    The node's cores come from ``--cores-per-node`` (or the site), else from ``sinfo``
    for the partition. Without either, one core per rank, said in a warning.
    """
    if args.cores_per_rank is not None:
        if args.cores_per_rank < 1:
            raise LartpcError(f"--cores-per-rank {args.cores_per_rank}: must be at least 1")
        return args.cores_per_rank
    per_node = args.gpus_per_node or sweep.DEFAULT_GPUS_PER_NODE[args.scheduler]
    cpus = args.cores_per_node
    source = "--cores-per-node"
    if cpus is None and args.scheduler == "slurm":
        cpus, source = node_cpus(args.queue), "sinfo"
    if cpus is None:
        log.warning("cores per rank: 1 (the node's cores are unknown: give --cores-per-rank, "
                    "--cores-per-node or --site)")
        return 1
    if cpus < 1:
        raise LartpcError(f"--cores-per-node {cpus}: must be at least 1")
    cores = max(1, cpus // per_node)
    log.info("cores per rank: %d (%d CPUs per node from %s / %d ranks per node)",
             cores, cpus, source, per_node)
    return cores


def check_data(data: Path, configs: dict[str, str], gpus: list[int], seeds: list[int],
               sets: list[str]) -> None:
    """Every point could start on ``data``: the store opens, its downsample factor is
    the config's, and the split leaves evaluation events and a training event per rank.

    Raises
    ------
    LartpcError
        Naming the data folder and the point that does not fit.
    """
    from lartpc.config import load_config
    from lartpc.data.store import EventStore
    from lartpc.train.plan import check_store_fits, plan_run

    try:
        store = EventStore(data)
    except LartpcError as e:
        raise LartpcError(f"--data: {e}") from e
    for model, ref in configs.items():
        for seed in seeds:
            cfg = load_config(ref, [f"train.seed={seed}", *sets])
            for n in gpus:
                try:
                    check_store_fits(cfg, store, data)
                    plan_run(cfg, store, n)
                except LartpcError as e:
                    raise LartpcError(f"--data {data} does not fit {model} on {n} ranks "
                                      f"(config {ref}): {e}") from e
