"""SCNet's padded tables built with no read-back at static shapes
(:mod:`lartpc.models.table_graph`, the form a CUDA graph replays) are ``build_maps``'
padded tables, integer for integer: coordinates in the loaders' order or shuffled,
capacities with room or exactly full, sites a pool drops, batches that do not fit or
whose pools leave no site (then ``build_maps`` builds them as before), one graph object
serving several batches without one batch's tables overwriting another's. Eagerly on
CPU (``TABLES = "graph"``); the CUDA tests capture and replay the graph."""

from __future__ import annotations

import pytest
import torch
from table_checks import batch_coords

from lartpc.models import sparse_torch, table_graph
from lartpc.models.scnet import KERNEL, POOLS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _coords(data, first: int, n: int) -> tuple[torch.Tensor, tuple[int, int]]:
    return batch_coords(data, first, n, DEVICE)


def _torch(coords, shape, rows=None, n=7):
    return sparse_torch.build_maps(coords, n, shape, KERNEL, POOLS, rows=rows, tables="torch")


def _graph(coords, shape, rows, n=7):
    return sparse_torch.build_maps(coords, n, shape, KERNEL, POOLS, rows=rows, tables="graph")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(table_graph, "FAILED", set())
    monkeypatch.setattr(table_graph, "WORKED", set())
    monkeypatch.setattr(table_graph, "POOL", table_graph._Pool())


def _spy(monkeypatch) -> list:
    """Calls of :func:`table_graph.static_tables` (each a build by the graph's way)."""
    calls, real = [], table_graph.static_tables
    monkeypatch.setattr(table_graph, "static_tables",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_static_tables_are_build_maps_padded_tables(monkeypatch, train_events_dir):
    coords, shape = _coords(train_events_dir, 0, 7)
    plain = _torch(coords, shape)
    have = sparse_torch.sizes(plain)
    shuffled = coords[torch.randperm(len(coords), generator=torch.Generator().manual_seed(3))
                      .to(coords.device)]
    calls = _spy(monkeypatch)
    for rows in ([n + 37 for n in have], list(have), [n + (i % 2) for i, n in enumerate(have)]):
        for c in (coords, shuffled):
            got = _graph(c, shape, tuple(rows))
            want = _torch(c, shape, tuple(rows))
            assert got.unpadded == have and sparse_torch.sizes(got) == tuple(rows)
            assert table_graph.same(got, want) and got.indices is c
    assert len(calls) == 6
    assert not torch.equal(_graph(shuffled, shape, tuple(have)).order,
                           torch.arange(len(coords), device=coords.device))


def test_sites_a_pool_drops(monkeypatch, train_events_dir):
    """An image side the pools do not divide: sites in its last rows are dropped (their
    slot the dropped row, the capacity once padded)."""
    coords, shape = _coords(train_events_dir, 0, 7)
    shape = (shape[0] + 3, shape[1] + 2)
    extra = torch.tensor([[0, shape[0] - 1, x] for x in range(10, 15)], dtype=coords.dtype)
    coords = torch.cat([coords, extra.to(coords.device)])
    plain = _torch(coords, shape)
    assert any(bool((lv.slots == lv.n_out).any()) for lv in plain.levels)
    rows = tuple(n + 5 for n in sparse_torch.sizes(plain))
    calls = _spy(monkeypatch)
    assert table_graph.same(_graph(coords, shape, rows), _torch(coords, shape, rows))
    assert calls == [1]


def test_batches_that_do_not_fit_or_lose_every_site(monkeypatch, train_events_dir):
    """Rows one short at the first level (the buffer), at a later level (the count read
    back after the build) and a batch whose pools leave no site: ``build_maps``' own
    tables (unpadded), after the graph's way tried where it could."""
    coords, shape = _coords(train_events_dir, 0, 7)
    plain = _torch(coords, shape)
    have = sparse_torch.sizes(plain)
    calls = _spy(monkeypatch)
    for short, tried in ((0, 0), (2, 1), (len(have) - 1, 1)):
        rows = tuple(n - (i == short) for i, n in enumerate(have))
        before = len(calls)
        got = _graph(coords, shape, rows)
        assert len(calls) - before == tried
        assert got.unpadded is None and table_graph.same(got, plain)
    odd = (shape[0] + 4, shape[1] + 4)  # the first pool leaves out the last 4 rows
    lone = torch.tensor([[0, odd[0] - 1, odd[1] - 1]], dtype=coords.dtype,
                        device=coords.device)
    before = len(calls)
    none = _graph(lone, odd, (32,) * len(have), n=1)
    assert len(calls) - before == 1
    assert sparse_torch.sizes(none) == sparse_torch.sizes(_torch(lone, odd, n=1))
    assert none.unpadded is None


def test_one_graph_serves_batches_without_overwriting_them(monkeypatch, train_events_dir):
    """Two batches through the same graph object: each batch's tables are its own (the
    graph's output buffers are copied), the first unchanged by the second's build."""
    a, shape = _coords(train_events_dir, 0, 7)
    b, _ = _coords(train_events_dir, 7, 7)
    rows = tuple(max(x, y) + 40 for x, y in zip(sparse_torch.sizes(_torch(a, shape)),
                                                sparse_torch.sizes(_torch(b, shape)),
                                                strict=True))
    first = _graph(a, shape, rows)
    views = [first.order, first.dense_index, *(t for lv in first.levels for t in (
        lv.keys, lv.neighbours, lv.slots, lv.mirrored) if t is not None)]
    held = {t.untyped_storage().data_ptr() for t in first.tensors()[1:]}
    assert len(held) == 2 and {t.untyped_storage().data_ptr() for t in views} == held
    snapshot = [t.clone() for t in first.tensors()[1:]]
    second = _graph(b, shape, rows)
    assert len(table_graph.POOL.free[str(a.device)]) == 1  # one graph object for both
    assert all(torch.equal(s, t) for s, t in zip(snapshot, first.tensors()[1:], strict=True))
    assert table_graph.same(first, _torch(a, shape, rows))
    assert table_graph.same(second, _torch(b, shape, rows))
    grown = tuple(r + 32 for r in rows)  # new capacities: a new graph replaces the old
    assert table_graph.same(_graph(a, shape, grown), _torch(a, shape, grown))
    assert [g.plan.rows for g in table_graph.POOL.free[str(a.device)]] == [grown]


def test_auto_uses_the_graph_on_cuda_only(monkeypatch, train_events_dir):
    coords, shape = _coords(train_events_dir, 0, 7)
    rows = tuple(n + 8 for n in sparse_torch.sizes(_torch(coords, shape)))
    calls = _spy(monkeypatch)
    monkeypatch.setattr(sparse_torch, "TABLES", "auto")
    got = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, rows=rows)
    assert table_graph.same(got, _torch(coords, shape, rows))
    assert bool(calls) == (coords.device.type == "cuda")
    unpadded = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS)
    assert table_graph.same(unpadded, _torch(coords, shape))
    assert len(calls) <= 1  # never for tables without capacities


def test_a_first_build_that_differs_is_refused_once(monkeypatch, train_events_dir, caplog):
    """``auto``'s first use on a device compares the graph's tables with ``build_maps``':
    a difference (here a stand-in that shifts a neighbour) is a warning, the tables come
    from ``build_maps``, and the graph is not tried there again."""
    coords, shape = _coords(train_events_dir, 0, 7)
    rows = tuple(n + 8 for n in sparse_torch.sizes(_torch(coords, shape)))
    real = table_graph.static_tables
    calls = []

    def off_by_one(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        out["neighbours1"][0, 0] += 1
        return out

    monkeypatch.setattr(table_graph, "static_tables", off_by_one)
    monkeypatch.setattr(sparse_torch, "_graph_tables",  # auto as on CUDA, on any device
                        lambda device, tables: tables == "auto"
                        and str(device) not in table_graph.FAILED)
    want = _torch(coords, shape, rows)
    with caplog.at_level("WARNING", logger="lartpc.models.table_graph"):
        for _ in range(2):
            got = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, rows=rows,
                                          tables="auto")
            assert table_graph.same(got, want)
    assert len(calls) == 1 and table_graph.FAILED == {str(coords.device)}
    assert "differ from build_maps" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_graph_is_captured_and_replayed_on_cuda(full_res_events_dir):
    """3600 x 3600, batches of 7: captured once, replayed per batch on a loader-like
    stream, every batch's tables ``build_maps``' own."""
    batches = [_coords(full_res_events_dir, first, 5) for first in (0, 5)]
    shape = batches[0][1]
    rows = tuple(max(ns) + 64 for ns in zip(*(sparse_torch.sizes(_torch(c, shape, n=5))
                                            for c, _ in batches), strict=True))
    stream = torch.cuda.Stream(priority=-1)
    with torch.cuda.stream(stream):
        got = [sparse_torch.build_maps(c, 5, shape, KERNEL, POOLS, rows=rows, tables="auto")
               for c, _ in batches * 2]
    torch.cuda.synchronize()
    [graph] = table_graph.POOL.free[str(batches[0][0].device)]
    assert graph.graph is not None and graph.replays == 4
    for maps, (c, _) in zip(got, batches * 2, strict=True):
        assert table_graph.same(maps, _torch(c, shape, rows, n=5))
    assert table_graph.WORKED == {str(batches[0][0].device)} and not table_graph.FAILED


def test_a_graph_that_fails_falls_back_under_auto_and_raises_when_asked(monkeypatch,
                                                                        train_events_dir,
                                                                        caplog):
    """A capture that raises (here a stand-in): under ``auto`` a warning and
    ``build_maps``' tables, the graph not tried there again; asked for by name
    (``graph``), the error."""
    coords, shape = _coords(train_events_dir, 0, 7)
    rows = tuple(n + 8 for n in sparse_torch.sizes(_torch(coords, shape)))

    def broken(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(table_graph, "static_tables", broken)
    with pytest.raises(RuntimeError, match="stream is capturing"):
        _graph(coords, shape, rows)
    monkeypatch.setattr(sparse_torch, "_graph_tables",  # auto as on CUDA, on any device
                        lambda device, tables: tables == "auto"
                        and str(device) not in table_graph.FAILED)
    with caplog.at_level("WARNING", logger="lartpc.models.table_graph"):
        got = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, rows=rows,
                                      tables="auto")
    assert table_graph.same(got, _torch(coords, shape, rows))
    assert table_graph.FAILED == {str(coords.device)} and "stream is capturing" in caplog.text


def test_threads_share_the_pooled_graphs(monkeypatch, train_events_dir):
    """A loader's prefetch threads are new each epoch: a new thread takes the graph an
    earlier one gave back (no new capture); two holding one each at the same time make
    two."""
    import threading

    coords, shape = _coords(train_events_dir, 0, 7)
    rows = tuple(n + 8 for n in sparse_torch.sizes(_torch(coords, shape)))
    made, real = [], table_graph.TableGraph.__init__
    monkeypatch.setattr(table_graph.TableGraph, "__init__",
                        lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    got: list = []
    for _ in range(2):  # one epoch's thread after another's
        t = threading.Thread(target=lambda: got.append(_graph(coords, shape, rows)))
        t.start()
        t.join()
    assert len(made) == 1 and len(got) == 2
    held = table_graph.POOL.take(table_graph.Plan(7, shape, KERNEL, POOLS, rows),
                                 coords.device)
    assert _graph(coords, shape, rows) is not None and len(made) == 2  # one was taken
    table_graph.POOL.give_back(held, coords.device)
    assert len(table_graph.POOL.free[str(coords.device)]) == 2
    assert all(table_graph.same(g, _torch(coords, shape, rows)) for g in got)


@pytest.mark.sparse
def test_a_graphed_training_with_the_graphs_tables_is_the_same_training(
        monkeypatch, world, train_events_dir, tmp_path):
    """Two epochs through the loop with ``train.cuda_graph`` (tables padded in the
    loader's thread): built by the graph's way, the same losses and parameters, bit for
    bit, as built by torch operations.

    Both runs start from the padded sizes a first run ended with (as a resumed run
    does), so that every batch the loader's thread builds is padded: how many batches
    it builds before the first step sets the sizes depends on the threads' timing."""
    from test_step_overlap import _fit, _same

    from lartpc.train import graphed

    sets = ("model.sparse=torch", "data.rulebooks=loader", "train.cuda_graph=true")
    real, made, rows = graphed.from_config, [], []

    def preset(*a, **k):
        step = real(*a, **k)
        if rows:
            step.caps.rows = rows[0]
        made.append(step)
        return step

    monkeypatch.setattr(graphed, "from_config", preset)
    monkeypatch.setattr(sparse_torch, "TABLES", "torch")
    _fit(world, train_events_dir, tmp_path / "sizing", "tiny-scnet", *sets)
    rows.append(made[-1].caps.rows)
    want = _fit(world, train_events_dir, tmp_path / "torch", "tiny-scnet", *sets)
    assert made[-1].caps.rows == rows[0]  # no batch outgrew them
    builds = _spy_padding(monkeypatch)
    calls = _spy(monkeypatch)
    monkeypatch.setattr(sparse_torch, "TABLES", "graph")
    stats: dict = {}
    got = _fit(world, train_events_dir, tmp_path / "graph", "tiny-scnet", *sets,
               graph_stats=stats)
    # 2 epochs of 8 batches (the last one short), every one padded, by the graph's way
    assert stats["steps"] == 14 and builds == [rows[0]] * 16 and len(calls) == 16
    _same(want, got)


def _spy_padding(monkeypatch) -> list:
    """The capacities each table build in the loader's thread was padded to."""
    from lartpc.train import padding

    builds, real = [], padding.Padding.__call__

    def call(self, coords, batch_size):
        builds.append(self.capacities.rows)
        return real(self, coords, batch_size)

    monkeypatch.setattr(padding.Padding, "__call__", call)
    return builds


def test_a_replayed_batch_is_a_handful_of_launches(train_events_dir):
    """What the loader's thread launches per batch around a replay (the replay stood in
    by a call that does nothing, as no CPU can replay): the coordinates in, two copies
    of the outputs, the counts' read-back; against ~130 for ``build_maps`` in one pass.
    Counted as ``host_profile`` counts a step's launches (aten calls that compute)."""
    from lartpc.jobs.local.host_profile import main_thread_work
    from torch.profiler import ProfilerActivity, profile

    coords, shape = _coords(train_events_dir, 0, 7)
    rows = tuple(n + 8 for n in sparse_torch.sizes(_torch(coords, shape)))
    graph = table_graph.TableGraph(table_graph.Plan(7, shape, KERNEL, POOLS, rows),
                                   coords.device, capture=False)
    want = graph(coords, shape, True)  # the outputs the stand-in "replays" leave

    class Replay:
        def replay(self):
            pass

    graph.graph = Replay()

    def launches(build) -> float:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                build()
        return main_thread_work(prof.events(), 3)[1]

    replayed = launches(lambda: graph(coords, shape, True))
    assert replayed <= 8 and graph.replays == 3
    assert table_graph.same(graph(coords, shape, True), want)
    assert launches(lambda: _torch(coords, shape, rows)) > 10 * replayed
