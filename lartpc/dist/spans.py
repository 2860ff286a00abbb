"""The gradient exchange's time on a GPU, without making the host wait for it.

On CUDA the step's kernels and the exchange's NCCL kernels are queued, not run, when
the host passes them: a host clock around the exchange times the queueing, unless the
host first waits for the device (a synchronisation every step, which keeps the host
from queueing the next step while the device finishes this one, where SCNet's host is
already the limit). A :class:`DeviceSpan` is two CUDA events on the step's stream
around the exchange instead: the device's own time between them, read when the step's
loss is read back (:class:`~lartpc.train.readback.Unread`), by which time both have
long passed.
"""

from __future__ import annotations

import torch


def mark() -> torch.cuda.Event:
    """A timing event recorded now on the current CUDA stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class DeviceSpan:
    """The device's seconds from ``start`` (an event from :func:`mark`) to the point
    in the current stream where the span is made."""

    __slots__ = ("start", "end")

    def __init__(self, start: torch.cuda.Event):
        self.start, self.end = start, mark()

    def seconds(self) -> float:
        """Waits for the end event (long past when the step's numbers are read)."""
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


#: an exchange's time as a backend gives it: the host's seconds, or a device span
Exchange = float | DeviceSpan
