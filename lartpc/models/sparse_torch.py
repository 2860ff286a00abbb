"""SCNet's sparse layers in plain torch operations (``model.sparse = torch``).

The same function as spconv's submanifold convolution and sparse max-pool as SCNet uses
them (odd kernel, no bias; pool kernel = stride, no padding), written as a few dense
torch operations on index tables built from the coordinates alone (issue 36):

- a **site table** per level: the active sites as sorted int64 keys
  ``(b * H + y) * W + x``;
- a submanifold convolution's **neighbour table** (P, k*k): for each site and kernel
  offset, the row of the active neighbour, or P where there is none (read from an
  index image, a few images of the batch at a time; row P is a zero row appended
  to the features). The convolution is then one gather (``index_select``: on a CPU 2-5x
  faster than advanced indexing for these narrow rows) and one matrix product:
  ``features[neighbours] (P, k*k*C) @ weight (k*k*C, C')``;
- a max-pool's **slot** of every input site: its output site's row, or ``n_out`` (a
  row dropped afterwards) for sites in the rows and columns an unpadded pool leaves
  out. The pool is one ``scatter_reduce(amax)`` into zeros: spconv's output is
  ``max(0, max over the window's active sites)``, and so is an ``amax`` that includes
  the zeros it starts from.

:func:`build_maps` makes every level's tables in one pass (sorts, gathers from an index
image, ``cumsum``; a few read-backs of counts); on a GPU by Triton kernels or one
replayed CUDA graph, on a CPU compiled by numba (:data:`TABLES`), the same integers.
It is a pure function of the batch's coordinates, so the sparse loader can build it in
its prefetch thread (``data.rulebooks = loader``, or ``auto``); torch's operations and
the compiled loops release the GIL, unlike spconv's pair builders. The step itself is
then four times gather, product, ELU and scatter: no rulebook, no host synchronisation,
~30 operations in the forward.

The pool's backward is spconv's: every input equal to its output gets the output's
whole gradient (tied sites each get all of it; an input of exactly 0 in a window whose
maximum is 0 gets it too). ``tests/test_sparse_torch.py`` checks outputs and gradients
against spconv.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass
class Level:
    """One resolution's tables: its sites (sorted keys), the convolution's neighbour
    table and the pool's slot of each site, with the pool's output count."""

    keys: torch.Tensor  #: int64 (P,), sorted
    shape: tuple[int, int]  #: (H, W) of this level
    neighbours: torch.Tensor  #: int32 (P, k*k); P = no neighbour (the zero row, last)
    slots: torch.Tensor  #: int64 (P,): the output row; n_out = dropped
    n_out: int  #: active sites after the pool
    #: int32 (P * k*k,): the input gradient's gather (:func:`mirror`); None on the first
    #: level, whose input (the event's charge) needs no gradient
    mirrored: torch.Tensor | None = None


@dataclass
class SiteMaps:
    """Every table of one batch (see the module docstring). ``order`` sorts the input
    rows into key order; ``dense_index`` puts the last level's sites into the flat
    (B * h * w) dense map."""

    indices: torch.Tensor  #: the coordinate tensor they were built for
    batch_size: int
    spatial_shape: tuple[int, int]
    order: torch.Tensor
    levels: list[Level]
    dense_index: torch.Tensor
    out_shape: tuple[int, int]
    training: bool = True  #: unused: the tables are the same for either mode
    #: :func:`sizes` before :func:`pad_maps` padded them (None: not padded)
    unpadded: tuple[int, ...] | None = None
    #: the buffers every table above is a view of, where they are (the table graph's
    #: two copies, :mod:`~lartpc.models.table_graph`): marking them marks every table
    held: tuple[torch.Tensor, ...] | None = None

    def fits(self, indices: torch.Tensor, batch_size: int, spatial_shape, training: bool) -> bool:
        """Built for this very coordinate tensor (identity), batch size and shape."""
        return (indices is self.indices and batch_size == self.batch_size
                and tuple(spatial_shape) == tuple(self.spatial_shape))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor held (to mark them used on another CUDA stream; the buffers
        where the tables are views of a few: a step's thread marks 3 tensors, not 27)."""
        if self.held is not None:
            return [self.indices, *self.held]
        out = [self.indices, self.order, self.dense_index]
        for level in self.levels:
            out += [level.keys, level.neighbours, level.slots]
            out += [] if level.mirrored is None else [level.mirrored]
        return out


def site_keys(coords: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """int64 keys ``(b * H + y) * W + x`` of int (P, 3) coordinates (b, y, x)."""
    c = coords.long()
    return (c[:, 0] * shape[0] + c[:, 1]) * shape[1] + c[:, 2]


_grids = threading.local()  # per thread: each loader thread builds with its own


#: cells of the index image one pass of :func:`neighbour_table` writes: one 3600 x 3600
#: image (64 MB) on a CPU, where a whole batch of 7 in one pass was no faster and held
#: 364 MB per thread; ten on a GPU (512 MB), where a batch of 7 is one pass of a
#: handful of launches
PASS_CELLS = {"cpu": 1 << 24, "cuda": 1 << 27}


def _grid(cells: int, device: torch.device) -> torch.Tensor:
    """This thread's int32 index image of at least ``cells`` cells on ``device``, all -1
    (a prefix of it is used); kept between calls and levels (a fresh 52 MB image at
    3600 x 3600 cost more than the lookups), grown when too small."""
    cache = _grids.__dict__.setdefault("by_device", {})
    grid = cache.get(str(device))
    if grid is None or len(grid) < cells:
        cache[str(device)] = None  # the old one freed before the new one is made
        grid = cache[str(device)] = torch.full((cells,), -1, dtype=torch.int32,
                                               device=device)
    return grid


def split_keys(keys: torch.Tensor, shape: tuple[int, int]):
    """(b, y, x) of keys made by :func:`site_keys` for an image of ``shape``."""
    h, w = shape
    return keys // (h * w), (keys // w) % h, keys % w


def neighbour_table(keys: torch.Tensor, shape: tuple[int, int], kernel: int,
                    images: int | None = None, parts=None,
                    capacity: int | None = None) -> torch.Tensor:
    """For sorted ``keys`` of a batch of ``images`` images (default: the last key's
    image + 1, one read-back): the row of each site's neighbour at every offset of a
    ``kernel`` x ``kernel`` window (offsets row-major, as spconv's weight (C', k, k,
    C)), or ``len(keys)`` (the zero row) where that neighbour is not active or outside
    its image; int32. With ``capacity`` (at least ``len(keys)``) the table has that many
    rows, the zero row is row ``capacity`` and the rows after the sites' read only it:
    :func:`pad_maps`'s table, made in place.

    As many images at a time as :data:`PASS_CELLS` allows (the whole batch on a GPU):
    their sites' rows are written into an index image (-1 where no site is) whose
    images each have a border of k // 2 (so no offset leaves its image), the k*k
    neighbours of every site read back with one gather, and the written cells set back
    to -1. One pass makes no read-back and slices nothing; several find their sites with
    one. ``parts``: :func:`split_keys` of ``keys`` where the caller has it."""
    h, w = shape
    n, r = len(keys), kernel // 2
    if images is None:
        images = int(keys[-1]) // (h * w) + 1 if n else 0
    hp, wp = h + 2 * r, w + 2 * r
    per_pass = max(1, PASS_CELLS.get(keys.device.type, PASS_CELLS["cpu"]) // (hp * wp))
    image, y, x = split_keys(keys, shape) if parts is None else parts
    none = n if capacity is None else capacity
    padded = torch.empty((none, kernel * kernel), dtype=torch.int32, device=keys.device)
    table = padded[:n]
    grid = _grid(min(images, per_pass) * hp * wp, keys.device)
    # each site's row is written as row - (none + 1), always below the grid's -1, so that
    # one addition of none + 1 after the gather makes rows of those and the zero row of
    # the -1s (a comparison and a masked fill cost twice as much on a CPU)
    shift = none + 1
    rows = torch.arange(-shift, n - shift, dtype=torch.int32, device=keys.device)
    # the gather's (n, k*k) cell numbers in int32 where the image allows: half the bytes
    index = torch.int32 if len(grid) < 2**31 else torch.int64
    offsets = _window_offsets(r, wp, keys.device, index)
    if images <= per_pass:
        passes = [(0, 0, n)]
    else:
        firsts = list(range(0, images, per_pass))
        bounds = torch.searchsorted(image, torch.tensor([*firsts, images],
                                                        device=keys.device)).tolist()
        passes = list(zip(firsts, bounds, bounds[1:], strict=False))
    for first, lo, hi in passes:
        if lo == hi:
            continue
        these = (image, y, x, rows, table)  # the whole batch: no slicing
        if (lo, hi) != (0, n):
            these = tuple(t[lo:hi] for t in these)
        b, yy, xx, at, out = these
        cell = (b - first if first else b) * (hp * wp) + yy * wp + xx + (r * wp + r)
        grid[cell] = at
        torch.index_select(grid, 0, (cell.to(index)[:, None] + offsets).view(-1),
                           out=out.view(-1))
        grid.index_fill_(0, cell, -1)
    table += shift
    if none > n:
        padded[n:] = none
    return padded


def window_offsets(r: int, wp: int, device: torch.device,
                   dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """The (2r+1)^2 offsets of a window's cells from its centre in an index image of
    rows ``wp`` wide, row-major (dy, dx); a new tensor (one a CUDA graph may own)."""
    d = torch.arange(-r, r + 1, dtype=dtype, device=device)
    return (d[:, None] * wp + d).reshape(-1)


#: :func:`window_offsets` made once per size, device and dtype
_window_offsets = functools.lru_cache(maxsize=64)(window_offsets)

#: the key of a dropped site or a padding row: sorts after every site's key
KEY_PAD = torch.iinfo(torch.int64).max


def pooled_shape(shape: tuple[int, int], size: int) -> tuple[int, int]:
    """The image shape after a max-pool of kernel = stride = ``size``, no padding
    (spconv's floor: rows and columns that do not fill a window are left out)."""
    return (shape[0] - size) // size + 1, (shape[1] - size) // size + 1


def pool_slots(keys: torch.Tensor, shape: tuple[int, int], size: int, parts=None):
    """A max-pool of kernel = stride = ``size`` without padding: (each site's output
    row, the output sites' sorted keys, the output shape). Sites in the last rows or
    columns that do not fill a window (spconv's floor) get row ``len(out_keys)``.
    ``parts``: :func:`split_keys` of ``keys`` where the caller has it.

    One ``unique`` of the sites' output keys gives both (its inverse is each site's
    row): few operations, as the loader's thread launches each of them. A dropped site's
    key sorts after every kept one, so its row is the last; only where the image's side
    is not a multiple of ``size`` does that cost a read-back (whether any was dropped)."""
    h, w = shape
    oh, ow = pooled_shape(shape, size)
    b, y, x = split_keys(keys, shape) if parts is None else parts
    oy, ox = y // size, x // size
    okey = (b * oh + oy) * ow + ox
    dropped = None
    if h % size or w % size:  # (the study's sizes pool exactly: 3600 -> 720 -> 144 -> 36)
        dropped = (oy >= oh) | (ox >= ow)
        okey = okey.masked_fill_(dropped, KEY_PAD)
    out_keys, slots = torch.unique(okey, sorted=True, return_inverse=True)
    n_out = len(out_keys) - (dropped is not None and bool(dropped.any()))
    return slots, out_keys[:n_out], (oh, ow)


#: how each level's tables are built: ``auto`` = with :mod:`lartpc.models.table_kernels`
#: (three Triton kernels a level) on CUDA where Triton imports and the batch allows
#: (:func:`table_kernels.usable`), a CUDA graph's padded tables (``rows``) there by one
#: replayed graph (:mod:`lartpc.models.table_graph`), compiled by numba on a CPU
#: (:mod:`lartpc.models.table_numba`), torch operations otherwise; ``torch``; ``numba``
#: (CPU only); ``triton`` (on any device: the tests run it on CPU under Triton's
#: interpreter); ``graph``: padded tables by :mod:`~lartpc.models.table_graph` on any
#: device (eagerly off CUDA: the tests), the rest as ``auto`` on CUDA and torch
#: operations elsewhere
TABLES = "auto"
#: the ways :data:`TABLES` (or ``build_maps``' ``tables``) may name
TABLE_WAYS = ("auto", "torch", "numba", "triton", "graph")


#: devices (``str(device)``) where ``auto``'s kernels failed at their first use (a GPU
#: this Triton does not compile for, say): their tables are built with torch operations
#: from then on; and those where they worked
_KERNELS_FAILED: set[str] = set()
_KERNELS_WORKED: set[str] = set()


@functools.lru_cache(maxsize=4)
def _imports(name: str) -> bool:
    """Whether the package ``name`` (triton, numba) imports here."""
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any failure to import means: not usable here
        return False
    return True


def warm_cpu_tables() -> None:
    """Compile (or load from numba's cache) the CPU's table builder now, where :data:`TABLES`
    builds with it: before forking the loader processes, so that they inherit it rather
    than each compiling its own (~5 s of a CPU each; ~0.4 s from the cache)."""
    fast = _table_kernels(torch.device("cpu"), (8, 8), (2,), 3, 1)
    if fast is None or not hasattr(fast, "warm"):
        return
    try:
        fast.warm()
    except Exception as e:  # noqa: BLE001 - whatever numba raises here
        if TABLES != "auto":
            raise
        _kernels_failed("cpu", fast, e)


def _kernels_failed(where: str, fast, e: Exception) -> None:
    """``fast`` failed at its first use on ``where``: torch operations there from now on."""
    _KERNELS_FAILED.add(where)
    _grids.__dict__.get("by_device", {}).pop(where, None)  # it may hold their rows
    log.warning("SCNet's table kernels (%s) failed on %s (%s: %s); its tables are built "
                "with torch operations", fast.__name__.rsplit(".", 1)[-1], where,
                type(e).__name__, (str(e).splitlines() or [""])[0])


def _table_kernels(device: torch.device, shape, pools, kernel: int, images: int,
                   tables: str | None = None):
    """The module that builds a level (``level``, ``cells``) where ``tables`` (default
    :data:`TABLES`) and the batch allow it, else None (torch operations)."""
    tables = table_way(tables)
    if tables == "numba" or (tables == "auto" and device.type == "cpu"
                             and _imports("numba") and str(device) not in _KERNELS_FAILED):
        if device.type != "cpu":
            raise ValueError(f"tables=numba builds on the CPU, not on {device}")
        from lartpc.models import table_numba

        return table_numba
    if tables == "torch" or (tables in ("auto", "graph") and (
            device.type != "cuda" or not _imports("triton") or str(device) in _KERNELS_FAILED)):
        return None
    from lartpc.models import table_kernels

    cells = PASS_CELLS.get(device.type, PASS_CELLS["cpu"])
    return table_kernels if table_kernels.usable(shape, pools, kernel, images, cells) else None


def table_way(tables: str | None = None) -> str:
    """``tables``, or :data:`TABLES` for None; one not in :data:`TABLE_WAYS` is a
    ValueError naming it."""
    tables = TABLES if tables is None else tables
    if tables not in TABLE_WAYS:
        raise ValueError(f"tables={tables!r} (sparse_torch.TABLES or build_maps' tables): "
                         f"expected one of {', '.join(TABLE_WAYS)}")
    return tables


def build_maps(coords: torch.Tensor, batch_size: int, spatial_shape, kernel: int,
               pools, training: bool = True, rows: tuple[int, ...] | None = None, *,
               tables: str | None = None) -> SiteMaps | None:
    """Every level's tables for int (P, 3) ``coords`` (b, y, x) of a batch (a pure
    function of them; ``training`` is recorded only), on their device; None for no
    sites. A pool that leaves no site ends the levels (the model stops there too).

    With ``rows`` (capacities, one per entry of :func:`sizes`) the tables come padded
    to them, equal to :func:`pad_maps` of the unpadded ones, but built in place (a
    CUDA graph's loader: ~60 operations a batch fewer, each a launch from Python on a
    GPU; on CUDA one replayed graph, :mod:`~lartpc.models.table_graph`); unpadded
    where the batch does not fit them or leaves no site. ``tables``: the way (see
    :data:`TABLES`, the default)."""
    tables = table_way(tables)  # before anything: a misspelt way would ask Triton
    if kernel % 2 == 0:
        raise ValueError(f"kernel={kernel}: a submanifold convolution needs an odd kernel")
    if coords.shape[0] == 0:
        return None
    if rows is not None and len(rows) != len(pools) + 1:
        rows = None  # not these levels' capacities: unpadded
    if rows is not None and _graph_tables(coords.device, tables):
        from lartpc.models import table_graph

        first = tables == "auto" and str(coords.device) not in table_graph.WORKED
        maps = table_graph.build(coords, batch_size, spatial_shape, kernel, pools,
                                 training, tuple(rows), check=first,
                                 fall_back=tables == "auto")
        if maps is not None:
            return maps
    shape = (int(spatial_shape[0]), int(spatial_shape[1]))
    keys = site_keys(coords, shape)
    if bool((keys[1:] > keys[:-1]).all()):  # the loaders' order already (one read-back)
        order = torch.arange(len(keys), device=keys.device)
    else:
        keys, order = torch.sort(keys)
    images = int(batch_size)
    fast = _table_kernels(keys.device, shape, pools, kernel, images, tables)
    where = str(keys.device)
    if fast is not None and tables in ("auto", "graph") and where not in _KERNELS_WORKED:
        try:  # their first use on this device: a failure to compile falls back, once
            built = _levels(keys, shape, kernel, pools, images, fast, rows)
        except Exception as e:  # noqa: BLE001 - whatever Triton or numba raises here
            _kernels_failed(where, fast, e)
            built = _levels(keys, shape, kernel, pools, images, None, rows)
        else:
            _KERNELS_WORKED.add(where)
    else:
        built = _levels(keys, shape, kernel, pools, images, fast, rows)
    if built is None:  # the batch outgrew the capacities at some level: unpadded
        return build_maps(coords, batch_size, spatial_shape, kernel, pools, training,
                          tables=tables)
    levels, keys, shape, unpadded = built
    if rows is None:
        return SiteMaps(coords, images, tuple(spatial_shape), order, levels, keys, shape,
                        training)
    n, (h, w) = len(order), shape
    return SiteMaps(coords, images, tuple(spatial_shape), _fill(order, rows[0], n), levels,
                    _fill(keys, rows[-1], images * h * w), shape, training, unpadded)


def _graph_tables(device: torch.device, tables: str) -> bool:
    """Whether ``tables`` builds padded tables by :mod:`~lartpc.models.table_graph`
    on ``device``: ``graph`` anywhere, ``auto`` on CUDA unless it failed there."""
    if tables == "graph":
        return True
    if tables != "auto" or device.type != "cuda":
        return False
    from lartpc.models import table_graph

    return str(device) not in table_graph.FAILED


def _fill(t: torch.Tensor, rows: int, value: int) -> torch.Tensor:
    """``t`` followed by rows of ``value`` up to ``rows`` rows: one new tensor, one copy."""
    out = t.new_full((rows, *t.shape[1:]), value)
    out[:len(t)] = t
    return out


def _levels(keys: torch.Tensor, shape: tuple[int, int], kernel: int, pools, images: int,
            fast, rows: tuple[int, ...] | None = None):
    """Every level's tables from the first level's sorted keys (:func:`build_maps`), by
    ``fast`` (:mod:`lartpc.models.table_kernels`) or, for None, torch operations: (the
    levels, the last pool's sites and their image shape, the unpadded :func:`sizes`).

    With ``rows`` every level is written padded to them as :func:`pad_maps` pads (the
    keys' padding sorts last, a padding row's neighbours and pool slot are the zero and
    dropped rows, ``n_out`` is the capacity; the last pool's sites stay unpadded); None
    where the batch does not fit them or a pool leaves no site. Without, a pool that
    leaves no site ends the levels."""
    levels: list[Level] = []
    counts: list[int] = []
    r = kernel // 2
    if fast is not None:  # one index image for every level: the first is the largest
        grid = _grid(fast.cells(images, shape, kernel), keys.device)
    for i, size in enumerate(pools):
        n = len(keys)
        cap, out_cap = (None, None) if rows is None else (rows[i], rows[i + 1])
        if cap is not None and n > cap:
            return None
        if fast is not None:
            offsets = _window_offsets(r, shape[1] + 2 * r, keys.device)
            table, mirrored, slots, out_keys = fast.level(keys, shape, size, kernel, grid,
                                                          offsets, mirror=bool(levels),
                                                          capacity=cap)
            out_shape = (shape[0] // size, shape[1] // size)
        else:
            parts = split_keys(keys, shape)  # once for both (each part is a launch on a GPU)
            slots, out_keys, out_shape = pool_slots(keys, shape, size, parts)
            table = neighbour_table(keys, shape, kernel, images, parts, capacity=cap)
            mirrored = mirror(table) if levels else None
        n_out = len(out_keys)
        if cap is None:
            levels.append(Level(keys, shape, table, slots, n_out, mirrored))
        elif n_out == 0 or n_out > out_cap:
            return None
        else:
            padded_slots = _fill(slots, cap, out_cap)
            if shape[0] % size or shape[1] % size:  # dropped sites: the dropped row moves
                padded_slots[:n].masked_fill_(slots == n_out, out_cap)
            levels.append(Level(_fill(keys, cap, KEY_PAD), shape, table,
                                padded_slots, out_cap, mirrored))
        counts.append(n)
        keys, shape = out_keys, out_shape
        if n_out == 0:
            break
    return levels, keys, shape, (*counts, len(keys))


class _SubmConv(torch.autograd.Function):
    """Forward: one gather of the input rows (P, k*k*C) and one matrix product; the
    gathered rows are kept for the weight gradient. The input gradient scatters
    nothing: a submanifold neighbourhood is symmetric (j is i's neighbour at offset o
    exactly when i is j's at the mirrored offset k*k-1-o), so it is the output gradient
    times the weight, (P, k*k, C), gathered back through the mirrored table and summed
    over the offsets: no atomic adds, the same result on every run."""

    @staticmethod
    def forward(ctx, features, neighbours, weight, mirrored):
        n, kk, c = len(features), neighbours.shape[1], features.shape[1]
        rows = torch.cat([features, features.new_zeros(1, c)])
        cols = torch.index_select(rows, 0, neighbours.reshape(-1)).reshape(n, kk * c)
        w = weight.reshape(weight.shape[0], kk * c).to(cols.dtype)  # (C', k*k*C)
        ctx.save_for_backward(cols, neighbours, w, mirrored)
        ctx.weight_dtype, ctx.saved_shape = weight.dtype, weight.shape[1:]
        return cols @ w.t()

    @staticmethod
    def backward(ctx, grad):
        cols, neighbours, w, mirrored = ctx.saved_tensors
        n, kk = neighbours.shape
        c = cols.shape[1] // kk
        grad = grad.to(cols.dtype)
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            z = grad.new_empty(n * kk + kk, c)  # (grad @ w) as (n * kk, c), then zeros
            torch.mm(grad, w, out=z[: n * kk].view(n, kk * c))
            z[n * kk:].zero_()
            mirrored = mirror(neighbours) if mirrored is None else mirrored
            grad_features = torch.index_select(z, 0, mirrored).reshape(n, kk, c).sum(1)
        if ctx.needs_input_grad[2]:
            grad_weight = (grad.t() @ cols).reshape(-1, *ctx.saved_shape).to(ctx.weight_dtype)
        return grad_features, None, grad_weight, None


def mirror(neighbours: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of ``z`` = (output gradient @ weight) viewed as (P * k*k, C) plus k*k zero
    rows that each (site, offset) of the input gradient sums: its neighbour at the
    mirrored offset ``k*k-1-o``, row ``neighbour * k*k + o``. No neighbour (row P)
    reads ``P * k*k + o``, a zero row. Flat int32 (P * k*k,); a pure function of the
    table, so built with it (in the loader's thread), not in the backward. ``offsets``:
    ``arange(k*k)`` in the table's dtype where the caller makes its own (a CUDA graph,
    which must not read a cached tensor it does not hold)."""
    kk = neighbours.shape[1]
    if offsets is None:
        offsets = _arange(kk, neighbours.dtype, neighbours.device)
    return (neighbours.flip(1) * kk + offsets).view(-1)


@functools.lru_cache(maxsize=16)
def _arange(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.arange(n)``, made once per size, type and device (read only)."""
    return torch.arange(n, dtype=dtype, device=device)


def subm_conv(features: torch.Tensor, neighbours: torch.Tensor, weight: torch.Tensor,
              mirrored: torch.Tensor | None = None) -> torch.Tensor:
    """Submanifold convolution (no bias) of (P, C) ``features`` with spconv's weight
    layout (C', k, k, C); ``mirrored`` (:func:`mirror` of ``neighbours``) is made in the
    backward when not given."""
    return _SubmConv.apply(features, neighbours, weight, mirrored)


class _MaxPool(torch.autograd.Function):
    """Forward: ``amax`` of each slot's inputs and zero. Backward as spconv's: every
    input equal to its output gets the output's whole gradient (ties included)."""

    @staticmethod
    def forward(ctx, features, slots, n_out):
        out = features.new_zeros(n_out + 1, features.shape[1])
        out = out.scatter_reduce(0, slots[:, None].expand_as(features), features, "amax",
                                 include_self=True)
        ctx.save_for_backward(features, slots, out)
        return out[:n_out]

    @staticmethod
    def backward(ctx, grad):
        features, slots, out = ctx.saved_tensors
        grad = torch.cat([grad, grad.new_zeros(1, grad.shape[1])])  # dropped sites: none
        take = torch.index_select(grad, 0, slots)
        return take * (features == torch.index_select(out, 0, slots)), None, None


def max_pool(features: torch.Tensor, slots: torch.Tensor, n_out: int) -> torch.Tensor:
    """Sparse max-pool: ``max(0, max of each output site's inputs)`` (n_out, C)."""
    return _MaxPool.apply(features, slots, n_out)


def to_dense(features: torch.Tensor, keys: torch.Tensor, batch_size: int,
             shape: tuple[int, int]) -> torch.Tensor:
    """(B, C, h, w) map with the sites of ``keys`` filled, zeros elsewhere (spconv's
    ``.dense()``); a key B * h * w (a padding row, :func:`pad_maps`) is dropped."""
    n = batch_size * shape[0] * shape[1]
    flat = features.new_zeros(n + 1, features.shape[1]).index_copy(0, keys, features)
    return flat[:n].reshape(batch_size, shape[0], shape[1], -1).permute(0, 3, 1, 2)


def sizes(maps: SiteMaps) -> tuple[int, ...]:
    """The rows of each level's tables and of the last pool's output."""
    return (*(len(level.keys) for level in maps.levels), maps.levels[-1].n_out)


def pad_maps(maps: SiteMaps, capacities) -> SiteMaps:
    """The same tables with every level padded to ``capacities`` rows (one per entry of
    :func:`sizes`, each at least as large): static shapes, what a captured CUDA graph
    needs. A padding row reads only the zero row (row ``capacity`` now), its pool slot
    is the dropped row, and the padding rows of a pool's output are zeros that no real
    site reads, so the network's output and gradients are those of the unpadded
    tables."""
    have = sizes(maps)
    if len(capacities) != len(have) or any(c < h for c, h in zip(capacities, have,
                                                                   strict=True)):
        raise ValueError(f"capacities {tuple(capacities)} do not hold the sizes {have}")
    n_in = len(maps.indices)  # the input's rows (the order may be padded already)
    levels = []
    for level, rows, out in zip(maps.levels, capacities, capacities[1:], strict=False):
        slots = torch.where(level.slots == level.n_out, out, level.slots)  # dropped
        keys = _fill(level.keys, rows, KEY_PAD)  # stays sorted
        none = torch.where(level.neighbours == len(level.keys), rows, level.neighbours)
        table = _fill(none, rows, rows)
        levels.append(Level(keys, level.shape, table, _fill(slots, rows, out), out,
                            None if level.mirrored is None else mirror(table)))
    h, w = maps.out_shape
    return SiteMaps(maps.indices, maps.batch_size, maps.spatial_shape,
                    _fill(maps.order, capacities[0], n_in), levels,
                    _fill(maps.dense_index, capacities[-1], maps.batch_size * h * w),
                    maps.out_shape, maps.training, maps.unpadded or have)
