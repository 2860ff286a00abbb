"""The torch.distributed backend: gloo on CPU, nccl on CUDA, DistributedDataParallel."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as tdist

from lartpc.dist.spans import DeviceSpan, Exchange, mark
from lartpc.dist.world import World, check_compression


@dataclass(frozen=True)
class TorchWorld(World):
    """Ranks of a torch.distributed process group (torchrun, or plain srun)."""

    backend: ClassVar[str] = "torch"
    #: the DDP model's :class:`~lartpc.dist.ddp.BucketExchange`, once
    #: :meth:`distributed_model` made it; a list so the frozen world can hold it
    _exchange: list = field(default_factory=list, repr=False, compare=False)

    def collectives(self) -> str:
        return str(tdist.get_backend())

    def allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        tdist.all_reduce(out)
        return out

    def allreduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        tdist.all_reduce(t)
        return t

    def allgather_object(self, obj) -> list:
        out = [None] * self.size
        tdist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, root: int = 0):
        box = [obj]
        tdist.broadcast_object_list(box, src=root)
        return box[0]

    def broadcast_parameters(self, module: torch.nn.Module, root: int = 0) -> None:
        for t in module.state_dict().values():
            tdist.broadcast(t, src=root)

    def _broadcast_optimizer_state(self, opt: torch.optim.Optimizer, root: int) -> None:
        # sent as CPU tensors: a pickled CUDA tensor comes back on the root's device
        # index (cuda:0) on every rank, a context and a copy on another rank's GPU;
        # load_state_dict moves the state to each parameter's own device
        box = [_on_cpu(opt.state_dict()) if self.rank == root else None]
        tdist.broadcast_object_list(box, src=root)
        opt.load_state_dict(box[0])

    def _broadcast_tensor(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        tdist.broadcast(t, src=root)
        return t

    def distributed_model(self, module: torch.nn.Module, compression: str = "none"
                          ) -> torch.nn.Module:
        """``module`` in DistributedDataParallel: gradients averaged in buckets during
        backward (see :mod:`lartpc.dist.ddp`). Its ``state_dict`` gains a ``module.``
        prefix: save and load :func:`~lartpc.dist.world.unwrap_model` of it."""
        check_compression(compression)
        from lartpc.dist.ddp import wrap

        model, exchange = wrap(module, fp16=compression == "fp16")
        self._exchange[:] = [exchange]
        return model

    def average_gradients(self, grads: list[torch.Tensor], compression: str = "none"
                          ) -> Exchange:
        """In one flat buffer, divided by the ranks and then summed, in float32 or sent
        as float16: the arithmetic of DDP's bucket hooks (:mod:`lartpc.dist.ddp`), so
        an element's average is the same number either way. Returns the exchange's
        time alone: on the CPU its seconds; on CUDA a :class:`DeviceSpan` from behind
        the step's queued kernels (a graph's replay is asynchronous) to the averaged
        gradients, so that neither their time nor a wait for them is booked as the
        exchange's, and the host goes on without waiting."""
        if self.size == 1 or not grads:
            return 0.0
        cuda = self.device.type == "cuda"
        start, t0 = (mark() if cuda else None), time.perf_counter()
        flat = torch.cat([g.reshape(-1) for g in grads])
        sent = flat.to(torch.float16) if compression == "fp16" else flat
        sent.div_(self.size)
        tdist.all_reduce(sent)
        views = sent.split([g.numel() for g in grads])
        torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(views, grads, strict=True)])
        return DeviceSpan(start) if start is not None else time.perf_counter() - t0

    def watch_local_gradients(self, observer) -> bool:
        if not self._exchange:
            return False
        self._exchange[0].observer = observer
        return True

    def no_sync(self, model: torch.nn.Module):
        if self._exchange and hasattr(model, "no_sync"):
            return model.no_sync()
        return super().no_sync(model)

    def _finish_exchange(self, opt: torch.optim.Optimizer) -> Exchange:
        """Backward itself waited for the buckets; the time from the last bucket's
        hand-off to here: on CUDA the device's, from the last bucket's gradients to
        the end of its allreduce (no host wait)."""
        if not self._exchange:
            return 0.0
        return self._exchange[0].exposed()

    def shutdown(self) -> None:
        # The DDP model, its reducer and the bucket hook must go while the process group
        # is alive: destroyed at interpreter exit instead, Gloo's threads could still
        # hold their work and the process aborted ("terminate called without an active
        # exception") after a completed run.
        self._exchange.clear()
        gc.collect()
        if tdist.is_initialized():
            tdist.destroy_process_group()


def _on_cpu(obj):
    """``obj`` (an optimizer's state dict: dicts, lists, tensors) with its tensors on
    the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj
