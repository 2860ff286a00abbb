"""The Horovod backend: Gloo (horovodrun) or MPI (mpirun, jsrun, srun --mpi)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import horovod.torch as hvd
import torch

from lartpc.dist.world import World, check_compression


@dataclass(frozen=True)
class HorovodWorld(World):
    """Ranks of a Horovod job; gradients are averaged by its DistributedOptimizer."""

    backend: ClassVar[str] = "horovod"

    def collectives(self) -> str:
        # GPU tensors go through NCCL when Horovod was built with it; the rest through
        # the controller's library (Gloo under horovodrun, MPI under srun/jsrun/mpirun)
        if self.device.type == "cuda" and hvd.nccl_built():
            return "nccl"
        return "gloo" if hvd.gloo_enabled() else "mpi"

    def allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(t, op=hvd.Sum)

    def allreduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce_(t, op=hvd.Sum)

    def allgather_object(self, obj) -> list:
        return hvd.allgather_object(obj, name="lartpc.allgather_object")

    def broadcast_object(self, obj, root: int = 0):
        # Horovod names the exchange after type(obj) unless told: ranks passing objects
        # of different types (a message on root, None elsewhere) would wait forever.
        return hvd.broadcast_object(obj, root_rank=root, name="lartpc.broadcast_object")

    def broadcast_parameters(self, module: torch.nn.Module, root: int = 0) -> None:
        hvd.broadcast_parameters(module.state_dict(), root_rank=root)

    def _broadcast_optimizer_state(self, opt: torch.optim.Optimizer, root: int) -> None:
        hvd.broadcast_optimizer_state(opt, root_rank=root)

    def _broadcast_tensor(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        return hvd.broadcast(t, root_rank=root)

    def distributed_optimizer(self, opt: torch.optim.Optimizer, module: torch.nn.Module,
                              compression: str = "none") -> torch.optim.Optimizer:
        """Horovod's DistributedOptimizer (averaging; ``fp16``: Compression.fp16)."""
        check_compression(compression)
        comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        return hvd.DistributedOptimizer(opt, named_parameters=module.named_parameters(),
                                        compression=comp, op=hvd.Average)

    def _finish_exchange(self, opt: torch.optim.Optimizer) -> float:
        """The wait in ``synchronize()`` for the allreduces still running after backward."""
        t0 = time.perf_counter()
        opt.synchronize()
        return time.perf_counter() - t0

    def _exchanged(self, opt: torch.optim.Optimizer):
        # the wrapper would exchange again inside step() without this
        return opt.skip_synchronize()

    def shutdown(self) -> None:
        hvd.shutdown()
