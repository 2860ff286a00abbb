"""Build everything a training run drives: model, loss, optimizer, loaders, shards.

Order: shard data (DLT) -> build model -> DistributedOptimizer -> resume -> broadcast
parameters and optimizer state (Horovod's own order: the state is broadcast through the
wrapped optimizer, which is the one that steps) -> DistributedDataParallel (torch
backend) -> torch.compile -> loaders.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lartpc.config import Config
from lartpc.data.sharding import ShardPlan, plan_run
from lartpc.data.store import EventStore
from lartpc.dist import World
from lartpc.errors import ConfigError
from lartpc.train.optim import build_optimizer
from lartpc.train.progress import NoProgress, open_progress
from lartpc.train.tblog import TBLog, open_tblog

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """Everything the loop drives, built once by :func:`build_parts`."""

    cfg: Config
    world: World
    run: Path
    plan: ShardPlan
    model: torch.nn.Module
    loss_fn: torch.nn.Module
    opt: torch.optim.Optimizer
    train_loader: object
    eval_loader: object
    process_start: float
    autocast: object
    scaler: torch.amp.GradScaler | None = None  #: fp16 dynamic loss scaling
    tb: TBLog = field(default_factory=TBLog)  #: TensorBoard scalars (no-op unless enabled)
    stops: object | None = None  #: signals.StopRequests the loop votes on
    store_id: dict | None = None  #: segments.store_identity, saved in checkpoints
    #: rank 0's progress lines (progress.ConsoleProgress); a no-op on other ranks
    progress: object = field(default_factory=NoProgress)


def model_options(cfg: Config, device_type: str) -> dict:
    """Speed options of the configured model (they never change what it computes,
    beyond rounding); an option the device cannot run is a :class:`ConfigError`."""
    m, amp = cfg.model, cfg.train.amp
    if m.name == "jishnet":
        if m.algo != "auto":
            raise ConfigError(f"model.algo={m.algo!r} is an SCNet option (model.name=jishnet)")
        return {"channels_last": m.channels_last, "elu_after_pool": m.elu_after_pool}
    if m.channels_last:
        raise ConfigError("model.channels_last is a JishNet option (model.name=scnet)")
    if amp == "bf16":
        raise ConfigError("train.amp=bf16 with model.name=scnet: spconv has no bfloat16 "
                          "kernels; use train.amp=fp16 (CUDA) or none")
    if amp == "fp16" and device_type != "cuda":
        raise ConfigError("train.amp=fp16 with model.name=scnet needs CUDA (spconv's CPU "
                          "kernels are float32 only); use train.amp=none on CPU")
    return {"algo": None if m.algo == "auto" else m.algo, "half": amp == "fp16"}


def autocast_and_scaler(cfg: Config, device_type: str):
    """The forward pass's autocast context factory and the fp16 loss scaler (or None).

    SCNet runs its own float16 trunk (``half``), so it gets no outer autocast.
    """
    amp = cfg.train.amp
    scaler = torch.amp.GradScaler(device_type) if amp == "fp16" else None
    if amp == "none" or cfg.model.name == "scnet":
        return nullcontext, scaler
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return (lambda: torch.autocast(device_type, dtype=dtype)), scaler


def loader_mode(cfg: Config, model: torch.nn.Module) -> str:
    """The batch path: the config's, or the one the model's input needs."""
    if cfg.data.loader != "auto":
        return cfg.data.loader
    return "sparse" if model.input_kind == "sparse" else "blosc"


def build_parts(cfg: Config, store: EventStore, world: World, run: Path,
                process_start: float, resume: dict | None) -> Parts:
    from lartpc.models import build
    from lartpc.models.losses import build_loss

    tc = cfg.train
    plan = plan_run(cfg, store, world.size)
    torch.manual_seed(tc.seed)
    if world.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: autotune once
    model = build(cfg.model.name, image_size=store.geometry.shape,
                  **model_options(cfg, world.device.type)).to(world.device)
    mode = loader_mode(cfg, model)
    if (mode == "sparse") != (model.input_kind == "sparse"):
            raise ConfigError(f"data.loader={mode!r} cannot feed {cfg.model.name} "
                          f"(it needs {model.input_kind} batches)")
    opt = build_optimizer(tc, model)
    autocast, scaler = autocast_and_scaler(cfg, world.device.type)
    # Wrap before loading any state: hvd.DistributedOptimizer builds a new optimizer
    # from the param groups, so state loaded into the inner one would be dropped (a
    # resumed Horovod run restarted Adam from step 0).
    opt = world.distributed_optimizer(opt, model, tc.grad_compression)
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        if scaler is not None and resume.get("scaler"):
            scaler.load_state_dict(resume["scaler"])
    # Every rank starts from rank 0's weights and optimizer state.
    world.broadcast_parameters(model)
    world.broadcast_optimizer_state(opt)
    # DDP around the plain model (checkpoints save and load that one: no `module.` keys),
    # compiled afterwards so that compile splits its graph at DDP's buckets
    dense = model.input_kind == "dense"  # before a DDP wrapper hides the attribute
    model = world.distributed_model(model, tc.grad_compression)
    if tc.compile and dense:
        model = torch.compile(model)
    t0 = time.time()
    train_loader = make_loader(cfg, store, mode, plan.train_indices(world.rank), world.device,
                               train=True, steps=plan.steps_per_epoch)
    eval_loader = make_loader(cfg, store, mode, plan.eval_indices(world.rank), world.device,
                              train=False)
    log.info("data ready in %.1f s: %d train / %d eval events on this rank, %d steps/epoch, "
             "%s loader", time.time() - t0, len(plan.train_indices(world.rank)),
             len(plan.eval_indices(world.rank)), plan.steps_per_epoch, mode)
    return Parts(cfg, world, run, plan, model, build_loss(cfg.model.loss), opt, train_loader,
                 eval_loader, process_start, autocast, scaler,
                 tb=open_tblog(tc.tensorboard, world.is_root, run,
                               resume["global_step"] if resume else 0),
                 progress=open_progress(cfg, world.is_root, plan.steps_per_epoch,
                                        process_start, resume["global_step"] if resume else 0))


def make_loader(cfg: Config, store: EventStore, mode: str, indices: np.ndarray,
                device: torch.device, *, train: bool, steps: int | None = None):
    """One rank's loader over ``indices`` (None for an empty evaluation shard)."""
    from lartpc.data.blosc_cache import BloscConfig
    from lartpc.data.loaders import build_loader

    if not train and len(indices) == 0:
        return None
    blosc = BloscConfig(codec=cfg.data.blosc_codec, clevel=cfg.data.blosc_clevel,
                        shuffle=cfg.data.blosc_shuffle)
    return build_loader(store, "dense" if mode == "blosc" else mode, indices,
                        cfg.train.batch_per_rank, device=device, seed=cfg.train.seed,
                        shuffle=train, steps_per_epoch=steps, prefetch_depth=cfg.data.prefetch,
                        blosc=blosc)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity masks
        return os.cpu_count() or 1


def set_threads(cfg: Config, world: World) -> int:
    """CPU threads per rank: the config's, or this process's cores shared by the node's ranks.

    The cores are the CPU mask the scheduler gave the process (a SLURM task's cgroup,
    a jsrun resource set), not the machine's count: under ``srun -c 8`` on a 64-core
    node a rank gets 8 threads, not 64.

    SCNet on CPU defaults to one thread: spconv's CPU kernels are many small parallel
    regions, and at full size a 2-thread step measured 6x slower than a 1-thread one
    (BENCHMARKS.md).
    """
    n = cfg.train.threads or max(1, usable_cores() // max(1, world.local_size))
    if not cfg.train.threads and cfg.model.name == "scnet" and world.device.type == "cpu":
        n = 1
    torch.set_num_threads(n)
    return n
