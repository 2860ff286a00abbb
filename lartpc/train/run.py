"""Set-up and tear-down around the loop: checks, run.json, backend, status."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from lartpc import dist
from lartpc.config import Config
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError
from lartpc.train import checkpoint, runinfo, runlog, tblog

log = logging.getLogger(__name__)
# Changing these on resume would change what the run means.
_FIXED_ON_RESUME = ("model", "data.downsample", "data.eval_fraction", "data.max_events",
                    "train.batch_per_rank", "train.seed", "train.optimizer")


def prepare(cfg: Config, data: Path, out: Path) -> tuple[EventStore, dict | None]:
    """Open and check the data and run folder; the checkpoint to resume, if any."""
    if cfg.train.tensorboard:
        tblog.require()  # before any work: a missing extra is a config error
    store = EventStore(data)
    if store.geometry.downsample != cfg.data.downsample:
        raise ConfigError(f"{data}: events are downsampled by {store.geometry.downsample} "
                          f"but the config says data.downsample={cfg.data.downsample}")
    from lartpc.models import build
    from lartpc.train.parts import build_plan, model_options

    # raises if the image is too small or a speed option cannot run on this device
    build(cfg.model.name, image_size=store.geometry.shape,
          **model_options(cfg, dist.device_type(cfg.train.device)))
    build_plan(cfg, store, 1)  # empty splits; run_training checks again for its world size
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    resume = checkpoint.load(out) if out.is_dir() else None
    if resume is None and out.is_dir() and (out / "run.json").exists():
        raise ConfigError(f"--out {out}: holds a run without checkpoint.pt; "
                          "choose a new folder (nothing there is overwritten)")
    if resume is not None:
        saved = resume["config"]
        now = cfg.to_dict()
        for key in _FIXED_ON_RESUME:
            a, b = _get(saved, key), _get(now, key)
            if a != b:
                raise ConfigError(f"--out {out}: checkpoint has {key}={a!r}, config says {b!r}")
    return store, resume


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def run_training(cfg: Config, store: EventStore, out: Path, process_start: float,
                 resume: dict | None) -> int:
    from lartpc.logs import setup_logging
    from lartpc.train.loop import fit
    from lartpc.train.parts import build_parts, build_plan, set_threads

    world = dist.init(cfg.dist.backend, cfg.train.device, cfg.dist.timeout_s)
    setup_logging(rank=world.rank)
    out = Path(out)
    if resume is not None and resume["world_size"] != world.size:
        raise ConfigError(f"--out {out}: checkpoint was written by {resume['world_size']} "
                          f"ranks, this job has {world.size}")
    build_plan(cfg, store, world.size)  # before run.json: too few events for these ranks
    threads = set_threads(cfg, world)
    info_path = out / "run.json"
    if world.is_root:
        out.mkdir(parents=True, exist_ok=True)
        info = runlog.read_json(info_path) if resume is not None and info_path.exists() else {
            "start_time": process_start, "segments": []}
        info.update({
            "model": cfg.model.name, "world_size": world.size, "backend": world.backend,
            "batch_per_rank": cfg.train.batch_per_rank, "loss": cfg.model.loss,
            "config": cfg.to_dict(), "geometry": store.geometry.to_attrs(),
            "versions": runinfo.versions(), "git_sha": runinfo.git_sha(),
            "host": runinfo.host(), "data": str(Path(store.paths[0]).parent.resolve()),
            "threads_per_rank": threads, "device": str(world.device),
            "status": "running", "end_time": None})
        info["segments"].append({"start_time": process_start, "end_time": None})
        runlog.write_json(info_path, info)
    world.broadcast_object(None)  # the folder exists before any rank writes into it
    status = "failed"
    try:
        parts = build_parts(cfg, store, world, out, process_start, resume)
        if world.is_root:
            info.update(steps_per_epoch=parts.plan.steps_per_epoch,
                        train_events=len(parts.plan.train), eval_events=len(parts.plan.eval),
                        loader=parts.train_loader.mode)
            runlog.write_json(info_path, info)
        status, divergence = fit(parts, resume)
        if world.is_root:
            info["param_divergence"] = divergence
        if divergence != 0.0:
            log.error("ranks ended with different parameters (max |diff| %.3g)", divergence)
    finally:
        if world.is_root:
            end = time.time()
            info.update(status=status, end_time=end)
            info["segments"][-1]["end_time"] = end
            runlog.write_json(info_path, info)
    log.info("run %s: %s", out, status)
    world.shutdown()
    return 0
