"""SCNet's padded index tables built by one CUDA graph a batch (issue 36).

On an H200 the loader's thread spent ~2.5 ms of Python a batch launching the ~130
operations of :func:`~lartpc.models.sparse_torch.build_maps` (torch operations or the
Triton kernels of :mod:`~lartpc.models.table_kernels`, ~18 us of host time each, under
the interpreter's lock), more than the graphed training step they feed (1.7 ms;
BENCHMARKS.md). A graphed training pads every batch's tables to fixed capacities
(:class:`~lartpc.train.padding.Capacities`), so every table has a shape fixed by the
capacities alone; what kept the build out of a graph was its read-backs: the pooled
sites' count (``unique``) and whether the keys came sorted. :func:`static_tables`
builds the same padded tables, integer for integer, with neither:

- the coordinates sit in a buffer of ``rows[0]`` rows, those past the batch's marked
  by image index -1; their keys are sorted always (a padding row's key, the largest
  int64, sorts last);
- a level's neighbour table is read from an index image with a border, as
  ``build_maps`` reads it; a padding row writes its row into a cell of its own past
  the images (no two writers share a cell) and reads nothing from the table;
- a pool's output sites: instead of ``unique`` (whose count is a read-back), each
  kept site marks its output cell in an image of the pooled level, a cumulative sum
  over that image gives every marked cell its rank, which is the site's slot, and the
  output keys (the marked cells themselves) are written at their ranks; the count is
  the sum's last entry;
- every level's count comes back in one small tensor, read once after the graph:
  whether the batch fitted the capacities, and its unpadded sizes.

:class:`TableGraph` captures it once per capacities (on CUDA; one per loader thread
building at the same time) and replays it per batch: two writes into the coordinate
buffer, one replay, two copies of its outputs (each table a view of one int32 or one
int64 buffer: the tables handed over are the batch's own, not the graph's, which the
next replay overwrites) and the one read-back: about six launches for ~130. A pool
keeps the graphs between batches and epochs (a loader's threads are new each epoch).
Without CUDA the same runs eagerly (what the tests check, under
``sparse_torch.TABLES = "graph"``); on a CPU it is slower than ``build_maps`` (the
pooled images' sums and the sort cost more than ``unique`` there), so only a
GPU uses it by default (``auto``).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

import torch

from lartpc.models import sparse_torch
from lartpc.models.sparse_torch import (
    KEY_PAD,
    Level,
    SiteMaps,
    mirror,
    pooled_shape,
    site_keys,
    split_keys,
)

log = logging.getLogger(__name__)


#: held while any CUDA graph of this process is captured (here and by the training's
#: step, :mod:`lartpc.train.graphed`): torch's capture context synchronises the device
#: and empties the allocator's cache (``cudaFree``) as it begins, which must not happen
#: while another thread captures; the two captures come together when the capacities
#: grow (the step's new graph, then the loader's for its next batch)
CAPTURE_LOCK = threading.Lock()

#: devices (``str(device)``) where the graph's tables failed (the capture raised, or its
#: first batch's tables were not ``build_maps``'): built as before from then on; and
#: those where its first batch's tables matched
FAILED: set[str] = set()
WORKED: set[str] = set()


@dataclass(frozen=True)
class Plan:
    """What fixes every shape of a batch's padded tables."""

    images: int
    shape: tuple[int, int]
    kernel: int
    pools: tuple[int, ...]
    rows: tuple[int, ...]  #: capacities, one per entry of ``sparse_torch.sizes``

    def shapes(self) -> list[tuple[int, int]]:
        """Each level's image shape, then the last pool's output shape."""
        out = [self.shape]
        for size in self.pools:
            out.append(pooled_shape(out[-1], size))
        return out

    def grid_cells(self) -> int:
        """The index image's cells, the most any level needs: its images with their
        borders, then a cell for each padding row with a border's reach either side."""
        r = self.kernel // 2
        return max(self.images * (h + 2 * r) * (w + 2 * r) + 2 * (r * (w + 2 * r) + r) + cap
                   for (h, w), cap in zip(self.shapes(), self.rows[:-1], strict=False))

    def mark_cells(self) -> int:
        """The first pool's output image (the largest), and a cell for dropped sites."""
        h, w = self.shapes()[1]
        return self.images * h * w + 1

    def layout(self) -> tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, tuple]]]:
        """(name, shape) of every int32 and every int64 output, in buffer order."""
        kk = self.kernel * self.kernel
        i32: list[tuple[str, tuple[int, ...]]] = []
        i64: list[tuple[str, tuple]] = [("order", (self.rows[0],)),
                                        ("dense_index", (self.rows[-1],))]
        for i, cap in enumerate(self.rows[:-1]):
            i32.append((f"neighbours{i}", (cap, kk)))
            if i:
                i32.append((f"mirrored{i}", (cap * kk,)))
            i64 += [(f"keys{i}", (cap,)), (f"slots{i}", (cap,))]
        i64.append(("counts", (len(self.rows),)))
        return i32, i64


def static_tables(coords: torch.Tensor, plan: Plan, grid: torch.Tensor,
                  marks: torch.Tensor) -> dict[str, torch.Tensor]:
    """The padded tables of the batch in ``coords`` (``plan.rows[0]`` rows, those past
    the batch's with image index -1), by name as :meth:`Plan.layout` lists them, with
    operations whose shapes depend on ``plan`` alone and no read-back. ``grid``: int32,
    all -1, of :meth:`Plan.grid_cells`; ``marks``: int32, all 0, of at least
    :meth:`Plan.mark_cells`; both are left so. ``counts``: each level's sites, then the
    last pool's (a count past its capacity: the batch did not fit)."""
    dev, images = coords.device, plan.images
    valid = coords[:, 0] >= 0
    n0 = valid.sum()
    keys, order = torch.sort(torch.where(valid, site_keys(coords, plan.shape), KEY_PAD),
                             stable=True)
    out = {"order": torch.where(order < n0, order, n0)}  # padding rows read row n
    counts = [n0]
    shapes = plan.shapes()
    for i, size in enumerate(plan.pools):
        cap, out_cap = plan.rows[i], plan.rows[i + 1]
        (h, w), (oh, ow) = shapes[i], shapes[i + 1]
        valid = keys != KEY_PAD
        b, y, x = split_keys(torch.where(valid, keys, 0), (h, w))
        table = _neighbours(valid, b, y, x, (h, w), plan, cap, grid)
        out[f"keys{i}"], out[f"neighbours{i}"] = keys, table
        if i:
            kk = table.shape[1]
            out[f"mirrored{i}"] = mirror(table, torch.arange(kk, dtype=table.dtype, device=dev))
        oy, ox = y // size, x // size
        kept = valid & (oy < oh) & (ox < ow)
        dropped = images * oh * ow  # the cell of dropped sites and padding rows
        okey = torch.where(kept, (b * oh + oy) * ow + ox, dropped)
        marks.index_fill_(0, okey, 1)
        marks[dropped:dropped + 1].zero_()
        rank = torch.cumsum(marks[:dropped + 1], 0, dtype=torch.int64)
        n_out = rank[-1]
        slot = torch.index_select(rank, 0, okey) - 1
        slots = torch.where(kept & (slot < out_cap), slot, out_cap)
        marks.index_fill_(0, okey, 0)
        pooled = torch.full((out_cap + 1,), KEY_PAD, dtype=torch.int64, device=dev)
        pooled.scatter_reduce_(0, slots, torch.where(kept, okey, KEY_PAD), "amin")
        out[f"slots{i}"], keys = slots, pooled[:out_cap]  # row out_cap: the dropped ones'
        counts.append(n_out)
    h, w = shapes[-1]
    out["dense_index"] = torch.where(keys != KEY_PAD, keys, images * h * w)
    out["counts"] = torch.stack(counts)
    return out


def _neighbours(valid, b, y, x, shape, plan: Plan, cap: int, grid) -> torch.Tensor:
    """The (cap, k*k) int32 neighbour table of a level (``build_maps``' padded one):
    each site's row written into the index image, every row's k*k cells read back, the
    written cells set back to -1. Padding rows write and read cells of their own past
    the images, and their entries are the zero row, ``cap``."""
    (h, w), r = shape, plan.kernel // 2
    hp, wp = h + 2 * r, w + 2 * r
    reach = r * wp + r
    at = torch.arange(cap, device=b.device)
    cell = torch.where(valid, b * (hp * wp) + y * wp + x + reach,
                       plan.images * hp * wp + reach + at)
    grid.index_copy_(0, cell, at.to(torch.int32))
    # made here, not taken from the cache: a graph must hold every tensor it reads
    offsets = sparse_torch.window_offsets(r, wp, b.device)
    table = torch.index_select(grid, 0, (cell[:, None] + offsets).view(-1)).view(cap, -1)
    grid.index_fill_(0, cell, -1)
    return torch.where((table < 0) | ~valid[:, None], cap, table)


class TableGraph:
    """:func:`static_tables` for one :class:`Plan` on one device, with its own buffers;
    captured as a CUDA graph on CUDA (``capture``), run eagerly otherwise. Call it with
    a batch's coordinates for its padded :class:`SiteMaps`, or None where the batch does
    not fit the capacities or a pool leaves no site (``build_maps`` then builds them)."""

    def __init__(self, plan: Plan, device: torch.device, capture: bool):
        self.plan = plan
        self.coords = torch.full((plan.rows[0], 3), -1, dtype=torch.int64, device=device)
        self.grid = torch.full((plan.grid_cells(),), -1, dtype=torch.int32, device=device)
        self.marks = torch.zeros(plan.mark_cells(), dtype=torch.int32, device=device)
        self.layout, self.shapes = plan.layout(), plan.shapes()  # once, not per batch
        i32, i64 = self.layout
        self.flat32 = torch.empty(sum(math.prod(s) for _, s in i32), dtype=torch.int32,
                                  device=device)
        self.flat64 = torch.empty(sum(math.prod(s) for _, s in i64), dtype=torch.int64,
                                  device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.replays = 0
        #: on CUDA, recorded where the last user gave it back (:class:`_Pool`)
        self.released: torch.cuda.Event | None = None
        if capture:
            self._capture()

    def _run(self) -> None:
        """The tables of the coordinate buffer into the two output buffers."""
        out = static_tables(self.coords, self.plan, self.grid, self.marks)
        i32, i64 = self.layout
        torch.cat([out[name].reshape(-1) for name, _ in i32], out=self.flat32)
        torch.cat([out[name].reshape(-1) for name, _ in i64], out=self.flat64)

    def _capture(self) -> None:
        """Warm up eagerly (the allocator's blocks, the sort's and sum's scratch), then
        capture, on this thread's stream: a loader thread's own, which no other thread
        launches on (a side stream from torch's pool could be another thread's, whose
        work the capture would take in). Where that is the default stream, which cannot
        capture, on one of the high-priority pool, which no training captures on
        (``lartpc.data.loaders.loader_stream``). Only this thread's calls are checked
        during the capture (``thread_local``): the training's thread steps meanwhile."""
        here = torch.cuda.current_stream()
        stream = here
        if here == torch.cuda.default_stream(here.device):
            stream = torch.cuda.Stream(device=here.device, priority=-1)
            stream.wait_stream(here)
        with torch.cuda.stream(stream), CAPTURE_LOCK:
            self._run()
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                self._run()
            finally:
                graph.capture_end()
        if stream != here:
            here.wait_stream(stream)
        self.graph = graph
        log.info("SCNet's tables: captured as a CUDA graph for padded sizes %s",
                 self.plan.rows)

    def __call__(self, coords: torch.Tensor, spatial_shape, training: bool
                 ) -> SiteMaps | None:
        n = len(coords)
        if n == 0 or n > self.plan.rows[0]:
            return None
        self.coords[:n].copy_(coords)
        self.coords[n:, 0].fill_(-1)
        if self.graph is None:
            self._run()
        else:
            self.graph.replay()
            self.replays += 1
        flat32, flat64 = self.flat32.clone(), self.flat64.clone()
        counts = flat64[-len(self.plan.rows):].tolist()  # the one read-back
        if min(counts) == 0 or any(c > cap for c, cap in zip(counts, self.plan.rows,
                                                               strict=True)):
            return None
        t = _views(flat32, self.layout[0]) | _views(flat64, self.layout[1])
        plan, shapes = self.plan, self.shapes
        levels = [Level(t[f"keys{i}"], shapes[i], t[f"neighbours{i}"], t[f"slots{i}"],
                        plan.rows[i + 1], t.get(f"mirrored{i}"))
                  for i in range(len(plan.pools))]
        return SiteMaps(coords, plan.images, tuple(spatial_shape), t["order"], levels,
                        t["dense_index"], shapes[-1], training, tuple(counts),
                        held=(flat32, flat64))


def _views(flat: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """The named tensors of one output buffer, as views of it."""
    parts = torch.split(flat, [math.prod(s) for _, s in layout])
    return {name: part.view(shape) for (name, shape), part in zip(layout, parts, strict=True)}


class _Pool:
    """The graphs not in use, by device: a loader's prefetch threads are new each epoch,
    and a capture (~2 builds' time) each epoch and thread would cost more than it saves.
    A thread takes one for the batch it builds and gives it back after; on CUDA it is
    handed over with an event, so that the next thread's replay (on its own stream)
    waits for the last one's. Graphs for other capacities are dropped as met."""

    def __init__(self):
        self._lock = threading.Lock()
        self.free: dict[str, list[TableGraph]] = {}

    def take(self, plan: Plan, device: torch.device) -> TableGraph:
        with self._lock:
            free = self.free.setdefault(str(device), [])
            free[:] = [g for g in free if g.plan == plan]  # smaller capacities: freed
            mine = free.pop() if free else None
        if mine is None:
            return TableGraph(plan, device, capture=device.type == "cuda")
        if mine.released is not None:
            torch.cuda.current_stream(device).wait_event(mine.released)
        return mine

    def give_back(self, graph: TableGraph, device: torch.device) -> None:
        if device.type == "cuda":
            graph.released = torch.cuda.Event()
            graph.released.record(torch.cuda.current_stream(device))
        with self._lock:
            self.free.setdefault(str(device), []).append(graph)

    def drop(self, device: torch.device) -> None:
        with self._lock:
            self.free.pop(str(device), None)


POOL = _Pool()


def build(coords: torch.Tensor, batch_size: int, spatial_shape, kernel: int, pools,
          training: bool, rows: tuple[int, ...], check: bool, fall_back: bool
          ) -> SiteMaps | None:
    """The padded tables of ``build_maps(..., rows=rows)`` by this thread's graph; None
    where it cannot (``build_maps`` then builds them). With ``check`` (``auto``'s first
    batch on a device) they are compared with ``build_maps``' own; with ``fall_back``
    (``auto``) a failure (a capture that raises) or a difference is a warning, and the
    graph is not used on that device again; without, a failure is raised."""
    plan = Plan(int(batch_size), (int(spatial_shape[0]), int(spatial_shape[1])), int(kernel),
                tuple(int(p) for p in pools), tuple(int(r) for r in rows))
    where = str(coords.device)
    try:
        graph = POOL.take(plan, coords.device)
        maps = graph(coords, spatial_shape, training)
        POOL.give_back(graph, coords.device)
    except Exception as e:  # noqa: BLE001 - whatever the capture raises on this device
        if not fall_back:
            raise
        return _failed(coords.device, f"{type(e).__name__}: "
                                      f"{(str(e).splitlines() or [''])[0]}")
    if check and maps is not None:
        want = sparse_torch.build_maps(coords, batch_size, spatial_shape, kernel, pools,
                                       training, rows, tables="torch")
        if not same(maps, want):
            return _failed(coords.device, "its tables differ from build_maps'")
        WORKED.add(where)
    return maps


def _failed(device: torch.device, why: str) -> None:
    FAILED.add(str(device))
    POOL.drop(device)
    log.warning("SCNet's tables as a CUDA graph failed on %s (%s); they are built as "
                "before", device, why)
    return None


def same(a: SiteMaps, b: SiteMaps) -> bool:
    """The same tables, integer for integer, and the same sizes."""
    def equal(x, y):
        return (x is None) == (y is None) and (x is None or (
            x.dtype == y.dtype and x.shape == y.shape and bool(torch.equal(x, y))))

    if (a.out_shape, a.unpadded, len(a.levels)) != (b.out_shape, b.unpadded, len(b.levels)):
        return False
    if not (equal(a.order, b.order) and equal(a.dense_index, b.dense_index)):
        return False
    return all(la.shape == lb.shape and la.n_out == lb.n_out and all(
        equal(getattr(la, f), getattr(lb, f)) for f in ("keys", "neighbours", "slots",
                                                          "mirrored"))
        for la, lb in zip(a.levels, b.levels, strict=True))
