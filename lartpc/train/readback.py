"""A step's loss and accuracy, read back to the host one step later (issue 36).

Reading a CUDA scalar (``float(loss)``) waits for every kernel queued before it, so the
host could not start step k+1's Python while the GPU finished step k: with SCNet at
minibatch 7 the host is the bottleneck, and that wait was paid twice per step. Now
each step's two numbers are copied behind its kernels into pinned host memory (no
wait; an event marks their arrival) and read once the next step has been queued, when
they are long there. On the CPU the values are kept as a copy. The numbers themselves are
the same float32 values ``float()`` read; only when they are read changes. A graphed
step (:mod:`lartpc.train.graphed`) computes the pair inside its graph
(:func:`step_values`), so its step's thread launches none of these operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lartpc.dist.spans import DeviceSpan


class Unread:
    """One step's (loss, accuracy) on their way to the host, with the fields of its
    :class:`~lartpc.train.sinks.StepRecord` other than the ones the ranks agree on, and
    the gradient exchange's device time, not yet known."""

    __slots__ = ("values", "arrived", "fields", "spans")

    def __init__(self, values: torch.Tensor, fields: dict, spans: Sequence[DeviceSpan] = ()):
        """``values``: the step's (loss, accuracy), :func:`step_values`; copied here (a
        graph's buffer is overwritten by the next replay). ``spans``: the exchange's
        :class:`~lartpc.dist.spans.DeviceSpan` on a GPU (none elsewhere)."""
        self.spans = list(spans)
        self.arrived: torch.cuda.Event | None = None
        if values.is_cuda:
            self.values = torch.empty(2, dtype=torch.float32, pin_memory=True)
            self.values.copy_(values, non_blocking=True)
            self.arrived = torch.cuda.Event()
            self.arrived.record()
        else:
            self.values = values.clone()
        self.fields = fields

    def read(self) -> tuple[float, float]:
        """(local loss, local accuracy), waiting for the copy if it is still on its way."""
        if self.arrived is not None:
            self.arrived.synchronize()
        loss, acc = self.values.tolist()
        return loss, acc

    def settled(self) -> dict:
        """The record's fields, the exchange's device time (its spans, long passed once
        the step is read) moved from ``compute_s`` to ``comm_s``: the host did not wait
        for it, so the step's wall time holds it in its compute part (all of that part
        at most, so that data_s + compute_s + comm_s stays the step's wall time)."""
        if self.spans:
            f = self.fields
            moved = min(sum(span.seconds() for span in self.spans), max(f["compute_s"], 0.0))
            f["compute_s"] -= moved
            f["comm_s"] += moved
            self.spans = []
        return self.fields


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Share of correct predictions, a 0-d float32 tensor on the logits' device."""
    return (logits.detach().argmax(1) == labels).float().mean()


def step_values(loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor
                ) -> torch.Tensor:
    """A step's (loss, accuracy) as one float32 tensor of 2 on the loss's device."""
    return torch.stack([loss.detach().float().reshape(()), accuracy(logits, labels)])
