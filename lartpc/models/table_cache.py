"""SCNet's index tables made once per event and joined for each batch
(``data.table_cache = true``; :mod:`lartpc.models.sparse_torch` has the tables).

A batch's tables are a pure function of its images' coordinates, and its images are
independent: image ``b``'s sites are a run of every level's sorted keys, and its rows
of the neighbour table and pool slots point only into its own runs. So the tables of a
batch are its images' own tables put back to back, each image's keys moved by
``b * h * w`` and its rows by the sites before it. Without augmentation an event's
coordinates are the same every epoch, so its tables can be made once, when the loader
starts, and every batch is then one compiled pass per level over the batch's sites
(:func:`_join_level`): no sort, no index image, no hash.

What it costs: the start (all events' tables made in chunks of :data:`CHUNK` events by
:func:`~lartpc.models.sparse_torch.build_maps`, timed in the loader's start-up line) and
memory, ~56 bytes a site (the 5 x 5 neighbour rows, in int16 where every event has
fewer than 32,767 sites at that level, are 50 of them; ~0.3 MB a simulated event at
3600 x 3600, logged). The joined tables are those
:func:`~lartpc.models.sparse_torch.build_maps` makes for the batch, integer for integer,
unpadded or padded to a CUDA graph's capacities (``tests/test_table_cache.py``); a batch
that ends its levels early (a pool that leaves no site) or has no site is built by
``build_maps`` as before.

Stored per level, for all events back to back (numpy, on the CPU): the sites' keys in
their image (``y * w + x``, int32), the neighbour table in rows of the event (-1: none)
and each site's pool slot in the event's pooled sites (-1: left out by the pool), both
int16 where they fit; per event where its run starts. The last pool's sites (the dense
map's) as keys only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

import numba
import numpy as np
import torch

from lartpc.models import sparse_torch

log = logging.getLogger(__name__)

#: events a chunk of the start-up's building (one ``build_maps`` call each, then split)
CHUNK = 64
#: an event's rows are stored in int16 where every event has fewer sites than this at
#: that level, in int32 otherwise
SMALL_ROWS = int(np.iinfo(np.int16).max)
#: each level's room at the start: the first chunk's sites per input pixel times every
#: event's pixels, times this, plus :data:`SLACK` rows (only the rows filled are resident)
ROOM = 1.25
SLACK = 4096
_KEY_PAD = sparse_torch.KEY_PAD  #: a padding row's key: sorts after every site


@dataclass
class _Level:
    """One resolution's tables of every event, each event's a run from ``start``."""

    keys: np.ndarray  #: int32 (S,): y * w + x in the event's image, sorted per event
    table: np.ndarray | None  #: int16/32 (S, k*k): neighbour rows of the event, -1 none
    slots: np.ndarray | None  #: int16/32 (S,): row in the event's pooled sites, -1 dropped
    start: np.ndarray  #: int64 (E + 1,)
    shape: tuple[int, int]


@numba.njit(cache=True, nogil=True)
def _join_level(keys, table, slots, start, out_start, positions, hw, key_out, table_out,
                slots_out, mirrored, none, dropped):  # pragma: no cover - compiled
    """One level of a batch from its events' runs: keys moved to their image, rows and
    slots moved past the sites before them (``none`` / ``dropped`` where there is no
    neighbour or output), the rows after the sites padding (keys last, neighbours
    ``none``, slot ``dropped``); ``mirrored`` (length 0: not wanted) as
    :func:`sparse_torch.mirror` of the whole table."""
    kk = table_out.shape[1]
    row = 0
    orow = 0
    for j in range(len(positions)):
        p = positions[j]
        lo, hi = start[p], start[p + 1]
        base = j * hw
        for i in range(lo, hi):
            at = row + i - lo
            key_out[at] = base + keys[i]
            s = slots[i]
            slots_out[at] = dropped if s < 0 else s + orow
            for o in range(kk):
                v = table[i, o]
                table_out[at, o] = none if v < 0 else v + row
        row += hi - lo
        orow += out_start[p + 1] - out_start[p]
    for at in range(row, len(key_out)):
        key_out[at] = _KEY_PAD
        slots_out[at] = dropped
        for o in range(kk):
            table_out[at, o] = none
    if len(mirrored):
        for at in range(len(key_out)):
            for o in range(kk):
                mirrored[at * kk + o] = table_out[at, kk - 1 - o] * kk + o


@numba.njit(cache=True, nogil=True)
def _join_runs(values, start, positions, shift, out):  # pragma: no cover - compiled
    """``out[:n]`` = the events' runs of ``values`` back to back, each event's ``j *
    shift`` more (the dense map's keys: ``shift`` = h * w; the input order: 0 and the
    rows before, given as shift < 0)."""
    at = 0
    for j in range(len(positions)):
        p = positions[j]
        add = j * shift if shift >= 0 else at
        for i in range(start[p], start[p + 1]):
            out[at] = values[i] + add
            at += 1
    return at


def _warm() -> None:
    """Both joins compiled for the argument types :meth:`TableCache.join` passes (the
    stored rows in int16 or int32)."""
    i32, i64 = np.zeros(1, np.int32), np.zeros(1, np.int64)
    bounds = np.array([0, 1], np.int64)
    for rows in (np.int16, np.int32):
        _join_level(i32, np.zeros((1, 1), rows), np.zeros(1, rows), bounds, bounds, i64, 1,
                    np.empty(1, np.int64), np.empty((1, 1), np.int32),
                    np.empty(1, np.int64), np.empty(1, np.int32), 1, 1)
    _join_runs(i32, bounds, i64, 1, np.empty(1, np.int64))


class TableCache:
    """Every event's tables (see the module docstring), made from the loader's
    :class:`~lartpc.data.loader_base.SparseEvents` by ``build`` (``build_maps`` with
    the network's shape, kernel and pools bound); :meth:`join` makes a batch's."""

    def __init__(self, pixels, spatial_shape, kernel: int, pools, build) -> None:
        t0 = time.perf_counter()
        self.spatial_shape = (int(spatial_shape[0]), int(spatial_shape[1]))
        self.kernel, self.pools = kernel, tuple(pools)
        self.events = len(pixels.offsets) - 1
        shapes = [self.spatial_shape]
        for size in self.pools:
            shapes.append(sparse_torch.pooled_shape(shapes[-1], size))
        self.shapes = shapes
        sites = int(pixels.offsets[-1])
        order = _Column(sites)
        levels: list[_Columns] = []
        for first in range(0, self.events, CHUNK):
            positions = np.arange(first, min(first + CHUNK, self.events))
            chunk, chunk_order = self._chunk(pixels, positions, build)
            order.add(chunk_order)
            if not levels:  # room for every event's sites at the first chunk's ratios
                per_site = [len(part[0]) / max(len(chunk[0][0]), 1) for part in chunk]
                levels = [_Columns(int(sites * r * ROOM) + SLACK) for r in per_site]
            for columns, part in zip(levels, chunk, strict=True):
                columns.add(part)
        self.order = order.array(np.int32)
        levels = levels or [_Columns(0) for _ in shapes]  # no event
        self.levels = [c.level(shape) for c, shape in zip(levels, shapes, strict=True)]
        _warm()  # compiled (or loaded from numba's cache) here: before a loader's fork
        self.seconds = time.perf_counter() - t0

    @property
    def nbytes(self) -> int:
        arrays = [self.order] + [a for lv in self.levels
                                 for a in (lv.keys, lv.table, lv.slots, lv.start) if a is not None]
        return sum(a.nbytes for a in arrays)

    def _chunk(self, pixels, positions: np.ndarray, build):
        """The tables of the events at ``positions``, built as one batch and split into
        each event's: per level (keys, table, slots, counts), the last level keys and
        counts only; and each event's input order."""
        bidx, row, col, _ = pixels.gather(positions)
        coords = np.empty((len(row), 3), np.int32)
        coords[:, 0], coords[:, 1], coords[:, 2] = bidx, row, col
        n_img = len(positions)
        pixel_lo = np.searchsorted(bidx, np.arange(n_img + 1))
        maps = build(torch.from_numpy(coords), n_img) if len(row) else None
        kk = self.kernel * self.kernel
        out = []
        built = [] if maps is None else maps.levels
        keys_at = [lv.keys.numpy() for lv in built]
        if maps is not None and len(built) == len(self.pools):
            keys_at.append(maps.dense_index.numpy())
        for i, (h, w) in enumerate(self.shapes):
            keys = keys_at[i] if i < len(keys_at) else np.zeros(0, np.int64)
            lo = np.searchsorted(keys, np.arange(n_img + 1, dtype=np.int64) * (h * w))
            image = np.repeat(np.arange(n_img), np.diff(lo))
            local_keys = (keys - image * (h * w)).astype(np.int32)
            if i == len(self.pools):
                out.append((local_keys, None, None, np.diff(lo)))
                continue
            if i < len(built):
                table = built[i].neighbours.numpy()
                rows = np.where(table == len(keys), -1, table - lo[image][:, None])
                nxt = keys_at[i + 1] if i + 1 < len(keys_at) else np.zeros(0, np.int64)
                oh, ow = self.shapes[i + 1]
                out_lo = np.searchsorted(nxt, np.arange(n_img + 1, dtype=np.int64) * (oh * ow))
                slots = built[i].slots.numpy()
                slots = np.where(slots == built[i].n_out, -1, slots - out_lo[image])
            else:
                rows, slots = np.zeros((0, kk), np.int64), np.zeros(0, np.int64)
            # int16 where this chunk's events fit it (a level of chunks in both types is
            # int32 once concatenated: numpy's promotion)
            counts = np.diff(lo)
            small = np.int16 if counts.max(initial=0) < SMALL_ROWS else np.int32
            out.append((local_keys, rows.astype(small), slots.astype(small), counts))
        if maps is None:
            order = np.zeros(0, np.int32)
        else:
            first_row = np.repeat(pixel_lo[:-1], np.diff(pixel_lo))
            order = (maps.order.numpy() - first_row).astype(np.int32)
        return out, order

    def join(self, positions, coords: torch.Tensor, batch_size: int, training: bool = True,
             rows: tuple[int, ...] | None = None) -> sparse_torch.SiteMaps | None:
        """The tables of the batch of the events at ``positions`` whose coordinates are
        ``coords`` (held by the tables, as ``build_maps`` holds them), padded to
        ``rows`` where given and the batch fits them; None where ``build_maps`` must
        make them (no site, or a pool that leaves the batch no site). Coordinates of
        other events than ``positions``' are a ValueError where their counts show it
        (host integers: no read-back)."""
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        counts = [int(np.sum(lv.start[pos + 1] - lv.start[pos])) for lv in self.levels]
        if counts[0] != coords.shape[0] or len(pos) != batch_size:
            raise ValueError(f"table cache: the batch's coordinates ({coords.shape[0]} sites, "
                             f"batch_size={batch_size}) are not those of the events at its "
                             f"positions ({len(pos)} events, {counts[0]} sites)")
        if counts[0] == 0 or min(counts[1:]) == 0:
            return None
        if rows is not None and (len(rows) != len(counts)
                                 or any(c > r for c, r in zip(counts, rows, strict=True))):
            rows = None  # as build_maps: unpadded where the batch does not fit
        caps = counts if rows is None else list(rows)
        kk = self.kernel * self.kernel
        levels = []
        for i, lv in enumerate(self.levels[:-1]):
            nxt = self.levels[i + 1]
            keys = np.empty(caps[i], np.int64)
            table = np.empty((caps[i], kk), np.int32)
            slots = np.empty(caps[i], np.int64)
            mirrored = np.empty(caps[i] * kk if i else 0, np.int32)
            h, w = lv.shape
            _join_level(lv.keys, lv.table, lv.slots, lv.start, nxt.start, pos, h * w, keys,
                        table, slots, mirrored, caps[i], caps[i + 1])
            levels.append(sparse_torch.Level(
                torch.from_numpy(keys), lv.shape, torch.from_numpy(table),
                torch.from_numpy(slots), caps[i + 1], torch.from_numpy(mirrored) if i else None))
        last = self.levels[-1]
        h, w = last.shape
        dense = np.full(caps[-1], batch_size * h * w, np.int64)
        _join_runs(last.keys, last.start, pos, h * w, dense)
        order = np.full(caps[0], counts[0], np.int64)
        _join_runs(self.order, self.levels[0].start, pos, -1, order)
        return sparse_torch.SiteMaps(
            coords, int(batch_size), self.spatial_shape, torch.from_numpy(order), levels,
            torch.from_numpy(dense), last.shape, training,
            None if rows is None else tuple(counts))


class _Column:
    """An array filled chunk by chunk in place: the start's peak is the tables and one
    chunk, not the tables twice (chunks first, then their concatenation). ``capacity``
    is an estimate: its pages are only touched as rows arrive, and a column that runs
    out of room (or meets rows of a wider type) moves to a larger one."""

    def __init__(self, capacity: int) -> None:
        self.data: np.ndarray | None = None
        self.capacity, self.n = capacity, 0

    def add(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if self.data is None:
            self.data = np.empty((max(self.capacity, need),) + rows.shape[1:], rows.dtype)
        dtype = np.result_type(self.data.dtype, rows.dtype)
        if need > len(self.data) or dtype != self.data.dtype:
            wider = np.empty((max(need, len(self.data) * 3 // 2),) + self.data.shape[1:], dtype)
            wider[:self.n] = self.data[:self.n]
            self.data = wider
        self.data[self.n:need] = rows
        self.n = need

    def array(self, empty) -> np.ndarray:
        """The rows so far (dtype ``empty`` where none came)."""
        return np.zeros(0, empty) if self.data is None else self.data[:self.n]


class _Columns:
    """One level's keys, table, slots and per-event counts, filled chunk by chunk."""

    def __init__(self, capacity: int) -> None:
        self.keys, self.table, self.slots = (_Column(capacity) for _ in range(3))
        self.counts: list[np.ndarray] = []

    def add(self, part: tuple) -> None:
        keys, table, slots, counts = part
        self.keys.add(keys)
        self.counts.append(counts)
        if table is not None:  # None: the last level's, keys only
            self.table.add(table)
            self.slots.add(slots)

    def level(self, shape: tuple[int, int]) -> _Level:
        start = np.zeros(sum(len(c) for c in self.counts) + 1, np.int64)
        if self.counts:
            np.cumsum(np.concatenate(self.counts), out=start[1:])
        keys = self.keys.array(np.int32)
        if self.table.data is None:  # the last level, or no event
            return _Level(keys, None, None, start, shape)
        return _Level(keys, self.table.array(np.int16), self.slots.array(np.int16), start,
                      shape)


class CachedTables:
    """A table builder for the sparse loader (``data.table_cache``): the loader gives it
    its events once (:meth:`attach`, at its start) and each batch's positions; the
    tables are then joined from every event's own (:class:`TableCache`), on the CPU.
    Called without positions, or before :meth:`attach`, it is ``build``."""

    takes_positions = True  #: the loader passes ``positions=`` and host coordinates

    def __init__(self, build: partial) -> None:
        self.build = build
        self.cache: TableCache | None = None

    def attach(self, pixels) -> None:
        kw = self.build.keywords
        self.cache = TableCache(pixels, kw["spatial_shape"], kw["kernel"], kw["pools"],
                                partial(self.build, training=kw.get("training", True)))
        log.info("table cache: %d events' tables in %.2f s, %.1f MB",
                 self.cache.events, self.cache.seconds, self.cache.nbytes / 1e6)

    def __call__(self, coords: torch.Tensor, batch_size: int, rows=None, positions=None):
        maps = None  # build_maps' where the cache cannot serve
        if self.cache is not None and positions is not None and coords.device.type == "cpu":
            maps = self.cache.join(positions, coords, batch_size,
                                   self.build.keywords.get("training", True), rows)
        return self.build(coords, batch_size, rows=rows) if maps is None else maps
