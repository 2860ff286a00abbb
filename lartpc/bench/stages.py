"""Where a JishNet step goes: ``lartpc bench model --stages`` and ``--max-batch``.

``stage_times`` times each stage (conv, ELU, max-pool; the first and second as
``model.stem`` and ``model.stage2`` choose) and the head with its loss alone, forward
and forward+backward, on the inputs the stage sees in the real network (the batch
passed through the stages before it), under the same autocast and memory layout. A
stage after the first computes its input's gradient, as inside the network; the first
does not (its input is the event image). The sum of the stages is close to the whole
step but not equal: the step also runs the optimizer-free bookkeeping of autograd
across stages.

``max_batch`` finds the largest minibatch whose forward+backward fits on the GPU, by
doubling and then bisection, with the measured events repeated to fill the batch (the
dense network's memory does not depend on the pixels).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

#: never try a minibatch above this (the search stops there)
MAX_BATCH_CAP = 4096


def timed(fn: Callable[[], object], repeats: int, sync) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of each of ``repeats`` calls of ``fn``; ``sync``
    waits for the device before each clock read."""
    import time

    wall, cpu = [], []
    for _ in range(repeats):
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def median_ms(fn: Callable[[], object], repeats: int, sync, warmup: int = 1) -> float:
    """Median wall-clock milliseconds of ``repeats`` calls of ``fn`` after ``warmup``
    untimed ones."""
    for _ in range(warmup):
        fn()
    return round(statistics.median(timed(fn, repeats, sync)[0]) * 1e3, 3)


def stage_times(model, dense: torch.Tensor, labels: torch.Tensor, loss_fn, autocast,
                repeats: int, warmup: int, sync) -> list[dict]:
    """Per stage of JishNet ``model``: input and output shape, forward and
    forward+backward milliseconds (medians of ``repeats``).

    ``autocast`` is a zero-argument callable returning the autocast context of the step.
    """
    x = dense.contiguous(memory_format=torch.channels_last) if model.channels_last else dense
    inputs = []
    with torch.no_grad(), autocast():
        for k in range(len(model.convs)):
            inputs.append(x)
            x = model.stage(k, x)
    rows = []
    for k, x_in in enumerate(inputs):
        x_in = x_in.detach().requires_grad_(k > 0)
        with torch.no_grad(), autocast():
            grad = torch.randn_like(model.stage(k, x_in))

        def forward(k=k, x_in=x_in):
            with torch.no_grad(), autocast():
                model.stage(k, x_in)

        def forward_backward(k=k, x_in=x_in, grad=grad):
            model.zero_grad(set_to_none=True)
            x_in.grad = None
            with autocast():
                out = model.stage(k, x_in)
            out.backward(grad)

        conv = model.convs[k]
        name = f"conv{k + 1} {conv.in_channels}->{conv.out_channels} " \
               f"{conv.kernel_size[0]}x{conv.kernel_size[1]} + ELU + pool {model.pools[k]}"
        if k == 0:
            name += f" ({model.stem})"
        elif k == 1:
            name += f" ({model.stage2})"
        rows.append({"stage": name, "input": list(x_in.shape), "output": list(grad.shape),
                     "dtype": str(grad.dtype).replace("torch.", ""),
                     "forward_ms": median_ms(forward, repeats, sync, warmup),
                     "forward_backward_ms": median_ms(forward_backward, repeats, sync,
                                                      warmup)})
    head_in = x.detach().requires_grad_(True)

    def head_forward():
        with torch.no_grad(), autocast():
            loss_fn(model.head(head_in), labels)

    def head_forward_backward():
        model.zero_grad(set_to_none=True)
        head_in.grad = None
        with autocast():
            loss = loss_fn(model.head(head_in), labels)
        loss.backward()

    rows.append({"stage": "head + loss", "input": list(head_in.shape), "output": [],
                 "forward_ms": median_ms(head_forward, repeats, sync, warmup),
                 "forward_backward_ms": median_ms(head_forward_backward, repeats, sync,
                                                  warmup)})
    return rows


def max_batch(train_step_at: Callable[[int], None], start: int) -> tuple[int, int]:
    """The largest minibatch ``b`` for which ``train_step_at(b)`` runs without a CUDA
    out-of-memory error, and the peak memory it took; ``start`` must fit."""

    def fits(b: int) -> int | None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            train_step_at(b)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            return None
        finally:
            torch.cuda.empty_cache()
        return torch.cuda.max_memory_allocated()

    peak = fits(start)
    if peak is None:
        return 0, 0
    lo, hi = start, None
    while hi is None and lo < MAX_BATCH_CAP:
        b = min(2 * lo, MAX_BATCH_CAP)
        p = fits(b)
        if p is None:
            hi = b
        else:
            lo, peak = b, p
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        p = fits(mid)
        if p is None:
            hi = mid
        else:
            lo, peak = mid, p
    return lo, peak
