"""Per-rank loaders that yield :class:`~lartpc.data.batch.Batch` objects, three ways.

``dense``
    The paper's path: the shard is read once, densified and Blosc-compressed into RAM
    (:mod:`lartpc.data.blosc_cache`); each step decompresses the minibatch into a
    preallocated (pinned, with CUDA) buffer and copies it to the device.
``sparse``
    Events stay sparse; a batch is ``coords`` int32 (P, 3) = (batch index, row, col)
    and ``features`` float32 (P, 1), spconv's layout, built without densifying.
``device-dense``
    Beyond the paper: events stay sparse in RAM and are scattered into a dense
    buffer on the device, so the dense model needs no Blosc at all.

All three read the shard once at construction (``read_s``), prepare it (``prepare_s``)
and then yield one epoch per iteration, reshuffled by :func:`set_epoch`, with a
background thread (:mod:`lartpc.data.prefetch`) preparing the next batches.
Batches are views of rotating buffers: treat them as read-only and done with when the
next batch is requested.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np
import torch

from lartpc.data.batch import Batch
from lartpc.data.blosc_cache import BloscConfig, BloscImageCache
from lartpc.data.prefetch import n_slots, prefetch
from lartpc.data.sharding import epoch_batches
from lartpc.data.store import Event, EventStore
from lartpc.errors import ConfigError, LartpcError

log = logging.getLogger(__name__)

MODES = ("dense", "sparse", "device-dense")


class SparseEvents:
    """Pixels of many events in flat arrays (row, col int16; charge float32).

    A pixel listed twice keeps its last charge, as :meth:`Event.dense` does.
    """

    def __init__(self, events: list[Event], shape: tuple[int, int]):
        w = shape[1]
        rows, cols, charges = [], [], []
        for ev in events:
            flat = ev.row.astype(np.int64) * w + ev.col
            _, last = np.unique(flat[::-1], return_index=True)
            if len(last) < len(flat):  # duplicates: keep each pixel's last entry
                keep = np.sort(len(flat) - 1 - last)
                ev = Event(ev.row[keep], ev.col[keep], ev.charge[keep], ev.label)
            rows.append(ev.row), cols.append(ev.col), charges.append(ev.charge)
        self.offsets = np.zeros(len(events) + 1, np.int64)
        np.cumsum([len(c) for c in charges], out=self.offsets[1:])
        self.row, self.col = _concat(rows, np.int16), _concat(cols, np.int16)
        self.charge = _concat(charges, np.float32)

    @property
    def nbytes(self) -> int:
        return self.row.nbytes + self.col.nbytes + self.charge.nbytes + self.offsets.nbytes

    def gather(self, positions: np.ndarray) -> tuple[np.ndarray, ...]:
        """(batch index int64, row, col, charge) of the events at ``positions``, concatenated."""
        spans = [np.arange(self.offsets[p], self.offsets[p + 1]) for p in positions]
        sel = np.concatenate(spans) if spans else np.zeros(0, np.int64)
        bidx = np.repeat(np.arange(len(positions)), [len(s) for s in spans])
        return bidx, self.row[sel], self.col[sel], self.charge[sel]


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _stack_truth(events: list[Event]) -> dict[str, np.ndarray]:
    keys = set().union(*(e.truth for e in events)) if events else set()
    return {k: np.array([e.truth.get(k) for e in events]) for k in sorted(keys)}


class Loader:
    """Common part: read the shard, keep labels/ids/truth, iterate epochs.

    Attributes
    ----------
    read_s : seconds spent reading the shard from the store.
    prepare_s : seconds spent preparing it (densify + compress, or packing pixels).
    steps_per_epoch : batches one epoch yields.
    resident_bytes : RAM held for the events (compressed images or sparse pixels).
    """

    mode = ""

    def __init__(self, store: EventStore, indices: np.ndarray, batch_size: int = 7, *,
                 device: torch.device | str = "cpu", seed: int = 0, shuffle: bool = True,
                 steps_per_epoch: int | None = None, prefetch_depth: int = 1):
        self.indices = np.asarray(indices, np.int64)
        if len(self.indices) == 0:
            raise LartpcError(f"{store.paths[0].parent}: empty shard (no events for this rank)")
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.device = torch.device(device)
        self.shape = store.geometry.shape
        self.prefetch_depth = prefetch_depth
        self.epoch = 0
        self._steps = steps_per_epoch
        self._batches(0)  # validates batch_size / steps_per_epoch before any heavy work
        # Batch buffers are allocated and first touched (page faults, pinning) in a
        # thread while the shard is read, so that cost stays off the loading time.
        self._buffers: list[torch.Tensor] = []  # rotating batch buffers, created zeroed
        self._zeroed: set[int] = set()  # slots never written since creation
        failed: list[BaseException] = []

        def allocate() -> None:
            try:
                self._slot_buffer(0)  # later slots are made by the prefetch thread
            except BaseException as e:  # re-raised below, in the caller's thread
                failed.append(e)

        alloc = threading.Thread(target=allocate, name=f"{self.mode}-alloc", daemon=True)
        alloc.start()
        t0 = time.perf_counter()
        try:
            events = store.read_many(self.indices)
        finally:
            self.read_s = time.perf_counter() - t0
            alloc.join()
        if failed:
            raise failed[0]
        self.labels = np.array([e.label for e in events], np.int64)
        self.truth = _stack_truth(events)
        t0 = time.perf_counter()
        self._prepare(events)
        self.prepare_s = time.perf_counter() - t0
        log.info("%s loader: %d events, read %.2f s, prepared %.2f s, %.1f MB resident",
                 self.mode, len(self.indices), self.read_s, self.prepare_s,
                 self.resident_bytes / 1e6)

    # -- to be provided by each mode
    def _new_buffer(self) -> torch.Tensor:
        """A zeroed (B, 1, H, W) float32 batch buffer (dense modes only)."""
        raise NotImplementedError

    def _prepare(self, events: list[Event]) -> None:
        raise NotImplementedError

    def _produce(self, positions: np.ndarray, slot: int) -> Batch:
        """Host-side work for one batch (runs in the prefetch thread)."""
        raise NotImplementedError

    def _finish(self, batch: Batch) -> Batch:
        """Device-side work for one batch (runs in the consumer's thread)."""
        return batch.to(self.device, non_blocking=True)

    @property
    def resident_bytes(self) -> int:
        raise NotImplementedError

    # -- shared
    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def steps_per_epoch(self) -> int:
        return len(self._batches(self.epoch))

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the next iteration (same on every rank for a seed)."""
        self.epoch = int(epoch)

    def _batches(self, epoch: int) -> list[np.ndarray]:
        return epoch_batches(np.arange(len(self.indices)), self.batch_size, epoch, self.seed,
                             shuffle=self.shuffle, steps=self._steps)

    def _slot_buffer(self, slot: int) -> torch.Tensor:
        while len(self._buffers) <= slot:  # slots are first used in order 0, 1, ...
            self._buffers.append(self._new_buffer())
            self._zeroed.add(len(self._buffers) - 1)
        return self._buffers[slot]

    def _take_zeroed(self, slot: int) -> bool:
        """True (once) if buffer ``slot`` still holds the zeros it was created with."""
        if slot in self._zeroed:
            self._zeroed.discard(slot)
            return True
        return False

    def _host_batch(self, positions: np.ndarray, **tensors) -> Batch:
        return Batch(labels=torch.from_numpy(self.labels[positions]), shape=self.shape,
                     event_ids=self.indices[positions],
                     truth={k: v[positions] for k, v in self.truth.items()}, **tensors)

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate()

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """One epoch of batches, from step ``start`` on (a run resumed mid-epoch)."""
        batches = self._batches(self.epoch)[start:]
        slots = n_slots(self.prefetch_depth)
        items = prefetch(lambda k: self._produce(batches[k], k % slots), len(batches),
                         self.prefetch_depth, name=f"{self.mode}-loader")
        for b in items:
            yield self._finish(b)


class DenseBloscLoader(Loader):
    """The paper's path: Blosc-compressed dense images in RAM (see module docstring)."""

    mode = "dense"

    def __init__(self, *args, blosc: BloscConfig | None = None, **kw):
        self.blosc = blosc or BloscConfig()
        super().__init__(*args, **kw)

    def _prepare(self, events: list[Event]) -> None:
        self.cache = BloscImageCache(self.shape, self.blosc)
        self._pending: list[Event | None] = []  # events epoch 0 still has to compress
        if self.blosc.compress_at == "start":
            self.cache.add(events)
        else:
            self.cache.reserve(len(events))
            self._pending = list(events)
        self._copied: dict[int, torch.cuda.Event] = {}  # slot -> its host-to-device copy done

    def _new_buffer(self) -> torch.Tensor:
        shape = (self.batch_size, 1, *self.shape)
        if self.device.type == "cuda":
            return torch.zeros(shape, dtype=torch.float32, pin_memory=True)
        # calloc'd: pages are mapped on first write, so zero bands cost nothing until reused
        return torch.from_numpy(np.zeros(shape, np.float32))

    @property
    def resident_bytes(self) -> int:
        """Compressed images, plus the sparse events still waiting to be compressed."""
        pending = sum(e.row.nbytes + e.col.nbytes + e.charge.nbytes
                      for e in self._pending if e is not None)
        return self.cache.resident_bytes + pending

    @property
    def compress_s(self) -> float:
        """Seconds spent compressing so far (at start, or during the first epoch)."""
        return self.cache.compress_s

    def _produce(self, positions: np.ndarray, slot: int) -> Batch:
        if slot in self._copied:  # the previous copy out of this slot must be done
            self._copied.pop(slot).synchronize()
        buf = self._slot_buffer(slot)[: len(positions)]
        arr = buf.numpy()
        zeroed = self._take_zeroed(slot)
        for j, p in enumerate(positions):
            p = int(p)
            if self.cache.has(p):
                self.cache.decompress_into(p, arr[j, 0], zeroed=zeroed)
            else:  # first sight: densify straight into the batch, compress from there
                ev = self._pending[p]
                if zeroed:
                    arr[j, 0][ev.row, ev.col] = ev.charge
                else:
                    ev.dense(self.shape, out=arr[j, 0])
                self.cache.put(p, arr[j, 0], ev.row)
                self._pending[p] = None
        return self._host_batch(positions, dense=buf)

    def _finish(self, batch: Batch) -> Batch:
        if self.device.type != "cuda":
            return batch.to(self.device)
        out = batch.to(self.device, non_blocking=True)
        ptr = batch.dense.data_ptr()
        slot = next(i for i, h in enumerate(self._buffers) if h.data_ptr() == ptr)
        ev = torch.cuda.Event()
        ev.record()
        self._copied[slot] = ev
        return out


class SparseLoader(Loader):
    """Sparse batches: coords int32 (P, 3) = (batch index, row, col), features (P, 1)."""

    mode = "sparse"

    def _prepare(self, events: list[Event]) -> None:
        self.pixels = SparseEvents(events, self.shape)

    @property
    def resident_bytes(self) -> int:
        return self.pixels.nbytes

    def _produce(self, positions: np.ndarray, slot: int) -> Batch:
        bidx, row, col, charge = self.pixels.gather(positions)
        coords = np.empty((len(row), 3), np.int32)
        coords[:, 0], coords[:, 1], coords[:, 2] = bidx, row, col
        return self._host_batch(positions, coords=torch.from_numpy(coords),
                                features=torch.from_numpy(charge.reshape(-1, 1)))


class DeviceDenseLoader(SparseLoader):
    """Sparse events in RAM, scattered into a preallocated dense buffer on the device."""

    mode = "device-dense"

    def _new_buffer(self) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.from_numpy(np.zeros((self.batch_size, 1, *self.shape), np.float32))
        return torch.zeros((self.batch_size, 1, *self.shape), dtype=torch.float32,
                           device=self.device)

    def _produce(self, positions: np.ndarray, slot: int) -> _Scatter:
        bidx, row, col, charge = self.pixels.gather(positions)
        h, w = self.shape
        flat = torch.from_numpy(bidx * (h * w) + row.astype(np.int64) * w + col)
        batch = self._host_batch(positions, dense=self._slot_buffer(slot)[: len(positions)])
        job = _Scatter(batch, flat, torch.from_numpy(charge), self._take_zeroed(slot))
        if self.device.type == "cpu":  # all host work: do it here, in the prefetch thread
            job.run()
        return job  # device kernels are queued from the consumer's thread and stream

    def _finish(self, job: _Scatter) -> Batch:
        return job.run().to(self.device, non_blocking=True)


class _Scatter:
    """A device-dense batch waiting for its pixels to be scattered into ``batch.dense``."""

    __slots__ = ("batch", "flat", "vals", "zeroed", "done")

    def __init__(self, batch: Batch, flat: torch.Tensor, vals: torch.Tensor, zeroed: bool):
        self.batch, self.flat, self.vals, self.zeroed, self.done = batch, flat, vals, zeroed, False

    def run(self) -> Batch:
        if not self.done:
            dense = self.batch.dense
            if not self.zeroed:
                dense.zero_()
            dense.view(-1)[self.flat.to(dense.device)] = self.vals.to(dense.device)
            self.done = True
        return self.batch


_CLASSES = {"dense": DenseBloscLoader, "sparse": SparseLoader, "device-dense": DeviceDenseLoader}


def build_loader(store: EventStore, mode: str, indices: np.ndarray, batch_size: int = 7, *,
                 device: torch.device | str = "cpu", seed: int = 0, shuffle: bool = True,
                 steps_per_epoch: int | None = None, prefetch_depth: int = 1,
                 blosc: BloscConfig | None = None) -> Loader:
    """Build the loader of one rank.

    Parameters
    ----------
    store : the event store.
    mode : ``dense`` (Blosc, the paper), ``sparse`` or ``device-dense``.
    indices : store indices this rank owns (``ShardPlan.train_indices(rank)``).
    batch_size : events per step.
    device : where batches end up.
    seed : shuffle seed, shared by all ranks; each epoch reshuffles within the shard.
    shuffle : False for evaluation (store order).
    steps_per_epoch : force this many steps (``ShardPlan.steps_per_epoch``) so all
        ranks step together; default ``ceil(len(indices) / batch_size)``.
    prefetch_depth : batches prepared ahead by the background thread (0 = inline).
    blosc : compression settings of the ``dense`` mode.

    Returns
    -------
    Loader
        Iterate for one epoch of :class:`Batch`; ``set_epoch(e)`` before each epoch.
    """
    if mode not in _CLASSES:
        raise ConfigError(f"loader mode {mode!r}: choose from {', '.join(MODES)}")
    kw = {"blosc": blosc} if mode == "dense" else {}
    return _CLASSES[mode](store, indices, batch_size, device=device, seed=seed, shuffle=shuffle,
                          steps_per_epoch=steps_per_epoch, prefetch_depth=prefetch_depth, **kw)
