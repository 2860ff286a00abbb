"""Set-up and tear-down around the loop: checks, lock, run.json, backend, status."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lartpc import dist
from lartpc.config import Config
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError, LartpcError
from lartpc.runfolder import provenance
from lartpc.runfolder.folder import RunFolder
from lartpc.runfolder.schema import CHECKPOINT, RunFolderError, Status
from lartpc.train import segments, tblog
from lartpc.train.checkpoint import load_init_weights
from lartpc.train.parts import model_options, rulebooks_choice
from lartpc.train.plan import check_store_fits, plan_run
from lartpc.train.segments import Segment
from lartpc.train.signals import StopRequests

if TYPE_CHECKING:
    from lartpc.train.trainer import Trainer

log = logging.getLogger(__name__)
#: exit code of ``lartpc train`` by run status ("failed" raises, exit 2 from the CLI).
#: "preempted" exits 0: the run is checkpointed, and a non-zero rank would make
#: horovodrun or torchrun kill the other ranks before rank 0 has marked the run.
EXIT_CODES = {Status.COMPLETED: 0, Status.TIME_LIMIT: 0, Status.PREEMPTED: 0,
              Status.DIVERGED: 1}
#: The study's clock, in checkpoints and run.json (all segments).
CLOCK = ("train_time_s", "eval_time_s", "checkpoint_time_s")


def prepare(cfg: Config, data: Path, out: Path) -> EventStore:
    """Open and check the data and the run folder path (before any backend starts)."""
    if cfg.train.tensorboard:
        tblog.require()  # before any work: a missing extra is a config error
    store = EventStore(data)
    check_store_fits(cfg, store, data)
    from lartpc.models import build

    # raises if the image is too small or a speed option cannot run on this device
    model = build(cfg.model.name, image_size=store.geometry.shape,
                  num_classes=len(store.classes),
                  **model_options(cfg, dist.device_type(cfg.train.device)))
    if cfg.train.init_from and not (Path(out) / CHECKPOINT).exists():
        # a fresh run starts from these weights: they must load, before any folder
        load_init_weights(model, cfg.train.init_from, cfg.model.name, cfg.model.head)
    # before any backend starts: a split with no evaluation event (the same for every
    # world size); run_training plans the shards for its world
    plan_run(cfg, store, 1)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    return store


def take_run_folder(world: dist.World, folder: RunFolder, process_start: float) -> None:
    """Rank 0 takes the folder (guard, lock, stale temporaries, run.json's shape, an
    earlier attempt's leftovers) before anything is written; every rank learns whether
    it did, so a refused job fails on all ranks at once."""
    error = None
    if world.is_root:
        try:
            folder.take(process_start, world.size)
        except (LartpcError, OSError) as e:
            error = str(e)
    error = world.broadcast_object(error)
    if error:
        raise RunFolderError(error if world.is_root else f"rank 0: {error}")


def run_training(cfg: Config, store: EventStore, out: Path, process_start: float) -> int:
    """Train one segment of the run in ``out``; the exit code (see :data:`EXIT_CODES`)."""
    from lartpc.logs import setup_logging

    world = dist.init(cfg.dist.backend, cfg.train.device, cfg.dist.timeout_s)
    setup_logging(rank=world.rank)
    folder = RunFolder(out)
    plan = plan_run(cfg, store, world.size)  # before run.json: too few events for the ranks
    take_run_folder(world, folder, process_start)
    try:
        resume = segments.load_resume(cfg, store, folder.path, world.size)
        if segments.is_complete(cfg, resume):
            log.info("run %s is complete (%d of %d epochs): nothing to do", folder,
                     resume["epoch"], cfg.train.epochs)
            if world.is_root:  # killed after its last checkpoint, before it said so
                folder.mark_completed(**{k: resume[k] for k in CLOCK if k in resume})
            world.shutdown()
            return 0
        if segments.budget_spent(cfg, resume):
            log.info("run %s has spent its budget (%.0f s of training, train.budget_s=%g): "
                     "nothing to do", folder, resume["train_time_s"], cfg.train.budget_s)
            if world.is_root:  # the job scripts read it: not requeued again
                folder.mark_budget_spent(cfg.train.budget_s)
            world.shutdown()
            return 0
        seg = Segment(cfg, store, plan, world, folder.path, process_start, resume,
                      segments.store_identity(store, cfg.data.max_events))
        status = _train_segment(seg, folder)
    finally:
        folder.release()
    world.shutdown()
    return EXIT_CODES[status]


def _train_segment(seg: Segment, folder: RunFolder) -> str:
    from lartpc.train.parts import bind_cores, set_threads
    from lartpc.train.trainer import Trainer

    world = seg.world
    binding = bind_cores(world)
    threads = set_threads(seg.cfg, world, binding)
    _begin(seg, folder, threads)
    if world.is_root:  # written with the network record, once the backend is set up
        folder.info["cpu_binding"] = binding
    stops = StopRequests().install()
    status, error = "failed", None
    try:
        trainer = Trainer.build(seg, stops=stops)
        if world.is_root:  # after the broadcasts, which set NCCL's communicator up
            _record_network(folder, world)
        status = _fit(trainer, folder)
    except BaseException as e:
        error = str(e) if isinstance(e, LartpcError) else f"{type(e).__name__}: {e}"
        raise
    finally:
        stops.restore()
        if world.is_root:
            folder.end_segment(status, error)
    log.info("run %s: %s", folder, status)
    world.allreduce_sum(torch.zeros(1))  # no rank exits before rank 0 marked the run
    return status


def _begin(seg: Segment, folder: RunFolder, threads: int) -> None:
    """Rank 0 opens this segment in run.json (status running). Every rank returns once
    the folder is there to write into."""
    cfg, store, world = seg.cfg, seg.store, seg.world
    hosts = world.allgather_object(provenance.host())  # every rank takes part
    if world.is_root:
        folder.begin_segment(
            cfg.to_dict(), None if seg.resume is None else seg.resume["global_step"],
            seg.process_start, seg.store_id,
            model=cfg.model.name, world_size=world.size, backend=world.backend,
            loss=cfg.model.loss,
            # the constructor's options as resolved here (model.stem=auto -> fused/library)
            model_options=model_options(cfg, world.device.type),
            geometry=store.geometry.to_attrs(), versions=provenance.versions(),
            git_sha=provenance.git_sha(), host=provenance.host(),
            data=str(Path(store.paths[0]).parent.resolve()),
            threads_per_rank=threads, device=str(world.device),
            # with world_size and local ranks: did the ranks share a host's cores?
            host_cpus=os.cpu_count(), local_size=world.local_size,
            nodes=list(dict.fromkeys(hosts)))  # the job's hosts, in rank order
    world.broadcast_object(None)  # the folder exists before any rank writes into it


def _record_network(folder: RunFolder, world: dist.World) -> None:
    """run.json's ``network``: collective library, NCCL version and plugin, transport;
    a loud warning when several nodes talk over TCP sockets through NCCL."""
    from lartpc.dist import transport

    net = transport.describe(world.collectives(), len(folder.info.get("nodes", [])) or 1)
    if net["sockets_across_nodes"]:
        log.warning("NETWORK: %d nodes talk through NCCL over TCP SOCKETS, not the "
                    "cluster's fabric (NCCL_NET_PLUGIN=%s, plugin loadable: %s): step "
                    "times and every fit over N are biased; set the site's network "
                    "variables (the site prelude, jobs/sites/) and check %s", net["nodes"],
                    net.get("net_plugin"), net.get("net_plugin_loadable"),
                    net.get("transport_source"))
    folder.update(network=net)


def _fit(trainer: Trainer, folder: RunFolder) -> str:
    """Give the trainer its checkpointer and sinks, and train; the status."""
    from lartpc.train.checkpoint import Checkpointer
    from lartpc.train.loop import fit
    from lartpc.train.sinks import open_sinks

    cfg, world, plan = trainer.cfg, trainer.world, trainer.plan
    if world.is_root:
        folder.update(steps_per_epoch=plan.steps_per_epoch, train_events=len(plan.train),
                      eval_events=len(plan.eval), test_events=len(plan.test),
                      loader=trainer.train_loader.mode,
                      rulebooks=rulebooks_choice(cfg, trainer.train_loader.mode))
    sinks = open_sinks(trainer.segment, trainer.state.global_step)
    ckpt = Checkpointer(world, trainer.run, cfg.train.checkpoint_every_steps,
                        cfg.train.checkpoint_every_s)
    try:
        status = fit(trainer, ckpt, sinks)
    finally:
        sinks.close()
    s = trainer.state
    # train.cuda_graph: this segment's static steps, captures and replays
    graph = {} if trainer.graphed is None else {"cuda_graph": dict(trainer.graphed.stats)}
    divergence = trainer.close()
    if world.is_root:  # written as the segment ends
        # strict JSON: a difference that is no number (a NaN or inf met another value)
        # is null, logged below
        finite = divergence if math.isfinite(divergence) else None
        # the study's clock: steps only, evaluation and checkpoints apart (all segments)
        folder.info.update(**graph, param_divergence=finite, train_time_s=s.train_time_s,
                           eval_time_s=s.eval_time_s, checkpoint_time_s=s.checkpoint_time_s,
                           budget_s=cfg.train.budget_s, budget_spent=trainer.budget_spent)
    if divergence != 0.0:
        log.error("ranks ended with different parameters (max |diff| %.3g)", divergence)
    return status
