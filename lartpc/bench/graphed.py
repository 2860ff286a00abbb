"""SCNet's training step with its layers in torch operations, captured as one CUDA graph
(``lartpc bench model --model scnet --sparse torch --cuda-graph``, issue 36).

The torch layers' step (forward, loss, backward, Adam) has no host synchronisation, so
with the batch's index tables padded to static sizes
(:func:`~lartpc.models.sparse_torch.pad_maps`) it can be captured once and replayed: the
host then launches one graph per step. This measures what that would give, against the
same step run eagerly on the same padded tables. The training loop's form
(``train.cuda_graph``, :mod:`lartpc.train.graphed`) leaves Adam outside the graph (its
learning rate follows the schedule) and copies each batch's tables into the captured
buffers.
"""

from __future__ import annotations

import statistics

from lartpc.train.graphed import round_up


def measure(model, batch, loss_fn, repeats: int, warmup: int, multiple: int = 256) -> dict:
    """Eager and replayed step times of ``model`` (an SCNet with ``sparse='torch'`` on
    CUDA) on ``batch``, Adam in its capturable form: ms per step over ``repeats`` steps
    run back to back (host and device overlapping, as in training), medians of three
    such runs; whether the graph's loss equals an eager forward's; the padded sizes."""
    import time

    import torch

    from lartpc.models import sparse_torch

    maps = model.rulebook_builder(training=True)(batch.coords, batch.data_size)
    unpadded = sparse_torch.sizes(maps)
    maps = sparse_torch.pad_maps(maps, [round_up(n, multiple) for n in unpadded])
    opt = torch.optim.Adam(model.parameters(), lr=1e-5, foreach=True, capturable=True)
    features, labels = batch.features.clone(), batch.labels.clone()

    def step():
        loss = loss_fn(model.forward_sparse(batch.coords, features, batch.data_size, maps),
                       labels)
        loss.backward()
        opt.step()
        return loss

    def eager():
        opt.zero_grad(set_to_none=True)
        step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch asks
        for _ in range(max(warmup, 3)):
            eager()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        captured_loss = step()
    with torch.no_grad():
        want = float(loss_fn(model.forward_sparse(batch.coords, features, batch.data_size,
                                                  maps), labels))
    graph.replay()
    torch.cuda.synchronize()
    got = float(captured_loss.detach())

    def per_step(fn) -> float:
        runs = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t0) / repeats)
        return statistics.median(runs)

    eager_s, graph_s = per_step(eager), per_step(graph.replay)
    return {"sizes": list(unpadded), "padded_sizes": list(sparse_torch.sizes(maps)),
            "steps_back_to_back": repeats,
            "eager_step_ms": round(eager_s * 1e3, 3), "graph_step_ms": round(graph_s * 1e3, 3),
            "eager_images_per_s": round(len(batch.labels) / eager_s, 1),
            "graph_images_per_s": round(len(batch.labels) / graph_s, 1),
            "graph_loss": got, "eager_loss": want,
            "graph_loss_matches_eager": abs(got - want) <= 1e-5 * max(abs(want), 1.0)}
