"""A model's training step captured as one CUDA graph, against the same step run eagerly:
SCNet's with its layers in torch operations (``lartpc bench model --model scnet --sparse
torch --cuda-graph``, issue 36) and JishNet's (``--model jishnet --cuda-graph``).

The torch layers' step (forward, loss, backward, Adam) has no host synchronisation, so
with the batch's index tables padded to static sizes
(:func:`~lartpc.models.sparse_torch.pad_maps`) it can be captured once and replayed: the
host then launches one graph per step. This measures what that would give, against the
same step run eagerly on the same padded tables. The training loop's form
(``train.cuda_graph``, :mod:`lartpc.train.graphed`) leaves Adam outside the graph (its
learning rate follows the schedule) and copies each batch's tables into the captured
buffers.

:func:`measure_dense` does the same for JishNet (issue 35): its step has fixed shapes
and no read-back, so the whole of it replays as one graph; the eager step against the
replayed one tells how much of JishNet's measured step is the host launching kernels.
"""

from __future__ import annotations

import statistics

from lartpc.train.padding import round_up


def _captured(step, eager, warmup: int, params):
    """``step`` captured as a CUDA graph after ``eager`` warm-up steps on a side stream
    (as torch asks): the graph and what the captured ``step`` returned. The gradients of
    ``params`` are cleared just before the capture, so its backward writes them into
    the graph's own memory each replay; left from the warm-up, the graph would add each
    replay's gradients to theirs."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 3)):
            eager()
    torch.cuda.current_stream().wait_stream(side)
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def steps(loss_of, opt):
    """A training step (``loss_of()``, backward, ``opt``'s update) returning its loss,
    and the same step eagerly with the gradients cleared first."""

    def step():
        loss = loss_of()
        loss.backward()
        opt.step()
        return loss

    def eager():
        opt.zero_grad(set_to_none=True)
        step()

    return step, eager


def _per_step(fn, repeats: int) -> float:
    """Seconds a step of ``fn`` run ``repeats`` times back to back (host and device
    overlapping, as in training), median of three such runs."""
    import time

    import torch

    runs = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / repeats)
    return statistics.median(runs)


def _rates(eager, replay, images: int, repeats: int, got: float, want: float,
           rtol: float) -> dict:
    eager_s, graph_s = _per_step(eager, repeats), _per_step(replay, repeats)
    return {"steps_back_to_back": repeats,
            "eager_step_ms": round(eager_s * 1e3, 3), "graph_step_ms": round(graph_s * 1e3, 3),
            "eager_images_per_s": round(images / eager_s, 1),
            "graph_images_per_s": round(images / graph_s, 1),
            "graph_loss": got, "eager_loss": want,
            "graph_loss_matches_eager": abs(got - want) <= rtol * max(abs(want), 1.0)}


def measure(model, batch, loss_fn, repeats: int, warmup: int, multiple: int = 256) -> dict:
    """Eager and replayed step times of ``model`` (an SCNet with ``sparse='torch'`` on
    CUDA) on ``batch``, Adam in its capturable form: ms per step over ``repeats`` steps
    run back to back (host and device overlapping, as in training), medians of three
    such runs; whether the graph's loss equals an eager forward's; the padded sizes."""
    from lartpc.models import sparse_torch

    maps = model.rulebook_builder(training=True)(batch.coords, batch.data_size)
    unpadded = sparse_torch.sizes(maps)
    maps = sparse_torch.pad_maps(maps, [round_up(n, multiple) for n in unpadded])
    features = batch.features.clone()

    def forward():
        return model.forward_sparse(batch.coords, features, batch.data_size, maps)

    return {"sizes": list(unpadded), "padded_sizes": list(sparse_torch.sizes(maps)),
            **_graph_against_eager(model, forward, batch.labels.clone(), loss_fn, repeats,
                                   warmup, rtol=1e-5)}


def measure_dense(model, batch, loss_fn, autocast, repeats: int, warmup: int) -> dict:
    """The same for JishNet (``lartpc bench model --model jishnet --cuda-graph``): its
    training step (forward under ``autocast``, which must not cache its casts of the
    weights: ``cache_enabled=False``; loss, backward, capturable Adam) on a
    static copy of the batch's images, captured as one CUDA graph, against the same step
    run eagerly, both back to back: how much of the eager step is the host's. The fused
    stages' Triton kernels are captured as launched; their backward allocates from the
    graph's own pool."""
    x = batch.dense.clone()

    def forward():
        with autocast():
            return model.forward_tensor(x)

    # the same kernels on the same operands: equal but for a library's choice of
    # algorithm between the warm-up and the capture
    return _graph_against_eager(model, forward, batch.labels.clone(), loss_fn, repeats,
                                warmup, rtol=1e-3)


def _graph_against_eager(model, forward, labels, loss_fn, repeats: int, warmup: int,
                         rtol: float) -> dict:
    """The step ``forward``, loss, backward and a capturable Adam's update, captured as
    one CUDA graph after ``warmup`` eager steps; the graph's loss (one replay) against an
    eager forward's on the same parameters (within ``rtol``), then both ways' times."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-5, foreach=True, capturable=True)
    step, eager = steps(lambda: loss_fn(forward(), labels), opt)
    graph, captured_loss = _captured(step, eager, warmup, list(model.parameters()))
    with torch.no_grad():
        want = float(loss_fn(forward(), labels))
    graph.replay()
    torch.cuda.synchronize()
    return _rates(eager, graph.replay, len(labels), repeats,
                  float(captured_loss.detach()), want, rtol)
