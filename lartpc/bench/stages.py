"""Where a JishNet step goes: ``lartpc bench model --stages`` and ``--max-batch``.

``stage_times`` times each stage (conv, ELU, max-pool; the first and second as
``model.stem`` and ``model.stage2`` choose) and the head with its loss alone, forward
and forward+backward, on the inputs the stage sees in the real network (the batch
passed through the stages before it), under the same autocast and memory layout. A
stage after the first computes its input's gradient, as inside the network; the first
does not (its input is the event image). The sum of the stages is close to the whole
step but not equal: the step also runs the optimizer-free bookkeeping of autograd
across stages.

``top_kernels`` lists what a stage's forward+backward runs, heaviest first: on a GPU its
device kernels (torch.profiler; where cuDNN fell back to a generic engine or converted a
layout, its kernels say so), on a CPU its torch operations.

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
            name += f" ({model.stem}{', empty blocks skipped' * model.stem_skip_empty})"
        elif k == 1:
            name += f" ({model.stage2})"
        rows.append({"stage": name, "input": list(x_in.shape), "output": list(grad.shape),
                     "dtype": str(grad.dtype).replace("torch.", ""),
                     "forward_ms": median_ms(forward, repeats, sync, warmup),
                     "forward_backward_ms": median_ms(forward_backward, repeats, sync,
                                                      warmup),
                     "top_kernels": top_kernels(forward_backward, x_in.device.type)})
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


#: calls of a stage profiled by :func:`top_kernels`, and the kernels listed
PROFILED_CALLS, TOP_KERNELS = 3, 8


def top_kernels(fn: Callable[[], object], device_type: str, calls: int = PROFILED_CALLS,
                top: int = TOP_KERNELS) -> list[dict]:
    """The ``top`` heaviest device kernels (CUDA) or torch operations (CPU, self time) of
    ``calls`` calls of ``fn`` (after one untimed): name, launches and milliseconds per
    call, largest first. A profiler that cannot run here (CUPTI missing, say) gives one
    row with its ``error`` instead; the stage's timings stand without it."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device_type == "cuda"
    fn()
    try:
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) \
                as prof:
            for _ in range(calls):
                fn()
            if cuda:
                torch.cuda.synchronize()
    except RuntimeError as e:
        return [{"error": f"torch.profiler: {str(e).splitlines()[0]}"}]

    def busy(e) -> float:  # microseconds over the calls
        return (getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
                ) if cuda else e.self_cpu_time_total

    rows = sorted((e for e in prof.key_averages() if busy(e) > 0), key=busy, reverse=True)
    return [{"name": e.key[:120], "calls": round(e.count / calls, 2),
             "ms": round(busy(e) / calls / 1e3, 4)} for e in rows[:top]]


def max_batch(train_step_at: Callable[[int], None], start: int) -> tuple[int, int, str]:
    """The largest minibatch ``b`` for which ``train_step_at(b)`` runs, the peak memory
    it took, and what stopped the search: the error of the smallest size that failed (a
    CUDA out-of-memory error, or any other a size can raise: a library's missing kernel
    for it, an index past 2**31), or the search's cap. ``start`` must fit."""
    failed: dict[int, str] = {}

    def fits(b: int) -> int | None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            train_step_at(b)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            failed[b] = "out of memory"
            return None
        except RuntimeError as e:  # the search goes on below it; the JSON says why
            failed[b] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            return None
        finally:
            torch.cuda.empty_cache()
        return torch.cuda.max_memory_allocated()

    largest, peak, failing = _largest(fits, start)
    why = (f"minibatch {failing}: {failed[failing]}" if failing is not None
           else f"the search's cap of {MAX_BATCH_CAP}")
    return largest, peak, why


def _largest(fits: Callable[[int], int | None], start: int) -> tuple[int, int, int | None]:
    """Doubling, then bisection: the largest size ``fits`` takes (its peak), and the
    smallest it was seen to refuse (None: none up to the cap)."""
    peak = fits(start)
    if peak is None:
        return 0, 0, start
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
    return lo, peak, hi
