"""Distribution: the only package that imports ``horovod`` or ``torch.distributed``.

:func:`init` returns a :class:`World` over Horovod, torch.distributed or one plain
process (:mod:`lartpc.dist.world`); the torch backend's DistributedDataParallel wrapper
and its communication hook are in :mod:`lartpc.dist.ddp`.
"""

from lartpc.dist.world import BACKENDS, World, detect_backend, device_type, init, unwrap_model

__all__ = ["BACKENDS", "World", "detect_backend", "device_type", "init", "unwrap_model"]
