"""Gradient averaging for the torch.distributed backend: DistributedDataParallel.

DDP packs gradients into buckets (``bucket_cap_mb``, 25 MiB, the first one 1 MiB) in
the order backward produces them and hands each bucket to allreduce as soon as it is
full, so the exchange overlaps the rest of the backward pass (Horovod's tensor fusion
does the same with its own buffer and cycle). Every bucket goes through one
communication hook, :func:`average_bucket`, which

* lets an observer see the rank's *local* gradients before they are averaged (the
  gradient noise meter's squared norm, ``train.noise_scale=ranks``);
* averages it in float32, or as float16 (``train.grad_compression=fp16``, DDP's
  ``fp16_compress_hook``, Horovod's ``Compression.fp16``);
* notes when the last bucket was handed over, for the exposed communication time (on
  CUDA as an event in the stream: :mod:`lartpc.dist.spans`).
"""

# no `from __future__ import annotations`: DDP checks the hook's annotation is the
# dist.GradBucket class itself, not its name
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lartpc.dist.spans import DeviceSpan, Exchange, mark


class BucketExchange:
    """State of the communication hook of one DDP model.

    Parameters
    ----------
    fp16 : send the buckets as float16.
    """

    def __init__(self, fp16: bool = False):
        self.fp16 = fp16
        #: called with each parameter and its local (not yet averaged) gradient in a
        #: bucket; set by the noise meter
        self.observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None
        #: the last bucket sent: a perf_counter, or on CUDA an event in the stream
        self.last_handoff: float | torch.cuda.Event | None = None
        self.buckets = 0  #: buckets sent since the model was wrapped

    def exposed(self) -> Exchange:
        """The time since the last bucket was handed to allreduce (0 before the first):
        seconds, or on CUDA the :class:`~lartpc.dist.spans.DeviceSpan` from the last
        bucket's gradients to here in the stream.

        Taken after backward, whose end waits (on CUDA: makes the stream wait) for
        every bucket's allreduce, it is the exchange that backward could not hide: the
        last bucket's allreduce and whatever earlier buckets were still in flight (and
        on CUDA the step's few kernels queued between backward and the optimizer, the
        loss's copy for the read-back among them).
        """
        start, self.last_handoff = self.last_handoff, None
        if start is None:
            return 0.0
        if isinstance(start, float):
            return time.perf_counter() - start
        return DeviceSpan(start)


def average_bucket(state: BucketExchange, bucket: dist.GradBucket
                   ) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: observe the local bucket, then average it over ranks."""
    if state.observer is not None:  # before the hooks below divide the bucket in place
        # parameter by parameter: DDP rebuilds its buckets after the first step of every
        # process, so a bucket's contents depend on where a resumed segment began
        for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
            state.observer(param, grad)
    state.buckets += 1
    if bucket.is_last():  # only the last hand-off is timed
        state.last_handoff = mark() if bucket.buffer().is_cuda else time.perf_counter()
    if state.fp16:
        return default_hooks.fp16_compress_hook(None, bucket)
    return default_hooks.allreduce_hook(None, bucket)


def wrap(module: torch.nn.Module, fp16: bool = False
         ) -> tuple[DistributedDataParallel, BucketExchange]:
    """``module`` in DDP with :func:`average_bucket` as its communication hook.

    Every parameter must get a gradient on every step (``find_unused_parameters=False``:
    no graph search per step); SCNet ties its no-site path to every parameter for that
    reason. Batches arrive on the rank's device already (``device_ids=None``: DDP moves
    no inputs). DDP's initial broadcast repeats the one the caller made after resuming
    (cheap, and ``init_sync`` needs torch 2.4); the models have no buffers, so nothing
    else is sent at a forward.
    """
    ddp = DistributedDataParallel(module, device_ids=None, find_unused_parameters=False)
    state = BucketExchange(fp16)
    ddp.register_comm_hook(state, average_bucket)
    return ddp, state

