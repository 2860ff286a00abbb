"""What the trainer is built from: the model's speed options, mixed precision, the
batch path, one rank's loaders, and the threads per rank."""

from __future__ import annotations

import logging
import os
import socket
from contextlib import nullcontext

import numpy as np
import torch

from lartpc.config import Config
from lartpc.data.store import EventStore
from lartpc.dist import World
from lartpc.errors import ConfigError

log = logging.getLogger(__name__)


def model_options(cfg: Config, device_type: str) -> dict:
    """The configured model's constructor options (its own ``options`` method: speed
    options that never change what it computes, beyond rounding)."""
    from lartpc.models import model_class

    return model_class(cfg.model.name).options(cfg.model, cfg.train.amp, device_type)


def autocast_and_scaler(cfg: Config, device_type: str, cache: bool = True):
    """The forward pass's autocast context factory and the fp16 loss scaler (or None).

    SCNet runs its own float16 trunk (``half``), so it gets no outer autocast.
    ``cache=False``: autocast keeps no cache of its weight casts, as a CUDA graph's
    capture needs (``train.cuda_graph``); the casts, and so the numbers, are the same.
    """
    amp = cfg.train.amp
    scaler = torch.amp.GradScaler(device_type) if amp == "fp16" else None
    if amp == "none" or cfg.model.name == "scnet":
        return nullcontext, scaler
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return (lambda: torch.autocast(device_type, dtype=dtype, cache_enabled=cache)), scaler


def loader_mode(cfg: Config, model: torch.nn.Module) -> str:
    """The batch path: the config's, or the one the model's input needs."""
    if cfg.data.loader != "auto":
        return cfg.data.loader
    return "sparse" if model.input_kind == "sparse" else "blosc"


def rulebooks_choice(cfg: Config, mode: str) -> str:
    """``forward`` or ``loader`` for ``data.rulebooks`` with loader ``mode``: ``auto`` is
    the loader's thread for SCNet's torch layers (``model.sparse = torch``: their index
    tables, built with the GIL released) on the sparse loader without augmentation, and
    the forward otherwise (spconv's rulebook builders hold the GIL; BENCHMARKS.md)."""
    if cfg.data.rulebooks != "auto":
        return cfg.data.rulebooks
    serves = (cfg.model.name == "scnet" and cfg.model.sparse == "torch" and mode == "sparse"
              and cfg.data.augment == "none")
    return "loader" if serves else "forward"


def rulebook_builder(cfg: Config, model: torch.nn.Module | None, mode: str, *, train: bool):
    """What the sparse loader calls to build each batch's rulebooks (``data.rulebooks``
    resolving to ``loader``), for forwards in training mode or not; None where the model
    builds them (``forward``, or no model given)."""
    if rulebooks_choice(cfg, mode) == "forward" or model is None:
        return None
    if mode != "sparse" or not hasattr(model, "rulebook_builder"):
        raise ConfigError(f"data.rulebooks=loader builds spconv rulebooks in the sparse "
                          f"loader: it needs model.name=scnet and the sparse loader (here "
                          f"{cfg.model.name}, {mode})")
    if cfg.data.augment != "none":
        raise ConfigError(f"data.rulebooks=loader with data.augment={cfg.data.augment}: the "
                          "augmentation changes the coordinates after the loader built the "
                          "rulebooks; use data.rulebooks=forward")
    if cfg.data.table_cache:
        return model.rulebook_builder(training=train, cache=True)
    return model.rulebook_builder(training=train)


def make_loader(cfg: Config, store: EventStore, mode: str, indices: np.ndarray,
                device: torch.device, *, train: bool, steps: int | None = None,
                model: torch.nn.Module | None = None, capacities=None):
    """One rank's loader over ``indices`` (None for an empty evaluation shard); given the
    (unwrapped) ``model``, its rulebooks are built in the loader as ``data.rulebooks``
    says, and padded to ``capacities`` (:class:`~lartpc.train.padding.Capacities`, for
    ``train.cuda_graph``) when given."""
    from lartpc.data.blosc_cache import BloscConfig
    from lartpc.data.loaders import build_loader

    if not train and len(indices) == 0:
        return None
    blosc = BloscConfig(codec=cfg.data.blosc_codec, clevel=cfg.data.blosc_clevel,
                        shuffle=cfg.data.blosc_shuffle, compress_at=cfg.data.blosc_compress_at)
    rulebooks = rulebook_builder(cfg, model, mode, train=train)
    if rulebooks is not None and capacities is not None:
        rulebooks = capacities.padding(rulebooks)
    processes = cfg.data.loader_processes if train else 0
    if processes and processes >= usable_cores():
        log.warning("data.loader_processes = %d on %d usable cores: the processes and the "
                    "training share them (leave at least one core to the training)",
                    processes, usable_cores())
    return build_loader(store, mode, indices,
                        cfg.train.batch_per_rank, device=device, seed=cfg.train.seed,
                        shuffle=train, steps_per_epoch=steps, prefetch_depth=cfg.data.prefetch,
                        blosc=blosc, orient=cfg.data.orient, rulebooks=rulebooks,
                        prefetch_threads=cfg.data.prefetch_threads,
                        processes=processes)


def cpu_mask() -> list[int]:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity masks
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity mask where the OS has one)."""
    return len(cpu_mask())


def core_ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (as taskset and SLURM write masks)."""
    out: list[str] = []
    for c in cores:
        if out and c == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def bind_cores(world: World) -> dict:
    """Each rank on cores of its own, whatever the launcher; the record for run.json.

    srun with one task per rank (horovod, jsrun) hands each rank its own CPU mask;
    torchrun's ranks all inherit their srun task's mask, the node's share. Ranks of a
    host that find the same mask split it in equal slices by rank and bind themselves to
    theirs, so a rank has the same cores (and threads) under every launcher. Every rank
    takes part (one allgather).
    """
    mask = cpu_mask()
    host = socket.gethostname()
    peers = world.allgather_object((host, mask, world.rank))
    sharing = [r for h, m, r in peers if h == host and m == mask]
    record = {"launcher_mask": core_ranges(mask), "ranks_sharing_mask": len(sharing)}
    if len(sharing) > 1 and len(mask) >= len(sharing) and hasattr(os, "sched_setaffinity"):
        per = len(mask) // len(sharing)
        i = sharing.index(world.rank)
        own = mask[i * per:(i + 1) * per]
        os.sched_setaffinity(0, own)
        return {**record, "bound_by": "lartpc", "cores": core_ranges(own),
                "ranks_per_core_set": 1}
    whole = len(mask) >= (os.cpu_count() or len(mask))
    return {**record, "bound_by": "none" if whole else "launcher", "cores": core_ranges(mask),
            "ranks_per_core_set": len(sharing)}


def set_threads(cfg: Config, world: World, binding: dict | None = None) -> int:
    """CPU threads per rank: the config's, or this rank's cores.

    The cores are the CPU mask the scheduler gave the process (a SLURM task's cgroup,
    a jsrun resource set), not the machine's count: under ``srun -c 8`` on a 64-core
    node a rank gets 8 threads, not 64. ``binding`` (:func:`bind_cores`) says how many
    ranks still share the mask (none once bound); without it, the node's ranks.

    SCNet on CPU defaults to one thread: spconv's CPU kernels are many small parallel
    regions, and at full size a 2-thread step measured 6x slower than a 1-thread one
    (BENCHMARKS.md).
    """
    share = binding["ranks_per_core_set"] if binding else world.local_size
    n = cfg.train.threads or max(1, usable_cores() // max(1, share))
    if not cfg.train.threads and cfg.model.name == "scnet" and world.device.type == "cpu":
        n = 1
    torch.set_num_threads(n)
    return n
