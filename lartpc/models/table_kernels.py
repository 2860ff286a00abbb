"""One level of SCNet's index tables (:mod:`lartpc.models.sparse_torch`) in three Triton
kernels instead of ~27 torch operations (issue 36).

On a GPU the loader's thread launches every operation of ``build_maps`` from Python:
on an H200 a batch of 7 at 3600 x 3600 took 2.86 ms, ~140 operations at ~18 us of host
time each, more than the graphed training step it feeds (1.7 ms; BENCHMARKS.md). The
elementwise work of a level (each site's image, row and column from its key, its pooled
output key, its cell in the padded index image) and the neighbour table's gathers are
one pass over the sites each, so per level they become:

1. :func:`_sites`: each site's pooled key and index-image cell, and its row written
   into the image;
2. :func:`_neighbours`: the (P, k*k) neighbour table read from the image (P where no
   site is) and, for the levels that need it, the mirrored gather of the input gradient
   (:func:`sparse_torch.mirror`) from the same reads;
3. :func:`_clear`: the written cells set back to -1 (after every read of 2);

and torch's ``unique`` for the pooled sites (its output count is the level's one
read-back, as in the torch path). Same integers as the torch path, bit for bit
(``tests/test_table_kernels.py``, under Triton's interpreter on CPU): the function is
integer arithmetic and every cell has one writer.

Only where one pass of the index image holds the whole batch and every pool divides
its image exactly (the study's 3600 -> 720 -> 144 -> 36 -> 9, and the tests' sizes);
:func:`usable` says when. Imported on CUDA only (or for the tests, under the
interpreter): a CPU never needs Triton.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
#: sites per program; the interpreter, slow per operation, is quicker with large blocks
BLOCK = 4096 if _INTERPRETED else 256
#: sites per program of the neighbour kernel (each reads a row of k*k cells)
ROWS = 1024 if _INTERPRETED else 64


@triton.jit
def _sites(keys_ptr, okey_ptr, cell_ptr, grid_ptr, n, h, w, oh, ow, wp, image_cells, r, size,
           BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    key = tl.load(keys_ptr + i, mask=inside, other=0)  # (b * h + y) * w + x, int64
    b = key // (h * w)
    rest = key - b * (h * w)
    y = rest // w
    x = rest - y * w
    tl.store(okey_ptr + i, (b * oh + y // size) * ow + x // size, mask=inside)
    cell = b * image_cells + (y + r) * wp + (x + r)
    tl.store(cell_ptr + i, cell, mask=inside)
    tl.store(grid_ptr + cell, i.to(tl.int32), mask=inside)


@triton.jit
def _neighbours(cell_ptr, offsets_ptr, grid_ptr, table_ptr, mirrored_ptr, n, rows,
                KK: tl.constexpr, KK_POW2: tl.constexpr, ROWS: tl.constexpr,
                MIRROR: tl.constexpr):
    # rows >= n: the table's rows; a row past the sites (padding) reads no cell, so
    # every entry of it is the zero row, ``rows``, as is every missing neighbour
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    o = tl.arange(0, KK_POW2)[None, :]
    inside = (i < rows) & (o < KK)
    site = (i < n) & (o < KK)
    cell = tl.load(cell_ptr + i, mask=i < n, other=0)
    row = tl.load(grid_ptr + cell + tl.load(offsets_ptr + o, mask=o < KK, other=0),
                  mask=site, other=-1)
    tl.store(table_ptr + i * KK + o, tl.where(row < 0, rows, row), mask=inside)
    if MIRROR:  # entry o of the mirror: the neighbour at offset KK-1-o, as row * KK + o
        back = tl.load(grid_ptr + cell + tl.load(offsets_ptr + (KK - 1 - o), mask=o < KK,
                                                 other=0),
                       mask=site, other=-1)
        tl.store(mirrored_ptr + i * KK + o, tl.where(back < 0, rows, back) * KK + o,
                 mask=inside)


@triton.jit
def _clear(cell_ptr, grid_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    cell = tl.load(cell_ptr + i, mask=inside, other=0)
    tl.store(grid_ptr + cell, tl.full([BLOCK], -1, tl.int32), mask=inside)


def usable(shape: tuple[int, int], pools, kernel: int, images: int, cells: int) -> bool:
    """Whether the kernels can build these tables: every pool divides its level's image
    exactly and one index image of ``cells`` cells holds the batch at every level."""
    h, w = shape
    r = kernel // 2
    for size in pools:
        if images * (h + 2 * r) * (w + 2 * r) > cells or h % size or w % size:
            return False
        h, w = h // size, w // size
    return True


def cells(images: int, shape: tuple[int, int], kernel: int) -> int:
    """The index image's cells :func:`level` needs: the whole batch's images with their
    borders (one pass)."""
    r = kernel // 2
    return images * (shape[0] + 2 * r) * (shape[1] + 2 * r)


def level(keys: torch.Tensor, shape: tuple[int, int], size: int, kernel: int,
          grid: torch.Tensor, offsets: torch.Tensor, mirror: bool,
          capacity: int | None = None):
    """One level's tables from its sorted int64 ``keys`` (non-empty): the neighbour table
    (P, k*k) int32, the mirrored gather (P*k*k,) int32 or None, each site's pool slot
    (int64) and the pooled level's sorted keys. ``grid``: an all -1 int32 index image
    of at least (images, h + 2r, w + 2r) cells, left all -1; ``offsets``: the window's
    int64 offsets in it (``sparse_torch.window_offsets``). With ``capacity`` (at least
    P) the table and the mirror have that many rows, padded as
    ``sparse_torch.pad_maps`` pads them, in the same launch; the slots are not."""
    h, w = shape
    n, r, kk = len(keys), kernel // 2, kernel * kernel
    rows = n if capacity is None else capacity
    hp, wp = h + 2 * r, w + 2 * r
    okey = torch.empty_like(keys)
    cell = torch.empty_like(keys)
    table = torch.empty((rows, kk), dtype=torch.int32, device=keys.device)
    mirrored = (torch.empty(rows * kk, dtype=torch.int32, device=keys.device) if mirror
                else table)
    sites = (triton.cdiv(n, BLOCK),)
    _sites[sites](keys, okey, cell, grid, n, h, w, h // size, w // size, wp, hp * wp, r, size,
                  BLOCK=BLOCK)
    _neighbours[(triton.cdiv(rows, ROWS),)](cell, offsets, grid, table, mirrored, n, rows,
                                            KK=kk, KK_POW2=triton.next_power_of_2(kk),
                                            ROWS=ROWS, MIRROR=mirror)
    _clear[sites](cell, grid, n, BLOCK=BLOCK)
    out_keys, slots = torch.unique(okey, sorted=True, return_inverse=True)
    return table, (mirrored if mirror else None), slots, out_keys
