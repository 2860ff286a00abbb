"""Distribution: the only package that imports ``horovod`` or ``torch.distributed``.

:func:`init` returns a :class:`World` for Horovod (:mod:`~lartpc.dist.horovod_world`),
torch.distributed (:mod:`~lartpc.dist.torch_world`) or one plain process
(:class:`LocalWorld`); the torch backend's DistributedDataParallel wrapper and its
communication hook are in :mod:`lartpc.dist.ddp`.
"""

from lartpc.dist.world import (
    BACKENDS,
    LocalWorld,
    World,
    detect_backend,
    device_type,
    init,
    unwrap_model,
)

__all__ = ["BACKENDS", "LocalWorld", "World", "detect_backend", "device_type", "init",
           "unwrap_model"]
