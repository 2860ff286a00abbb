"""SCNet's index tables from :mod:`lartpc.models.table_kernels` (three Triton kernels a
level, the loader's thread's launches on a GPU cut from ~27 a level to ~4) are the
torch path's, integer for integer: every level's neighbour table, mirrored gather, pool
slots and pooled sites, at 400 x 400 and at 3600 x 3600, with batches of 1 and 7 and
an empty image in the batch. On CPU under Triton's interpreter; on a GPU the same
comparison runs on CUDA tensors with ``auto``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from table_checks import batch_coords, same_padded, same_tables  # imports no Triton
from triton_cpu import DEVICE, compile_for_sm90  # before Triton: sets TRITON_INTERPRET

from lartpc.models import sparse_torch
from lartpc.models.scnet import KERNEL, POOLS


def _coords(data, first: int, n: int) -> tuple[torch.Tensor, tuple[int, int]]:
    return batch_coords(data, first, n, DEVICE)


def _build(monkeypatch, way: str, coords, n: int, shape):
    monkeypatch.setattr(sparse_torch, "TABLES", way)
    return sparse_torch.build_maps(coords, n, shape, KERNEL, POOLS)


@pytest.mark.parametrize("first,n", [(0, 7), (7, 1)])
def test_the_kernels_build_the_torch_paths_tables(monkeypatch, train_events_dir, first, n):
    from lartpc.models import table_kernels

    coords, shape = _coords(train_events_dir, first, n)
    calls, real = [], table_kernels.level
    monkeypatch.setattr(table_kernels, "level", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = _build(monkeypatch, "triton", coords, n, shape)
    assert len(calls) == len(POOLS)  # every level by the kernels
    same_tables(got, _build(monkeypatch, "torch", coords, n, shape))
    assert len(calls) == len(POOLS)  # and none on the torch path
    assert got.levels[1].mirrored is not None and got.levels[0].mirrored is None


@pytest.mark.parametrize("way", ["torch", "triton"])
def test_tables_built_padded_are_the_padded_tables(monkeypatch, train_events_dir, way):
    """``build_maps(rows=...)`` writes the tables padded (a CUDA graph's loader: no
    padding pass after the build) and they equal ``pad_maps`` of the unpadded ones,
    integer for integer, by either way of building; with rows the batch does not fit
    (the first level, a later one) or with no rows, the unpadded tables."""
    coords, shape = _coords(train_events_dir, 0, 7)
    monkeypatch.setattr(sparse_torch, "TABLES", way)
    plain = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS)
    have = sparse_torch.sizes(plain)
    for rows in ([n + 37 for n in have], list(have), [n + (i % 2) for i, n in enumerate(have)]):
        got = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, rows=tuple(rows))
        assert sparse_torch.sizes(got) == tuple(rows)
        same_padded(got, sparse_torch.pad_maps(plain, rows))
    for short in (0, 2, len(have) - 1):  # one level short of rows: as if not asked
        rows = tuple(n - (i == short) for i, n in enumerate(have))
        got = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, rows=rows)
        assert got.unpadded is None and sparse_torch.sizes(got) == have
        same_tables(got, plain)


def test_padded_tables_with_sites_a_pool_drops(monkeypatch, train_events_dir):
    """An image side the pools do not divide (the torch path: sites in its last rows are
    dropped, their slot the dropped row, which padding moves to the capacity)."""
    coords, shape = _coords(train_events_dir, 0, 7)
    shape = (shape[0] + 3, shape[1] + 2)  # sites in the added last row: dropped
    extra = torch.tensor([[0, shape[0] - 1, x] for x in range(10, 15)], dtype=coords.dtype)
    coords = torch.cat([coords, extra.to(coords.device)])
    monkeypatch.setattr(sparse_torch, "TABLES", "torch")
    plain = sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS)
    assert any(bool((lv.slots == lv.n_out).any()) for lv in plain.levels)
    rows = tuple(n + 5 for n in sparse_torch.sizes(plain))
    same_padded(sparse_torch.build_maps(coords, 7, shape, KERNEL, POOLS, rows=rows),
                 sparse_torch.pad_maps(plain, rows))


def test_an_empty_image_in_the_batch_and_full_resolution(monkeypatch, full_res_events_dir):
    """3600 x 3600, 7 images of which the fourth has no site (a batch's image index
    skips it), with the index image a GPU's size (one pass holds the batch)."""
    monkeypatch.setitem(sparse_torch.PASS_CELLS, "cpu", sparse_torch.PASS_CELLS["cuda"])
    coords, shape = _coords(full_res_events_dir, 0, 7)
    coords = coords[coords[:, 0] != 3]
    got = _build(monkeypatch, "triton", coords, 7, shape)
    same_tables(got, _build(monkeypatch, "torch", coords, 7, shape))
    assert len(got.levels[0].keys) == len(coords) > 10_000


def test_where_the_kernels_do_not_serve_the_torch_path_builds(monkeypatch, train_events_dir):
    from lartpc.models import table_kernels

    assert table_kernels.usable((400, 400), POOLS, KERNEL, 7, 1 << 24)
    assert not table_kernels.usable((401, 400), POOLS, KERNEL, 7, 1 << 24)  # 401 % 5
    assert not table_kernels.usable((400, 400), POOLS, KERNEL, 7, 7 * 404 * 404 - 1)
    monkeypatch.setitem(sparse_torch.PASS_CELLS, "cpu", 7 * 404 * 404 - 1)  # one too few
    coords, shape = _coords(train_events_dir, 0, 7)
    calls = []
    monkeypatch.setattr(table_kernels, "level", lambda *a, **k: calls.append(a))
    same_tables(_build(monkeypatch, "triton", coords, 7, shape),
          _build(monkeypatch, "torch", coords, 7, shape))
    assert calls == []
    monkeypatch.setattr(sparse_torch, "TABLES", "auto")  # on a CPU: not the Triton kernels
    cpu = sparse_torch._table_kernels(torch.device("cpu"), shape, POOLS, KERNEL, 7)
    assert cpu is not table_kernels


def test_kernels_that_fail_at_their_first_use_fall_back_once(monkeypatch, train_events_dir,
                                                             caplog):
    """``auto`` on a device whose Triton cannot run the kernels (here a stand-in that
    writes into the index image, then fails): a warning, the torch path's tables (from
    a clean index image), and the torch path from then on."""
    from lartpc.models import table_kernels

    coords, shape = _coords(train_events_dir, 0, 7)
    want = _build(monkeypatch, "torch", coords, 7, shape)

    class Broken:
        calls = 0

        cells = staticmethod(table_kernels.cells)

        @staticmethod
        def level(keys, shape, size, kernel, grid, offsets, mirror, capacity=None):
            Broken.calls += 1
            grid[:len(keys)] = 5  # rows left behind, as a kernel that died half-way would
            raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(sparse_torch, "_KERNELS_FAILED", set())
    monkeypatch.setattr(sparse_torch, "_KERNELS_WORKED", set())
    monkeypatch.setattr(sparse_torch, "_table_kernels",
                        lambda device, *a: None if str(device) in sparse_torch._KERNELS_FAILED
                        else Broken)
    with caplog.at_level("WARNING", logger="lartpc.models.sparse_torch"):
        same_tables(_build(monkeypatch, "auto", coords, 7, shape), want)
        same_tables(_build(monkeypatch, "auto", coords, 7, shape), want)
    assert Broken.calls == 1 and sparse_torch._KERNELS_FAILED == {str(coords.device)}
    assert "table kernels (Broken) failed" in caplog.text and "no kernel image" in caplog.text
    assert table_kernels.level is not Broken.level  # the real module was left alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_uses_the_kernels_on_cuda_with_the_same_tables(monkeypatch, full_res_events_dir):
    coords, shape = _coords(full_res_events_dir, 0, 7)
    assert sparse_torch._table_kernels(coords.device, shape, POOLS, KERNEL, 7) is not None
    same_tables(_build(monkeypatch, "auto", coords, 7, shape),
          _build(monkeypatch, "torch", coords, 7, shape))
    assert np.isfinite(float(coords.float().mean()))  # the batch was real, not empty


#: compiles the three kernels for an H100/H200 (sm_90) without a GPU, at the module's
#: GPU block sizes (the build comes from triton_cpu.compile_for_sm90)
_COMPILE_FOR_SM90 = """
    import lartpc.models.table_kernels as tk

    build(tk._sites, {"keys_ptr": "*i64", "okey_ptr": "*i64", "cell_ptr": "*i64",
                      "grid_ptr": "*i32"}, {"BLOCK": tk.BLOCK})
    for mirror in (False, True):
        build(tk._neighbours, {"cell_ptr": "*i64", "offsets_ptr": "*i64", "grid_ptr": "*i32",
                               "table_ptr": "*i32", "mirrored_ptr": "*i32"},
              {"KK": 25, "KK_POW2": 32, "ROWS": tk.ROWS, "MIRROR": mirror})
    build(tk._clear, {"cell_ptr": "*i64", "grid_ptr": "*i32"}, {"BLOCK": tk.BLOCK})
"""


def test_the_kernels_compile_for_sm90_without_spills():
    """The interpreter runs no GPU compiler: here Triton compiles the three kernels (the
    neighbour kernel with and without the mirror) for sm_90 at the module's GPU block
    sizes, as the first batch on an H100/H200 would, and none spills (Triton's bundled
    ptxas; skipped where Triton has none)."""
    lines = compile_for_sm90(_COMPILE_FOR_SM90)
    assert [line.split()[0] for line in lines] == ["_sites", "_neighbours", "_neighbours",
                                                   "_clear"], lines
    assert all("STACK:0" in line for line in lines), lines
