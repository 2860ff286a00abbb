"""SCNet's index tables compiled by numba (:mod:`lartpc.models.table_numba`, ``auto`` on
a CPU) are the torch operations' tables, integer for integer: every level's neighbour
table, mirrored gather, pool slots and pooled sites, unpadded and padded in place, at
400 x 400 and 3600 x 3600, batches of 7 and 1, coordinates shuffled, an image of the
batch with no site, image sides the pools do not divide (sites dropped), and pools that
leave no site. ``auto`` builds with them on a CPU, so do the loader processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from table_checks import batch_coords, same_padded, same_tables

from lartpc.data.loaders import build_loader
from lartpc.data.store import EventStore
from lartpc.models import build, sparse_torch, table_numba
from lartpc.models.scnet import KERNEL, POOLS


def _both(coords, n: int, shape, rows=None):
    """(numba's tables, the torch operations'); numba's with the torch operations'
    level builders made to fail."""

    def torch_path(*a, **k):
        raise AssertionError("a level built by torch operations")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sparse_torch, "neighbour_table", torch_path)
        mp.setattr(sparse_torch, "pool_slots", torch_path)
        got = sparse_torch.build_maps(coords, n, shape, KERNEL, POOLS, rows=rows,
                                      tables="numba")
    return got, sparse_torch.build_maps(coords, n, shape, KERNEL, POOLS, rows=rows,
                                        tables="torch")


@pytest.mark.parametrize("first,n", [(0, 7), (7, 1), (20, 7)])
def test_numbas_tables_are_the_torch_operations(train_events_dir, first, n):
    coords, shape = batch_coords(train_events_dir, first, n)
    got, want = _both(coords, n, shape)
    same_tables(got, want)
    assert got.levels[1].mirrored is not None and got.levels[0].mirrored is None
    shuffled = coords[torch.randperm(len(coords), generator=torch.Generator().manual_seed(n))]
    got, want = _both(shuffled, n, shape)
    same_tables(got, want)
    assert not torch.equal(got.order, torch.arange(len(coords)))  # really out of order


def test_padded_in_place_as_the_torch_operations_pad(train_events_dir):
    """Capacities with room, exactly full, and one level short (then unpadded)."""
    coords, shape = batch_coords(train_events_dir, 0, 7)
    have = sparse_torch.sizes(sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS,
                                                      tables="torch"))
    for rows in ([n + 37 for n in have], list(have), [n + (i % 2) for i, n in enumerate(have)]):
        got, want = _both(coords, 7, shape, tuple(rows))
        assert sparse_torch.sizes(got) == tuple(rows)
        same_padded(got, want)
    rows = tuple(n - (i == 2) for i, n in enumerate(have))
    got, want = _both(coords, 7, shape, rows)
    assert got.unpadded is None and sparse_torch.sizes(got) == have
    same_tables(got, want)


def test_sites_a_pool_drops_and_pools_that_leave_no_site(train_events_dir):
    """Image sides the pools do not divide: sites in the last rows and columns get the
    dropped row (unpadded) or the capacity (padded); a batch of one site near a corner:
    the third pool leaves nothing and the levels end there."""
    coords, shape = batch_coords(train_events_dir, 0, 7)
    shape = (shape[0] + 3, shape[1] + 2)
    extra = torch.tensor([[0, shape[0] - 1, x] for x in range(10, 15)]
                         + [[6, y, shape[1] - 1] for y in range(3, 9)], dtype=coords.dtype)
    coords = torch.cat([coords, extra])
    got, want = _both(coords, 7, shape)
    same_tables(got, want)
    assert bool((got.levels[0].slots == got.levels[0].n_out).any())
    rows = tuple(n + 5 for n in sparse_torch.sizes(want))
    same_padded(*_both(coords, 7, shape, rows))
    lone = torch.tensor([[0, 3, 410]], dtype=coords.dtype)  # 430 -> 86 -> 17: 410 // 25 = 16
    a, b = (sparse_torch.build_maps(lone, 1, (430, 430), KERNEL, POOLS, tables=way)
            for way in ("numba", "torch"))
    assert [lv.n_out for lv in a.levels] == [lv.n_out for lv in b.levels] == [1, 1, 0]
    for la, lb in zip(a.levels, b.levels, strict=True):
        assert torch.equal(la.neighbours, lb.neighbours) and torch.equal(la.slots, lb.slots)


def test_full_resolution_with_an_empty_image(full_res_events_dir):
    """3600 x 3600, 7 images of which the fourth has no site."""
    coords, shape = batch_coords(full_res_events_dir, 0, 7)
    coords = coords[coords[:, 0] != 3]
    got, want = _both(coords, 7, shape)
    same_tables(got, want)
    assert len(got.levels[0].keys) == len(coords) > 10_000
    assert not bool((got.levels[0].keys // (shape[0] * shape[1]) == 3).any())


def test_auto_builds_with_numba_on_a_cpu_and_falls_back_once(monkeypatch, train_events_dir,
                                                             caplog):
    """``auto`` on a CPU uses the compiled levels; where they fail at their first use (a
    stand-in that writes into the index image, then raises) a warning, the torch
    operations' tables from a clean index image, and torch operations from then on."""
    coords, shape = batch_coords(train_events_dir, 0, 7)
    want = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, tables="torch")
    cpu = torch.device("cpu")
    assert sparse_torch._table_kernels(cpu, shape, POOLS, KERNEL, 7, "auto") is table_numba
    monkeypatch.setattr(sparse_torch, "_KERNELS_FAILED", set())
    monkeypatch.setattr(sparse_torch, "_KERNELS_WORKED", set())
    calls = []

    def broken(keys, shape, size, kernel, grid, offsets, mirror, capacity=None):
        calls.append(1)
        grid[:len(keys)] = 5
        raise RuntimeError("numba: cannot compile")

    monkeypatch.setattr(table_numba, "level", broken)
    with caplog.at_level("WARNING", logger="lartpc.models.sparse_torch"):
        for _ in range(2):
            same_tables(sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS,
                                                tables="auto"), want)
    assert calls == [1] and sparse_torch._KERNELS_FAILED == {"cpu"}
    assert "table kernels (table_numba) failed on cpu" in caplog.text
    assert "cannot compile" in caplog.text
    assert sparse_torch._table_kernels(cpu, shape, POOLS, KERNEL, 7, "auto") is None


def test_numba_is_refused_off_the_cpu():
    with pytest.raises(ValueError, match="tables=numba builds on the CPU"):
        sparse_torch._table_kernels(torch.device("meta"), (400, 400), POOLS, KERNEL, 7,
                                    "numba")


def test_the_loader_processes_build_with_numba_compiled_before_the_fork(monkeypatch,
                                                                        train_events_dir):
    """``data.loader_processes``: the parent compiles the builder once before forking
    (each process inherits it) and the processes' tables, built with the torch
    operations' level builders made to fail, equal the torch operations' tables."""
    store = EventStore(train_events_dir)
    model = build("scnet", image_size=store.geometry.shape, sparse="torch")
    builder = model.rulebook_builder(training=True)

    def loader(**kw):
        return build_loader(store, "sparse", np.arange(len(store)), 7, seed=1,
                            rulebooks=builder, prefetch_depth=2, **kw)

    monkeypatch.setattr(sparse_torch, "TABLES", "torch")
    want = list(loader())
    monkeypatch.setattr(sparse_torch, "TABLES", "auto")
    warmed, real = [], table_numba.warm
    monkeypatch.setattr(table_numba, "warm", lambda: warmed.append(1) or real())

    def torch_path(*a, **k):
        raise AssertionError("a level built by torch operations")

    monkeypatch.setattr(sparse_torch, "neighbour_table", torch_path)  # inherited by the fork
    elsewhere = loader(processes=2)
    assert warmed == [1] and table_numba._level.signatures
    got = list(elsewhere)
    elsewhere._pool.close()
    assert len(got) == len(want) > 5
    for a, b in zip(want, got, strict=True):
        assert list(a.event_ids) == list(b.event_ids)
        assert b.rulebooks.fits(b.coords, b.data_size, tuple(store.geometry.shape), True)
        same_tables(a.rulebooks, b.rulebooks)


def test_a_failure_to_compile_before_the_fork_falls_back(monkeypatch, caplog):
    """Where numba cannot compile, ``auto`` warns once and the processes build with torch
    operations; ``numba``, asked for by name, raises."""
    monkeypatch.setattr(sparse_torch, "_KERNELS_FAILED", set())

    def broken():
        raise RuntimeError("numba: no LLVM target")

    monkeypatch.setattr(table_numba, "warm", broken)
    monkeypatch.setattr(sparse_torch, "TABLES", "numba")
    with pytest.raises(RuntimeError, match="no LLVM target"):
        sparse_torch.warm_cpu_tables()
    monkeypatch.setattr(sparse_torch, "TABLES", "auto")
    with caplog.at_level("WARNING", logger="lartpc.models.sparse_torch"):
        sparse_torch.warm_cpu_tables()
    assert sparse_torch._KERNELS_FAILED == {"cpu"} and "no LLVM target" in caplog.text
    assert sparse_torch._table_kernels(torch.device("cpu"), (400, 400), POOLS, KERNEL,
                                       7) is None
