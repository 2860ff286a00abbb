"""One level of SCNet's index tables (:mod:`lartpc.models.sparse_torch`) compiled by
numba, for a CPU: the loader processes of a GPU training, a CPU training's loader
thread, and the fallback.

With torch operations a level is ~27 passes over the sites, each a few hundred
microseconds on a CPU at 3600 x 3600 (a batch of 7 took ~5 ms in one thread,
``jobs/local/loader_probe.py``; ~2.6 ms this way). Compiled, a level is a few loops
over each image's sites (an image's sites are a run of the sorted keys, so one index
image of one image's size serves the batch, as the torch operations' passes on a CPU):

1. each site's cell in the padded index image, its row written there, and its pooled
   cell (or -1 where the pool leaves it out: a side the pool does not divide);
2. the (P, k*k) neighbour table read from the image (P where no site is), then, for the
   levels that need it, the mirrored gather of the input gradient
   (:func:`sparse_torch.mirror`), and the written cells set back to -1;
3. the pooled sites: each marked once in the same image (now all -1), the marked
   cells sorted (a few thousand), their ranks written into their cells and read back
   as each site's slot, and the cells cleared again; sites left out get the level's
   pooled count, as :func:`sparse_torch.pool_slots` gives them.

The same integers as the torch operations, bit for bit (``tests/test_table_numba.py``):
the function is integer arithmetic. The loops hold no GIL (``nogil``), so loader
threads build side by side. Compiled at the first call (~5 s; ~0.4 s from numba's cache
beside this file), which the loader makes before forking its processes (:func:`warm`).
"""

from __future__ import annotations

import numba
import numpy as np
import torch


@numba.njit(cache=True, nogil=True)
def _level(keys, h, w, size, r, grid, offsets, table, mirrored, slots, cells, pooled,
           do_mirror):  # pragma: no cover - compiled; run by the tests through level()
    n = len(keys)
    rows, kk = table.shape
    wp = w + 2 * r
    oh, ow = h // size, w // size
    none = rows  # the zero row: the table's row count (its capacity where padded)
    out = np.empty(n, dtype=np.int64)  # the pooled keys (at most one a site)
    m = 0
    lo = 0
    while lo < n:  # one image at a time: its sites are a run of the sorted keys
        b = keys[lo] // (h * w)
        end = (b + 1) * (h * w)
        hi = lo
        while hi < n and keys[hi] < end:  # 1. each site's cell, its row written there
            rest = keys[hi] - b * (h * w)
            y = rest // w
            x = rest - y * w
            cell = (y + r) * wp + (x + r)
            cells[hi] = cell
            grid[cell] = hi
            oy, ox = y // size, x // size
            pooled[hi] = -1 if oy >= oh or ox >= ow else oy * ow + ox  # -1: left out
            hi += 1
        for i in range(lo, hi):  # 2. its neighbours (and their mirror)
            base = cells[i]
            for o in range(kk):
                v = grid[base + offsets[o]]
                table[i, o] = none if v < 0 else v
        if do_mirror:
            for i in range(lo, hi):
                for o in range(kk):
                    mirrored[i * kk + o] = table[i, kk - 1 - o] * kk + o
        for i in range(lo, hi):
            grid[cells[i]] = -1
        first = m  # 3. the pooled sites: each marked once in the (now empty) image
        for i in range(lo, hi):
            c = pooled[i]
            if c >= 0 and grid[c] == -1:
                grid[c] = -2
                out[m] = c
                m += 1
        out[first:m] = np.sort(out[first:m])
        for j in range(first, m):
            grid[out[j]] = j
        for i in range(lo, hi):
            slots[i] = -1 if pooled[i] < 0 else grid[pooled[i]]
        for j in range(first, m):
            grid[out[j]] = -1
            out[j] += b * (oh * ow)
        lo = hi
    for i in range(n):  # dropped sites: the row after the kept ones
        if slots[i] < 0:
            slots[i] = m
    for i in range(n, rows):  # padding rows read only the zero row
        for o in range(kk):
            table[i, o] = none
            if do_mirror:
                mirrored[i * kk + o] = none * kk + o
    return out[:m]


def cells(images: int, shape: tuple[int, int], kernel: int) -> int:
    """The index image's cells :func:`level` needs: one image with its border (it
    builds a batch image by image)."""
    r = kernel // 2
    return (shape[0] + 2 * r) * (shape[1] + 2 * r)


def level(keys: torch.Tensor, shape: tuple[int, int], size: int, kernel: int,
          grid: torch.Tensor, offsets: torch.Tensor, mirror: bool,
          capacity: int | None = None):
    """One level's tables from its sorted int64 ``keys`` (non-empty, on the CPU), as
    :func:`lartpc.models.table_kernels.level` makes them: the neighbour table (P, k*k)
    int32, the mirrored gather (P*k*k,) int32 or None, each site's pool slot (int64;
    sites a pool leaves out get the pooled count) and the pooled level's sorted keys.
    ``grid``: an all -1 int32 index image of at least :func:`cells` cells, left all -1;
    ``offsets``: the window's offsets in it (``sparse_torch.window_offsets``). With
    ``capacity`` (at least P) the table and the mirror have that many rows, padded as
    ``sparse_torch.pad_maps`` pads them; the slots are not."""
    h, w = shape
    n, kk = len(keys), kernel * kernel
    rows = n if capacity is None else capacity
    table = torch.empty((rows, kk), dtype=torch.int32)
    mirrored = torch.empty(rows * kk if mirror else 0, dtype=torch.int32)
    slots = torch.empty(n, dtype=torch.int64)
    out = _level(keys.numpy(), h, w, size, kernel // 2, grid.numpy(), offsets.numpy(),
                 table.numpy(), mirrored.numpy(), slots.numpy(),
                 np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), mirror)
    return table, (mirrored if mirror else None), slots, torch.from_numpy(out)


def warm() -> None:
    """Compile :func:`_level` now (or load it from numba's cache), on a tiny batch."""
    keys = torch.tensor([0, 9], dtype=torch.int64)  # two sites of a 4 x 4 image
    grid = torch.full((cells(1, (4, 4), 3),), -1, dtype=torch.int32)
    offsets = torch.tensor([-7, -6, -5, -1, 0, 1, 5, 6, 7], dtype=torch.int64)
    level(keys, (4, 4), 2, 3, grid, offsets, mirror=True)
