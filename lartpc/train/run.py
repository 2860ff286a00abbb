"""Set-up and tear-down around the loop: checks, lock, run.json, backend, status."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lartpc import dist
from lartpc.config import Config
from lartpc.data.sharding import ShardPlan
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError, LartpcError
from lartpc.fsutil import remove_stale_temporaries
from lartpc.runfolder import provenance, record
from lartpc.runfolder.guard import check_trainable
from lartpc.runfolder.lock import RunLock
from lartpc.runfolder.schema import RunFolderError, Status
from lartpc.train import segments, tblog
from lartpc.train.parts import model_options
from lartpc.train.plan import check_store_fits, plan_run
from lartpc.train.signals import StopRequests

if TYPE_CHECKING:
    from lartpc.train.trainer import Trainer

log = logging.getLogger(__name__)
#: exit code of ``lartpc train`` by run status ("failed" raises, exit 2 from the CLI).
#: "preempted" exits 0: the run is checkpointed, and a non-zero rank would make
#: horovodrun or torchrun kill the other ranks before rank 0 has marked the run.
EXIT_CODES = {Status.COMPLETED: 0, Status.TIME_LIMIT: 0, Status.PREEMPTED: 0,
              Status.DIVERGED: 1}


def prepare(cfg: Config, data: Path, out: Path) -> EventStore:
    """Open and check the data and the run folder path (before any backend starts)."""
    if cfg.train.tensorboard:
        tblog.require()  # before any work: a missing extra is a config error
    store = EventStore(data)
    check_store_fits(cfg, store, data)
    from lartpc.models import build

    # raises if the image is too small or a speed option cannot run on this device
    build(cfg.model.name, image_size=store.geometry.shape, num_classes=len(store.classes),
          **model_options(cfg, dist.device_type(cfg.train.device)))
    # before any backend starts: a split with no evaluation event (the same for every
    # world size); run_training plans the shards for its world
    plan_run(cfg, store, 1)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    return store


def lock_run_folder(world: dist.World, out: Path, process_start: float) -> RunLock | None:
    """Rank 0 takes the folder's lock before anything is written; every rank learns
    whether it did, so a refused job fails on all ranks at once."""
    lock, error = None, None
    if world.is_root:
        try:
            check_trainable(out)
            out.mkdir(parents=True, exist_ok=True)
            lock = RunLock(out, process_start).acquire()
            for p in remove_stale_temporaries(out):
                log.info("removed %s (left by a killed writer)", p)
        except (LartpcError, OSError) as e:
            error = str(e)
    error = world.broadcast_object(error)
    if error:
        raise RunFolderError(error if world.is_root else f"rank 0: {error}")
    return lock


def run_training(cfg: Config, store: EventStore, out: Path, process_start: float) -> int:
    """Train one segment of the run in ``out``; the exit code (see :data:`EXIT_CODES`)."""
    from lartpc.logs import setup_logging

    world = dist.init(cfg.dist.backend, cfg.train.device, cfg.dist.timeout_s)
    setup_logging(rank=world.rank)
    out = Path(out)
    plan = plan_run(cfg, store, world.size)  # before run.json: too few events for the ranks
    lock = lock_run_folder(world, out, process_start)
    try:
        resume = segments.load_resume(cfg, store, out, world.size)
        if segments.is_complete(cfg, resume):
            log.info("run %s is complete (%d of %d epochs): nothing to do", out,
                     resume["epoch"], cfg.train.epochs)
            world.shutdown()
            return 0
        if segments.budget_spent(cfg, resume):
            log.info("run %s has spent its budget (%.0f s of training, train.budget_s=%g): "
                     "nothing to do", out, resume["train_time_s"], cfg.train.budget_s)
            if world.is_root:  # the job scripts read it: not requeued again
                _mark_budget_spent(out, cfg.train.budget_s)
            world.shutdown()
            return 0
        status = _train_segment(cfg, store, out, process_start, world, resume, plan)
    finally:
        if lock is not None:
            lock.release()
    world.shutdown()
    return EXIT_CODES[status]


def _mark_budget_spent(out: Path, budget_s: float) -> None:
    """run.json says the budget is spent (a budget lowered on resume, or a segment
    killed before it could say so)."""
    info = record.read_record(out)
    if info.get("budget_spent") is not True or info.get("budget_s") != budget_s:
        info.update(budget_spent=True, budget_s=budget_s)
        record.write_record(out, info)


def _train_segment(cfg: Config, store: EventStore, out: Path, process_start: float,
                   world: dist.World, resume: dict | None, plan: ShardPlan) -> str:
    from lartpc.train.parts import bind_cores, set_threads
    from lartpc.train.trainer import Trainer

    binding = bind_cores(world)
    threads = set_threads(cfg, world, binding)
    store_id = segments.store_identity(store, cfg.data.max_events)
    info = _begin(cfg, store, out, process_start, world, resume, store_id, threads)
    if world.is_root:  # written with the network record, once the backend is set up
        info["cpu_binding"] = binding
    stops = StopRequests().install()
    status, error = "failed", None
    try:
        trainer = Trainer.build(cfg, store, plan, world, out, process_start, resume,
                                stops=stops, store_id=store_id)
        if world.is_root:  # after the broadcasts, which set NCCL's communicator up
            _record_network(out, info, world)
        status = _fit(trainer, info)
    except BaseException as e:
        error = str(e) if isinstance(e, LartpcError) else f"{type(e).__name__}: {e}"
        raise
    finally:
        stops.restore()
        if world.is_root:
            _write_final(out, info, status, error)
    log.info("run %s: %s", out, status)
    world.allreduce_sum(torch.zeros(1))  # no rank exits before rank 0 marked the run
    return status


def _begin(cfg: Config, store: EventStore, out: Path, process_start: float,
           world: dist.World, resume: dict | None, store_id: dict, threads: int) -> dict:
    """Rank 0 opens this segment in run.json (status running); the record (empty on
    other ranks). Every rank returns once the folder is there to write into."""
    info = {}
    hosts = world.allgather_object(provenance.host())  # every rank takes part
    if world.is_root:
        info = record.begin_segment(
            cfg.to_dict(), out, None if resume is None else resume["global_step"],
            process_start, store_id)
        info.update({
            "model": cfg.model.name, "world_size": world.size, "backend": world.backend,
            "loss": cfg.model.loss,
            # the constructor's options as resolved here (model.stem=auto -> fused/library)
            "model_options": model_options(cfg, world.device.type),
            "geometry": store.geometry.to_attrs(), "versions": provenance.versions(),
            "git_sha": provenance.git_sha(), "host": provenance.host(),
            "data": str(Path(store.paths[0]).parent.resolve()),
            "threads_per_rank": threads, "device": str(world.device),
            # with world_size and local ranks: did the ranks share a host's cores?
            "host_cpus": os.cpu_count(), "local_size": world.local_size,
            "nodes": list(dict.fromkeys(hosts))})  # the job's hosts, in rank order
        record.end_segment(info, Status.RUNNING.value, None)
        record.write_record(out, info)
    world.broadcast_object(None)  # the folder exists before any rank writes into it
    return info


def _record_network(out: Path, info: dict, world: dist.World) -> None:
    """run.json's ``network``: collective library, NCCL version and plugin, transport;
    a loud warning when several nodes talk over TCP sockets through NCCL."""
    from lartpc.dist import transport

    net = transport.describe(world.collectives(), len(info.get("nodes", [])) or 1)
    info["network"] = net
    if net["sockets_across_nodes"]:
        log.warning("NETWORK: %d nodes talk through NCCL over TCP SOCKETS, not the "
                    "cluster's fabric (NCCL_NET_PLUGIN=%s, plugin loadable: %s): step "
                    "times and every fit over N are biased; set the site's network "
                    "variables (the site prelude, jobs/sites/) and check %s", net["nodes"],
                    net.get("net_plugin"), net.get("net_plugin_loadable"),
                    net.get("transport_source"))
    record.write_record(out, info)


def _fit(trainer: Trainer, info: dict) -> str:
    """Give the trainer its checkpointer and sinks, and train; the status."""
    from lartpc.train.checkpoint import Checkpointer
    from lartpc.train.loop import fit
    from lartpc.train.sinks import open_sinks

    cfg, world, out, plan = trainer.cfg, trainer.world, trainer.run, trainer.plan
    if world.is_root:
        info.update(steps_per_epoch=plan.steps_per_epoch, train_events=len(plan.train),
                    eval_events=len(plan.eval), loader=trainer.train_loader.mode)
        record.write_record(out, info)
    sinks = open_sinks(cfg, out, world.rank, world.is_root, plan.steps_per_epoch,
                       trainer.process_start, trainer.state.global_step)
    ckpt = Checkpointer(world, out, cfg.train.checkpoint_every_steps,
                        cfg.train.checkpoint_every_s)
    try:
        status = fit(trainer, ckpt, sinks)
    finally:
        sinks.close()
    s = trainer.state
    divergence = trainer.close()
    if world.is_root:
        info["param_divergence"] = divergence
        # the study's clock: steps only, evaluation and checkpoints apart (all segments)
        info.update(train_time_s=s.train_time_s, eval_time_s=s.eval_time_s,
                    checkpoint_time_s=s.checkpoint_time_s, budget_s=cfg.train.budget_s,
                    budget_spent=trainer.budget_spent)
    if divergence != 0.0:
        log.error("ranks ended with different parameters (max |diff| %.3g)", divergence)
    return status


def _write_final(out: Path, info: dict, status: str, error: str | None) -> None:
    """Mark the run's end; a disk that cannot take even this is logged, not raised."""
    record.end_segment(info, status, time.time(), error)
    try:
        record.write_record(out, info)
    except RunFolderError as e:
        log.error("%s", e)
