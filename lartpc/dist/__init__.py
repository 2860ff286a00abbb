"""Distribution: the only package that imports ``horovod`` or ``torch.distributed``.

:func:`init` returns a :class:`World` for Horovod (:mod:`~lartpc.dist.horovod_world`),
torch.distributed (:mod:`~lartpc.dist.torch_world`) or one plain process
(:class:`LocalWorld`); the torch backend's DistributedDataParallel wrapper and its
communication hook are in :mod:`lartpc.dist.ddp`.

The backend and compression names are declared here, torch-free, so that config (which
assembles every setting's allowed values) imports them without importing torch; the rest
is imported from :mod:`~lartpc.dist.world` when first used.
"""

from __future__ import annotations

import importlib

BACKENDS = ("auto", "horovod", "torch", "none")  #: dist.backend
COMPRESSIONS = ("none", "fp16")  #: train.grad_compression: gradients as sent

_FROM_WORLD = ("LocalWorld", "World", "check_compression", "detect_backend", "device_type",
               "init", "unwrap_model")
__all__ = ["BACKENDS", "COMPRESSIONS", *_FROM_WORLD]


def __getattr__(name: str):
    if name in _FROM_WORLD:
        return getattr(importlib.import_module("lartpc.dist.world"), name)
    raise AttributeError(f"module 'lartpc.dist' has no attribute {name!r}")
