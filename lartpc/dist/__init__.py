"""Distribution: the only package that imports ``horovod`` or ``torch.distributed``.

:func:`init` returns a :class:`World` over Horovod, torch.distributed or one plain
process (:mod:`lartpc.dist.world`); the torch.distributed gradient-averaging optimizer
is in :mod:`lartpc.dist.optim`.
"""

from lartpc.dist.world import BACKENDS, World, detect_backend, device_type, init

__all__ = ["BACKENDS", "World", "detect_backend", "device_type", "init"]
