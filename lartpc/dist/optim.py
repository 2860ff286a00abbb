"""Gradient averaging for the torch.distributed backend (Horovod's DistributedOptimizer
equivalent): one flat allreduce per step, optionally in float16."""

from __future__ import annotations

import torch
import torch.distributed as dist


class AveragingOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer; ``step()`` first averages every gradient over all ranks."""

    def __init__(self, inner: torch.optim.Optimizer, world_size: int, fp16: bool = False):
        # Share the inner optimizer's state so checkpoints and schedulers see one object.
        self.inner, self.world_size, self.fp16 = inner, world_size, fp16
        self.param_groups = inner.param_groups
        self.state = inner.state
        self.defaults = inner.defaults
        self._synced = False

    def synchronize(self) -> None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.fp16:
            flat = flat.to(torch.float16)
        dist.all_reduce(flat)
        flat = flat.to(grads[0].dtype) / self.world_size
        pos = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[pos:pos + n].view_as(g))
            pos += n
        self._synced = True

    def step(self, closure=None):
        if not self._synced:
            self.synchronize()
        self._synced = False
        return self.inner.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # a step skipped (fp16 loss scaling found inf) leaves _synced set: clear it here
        self._synced = False
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.inner.load_state_dict(state_dict)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state
