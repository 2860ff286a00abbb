"""What every per-rank loader shares (see :mod:`lartpc.data.loaders` for the modes).

A loader reads its shard once at construction (``read_s``), prepares it
(``prepare_s``), then yields one epoch per iteration, reshuffled by ``set_epoch``, with
a background thread (:mod:`lartpc.data.prefetch`) preparing the next batches.
The dense modes' batches are views of rotating buffers: treat a batch as read-only and
done with when the next batch is requested. One iteration at a time; a closed loader
(:meth:`Loader.close`) iterates no more.

What keeps the loading time (DLT, construction to first batch) close to the read:
the first batch buffer is allocated in a thread while the shard is read, and buffers
start zeroed so their first batch writes only hit pixels. What keeps each later batch
cheap: a buffer slot remembers what its last batch wrote (:meth:`Loader._begin_write`),
so only that is cleared, not the whole 51.8 MB image per event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np
import torch

from lartpc.data import ORIENTS
from lartpc.data.batch import Batch
from lartpc.data.orient import check_resolution
from lartpc.data.orient import orient as orient_event
from lartpc.data.prefetch import n_slots, prefetch
from lartpc.data.sharding import batch_sizes, epoch_batches
from lartpc.data.store import Event, EventStore
from lartpc.errors import LartpcError

log = logging.getLogger(__name__)



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
    orient_s : seconds spent turning its events (``orient="start"``; 0 otherwise).
    prepare_s : seconds spent preparing it (densify + compress, or packing pixels).
    steps_per_epoch : batches one epoch yields.
    resident_bytes : RAM held for the events (compressed images or sparse pixels).
    """

    mode = ""
    dense_batches = True  # batches carry ``dense`` (rotating preallocated buffers)
    #: whether ``_produce`` may run in several threads at once (``prefetch_threads``);
    #: the dense modes' buffer records assume one thread, in batch order
    threads_allowed = False

    def __init__(self, store: EventStore, indices: np.ndarray, batch_per_rank: int = 7, *,
                 device: torch.device | str = "cpu", seed: int = 0, shuffle: bool = True,
                 steps_per_epoch: int | None = None, prefetch_depth: int = 1,
                 orient: str = "none", prefetch_threads: int = 1):
        if orient not in ORIENTS:
            raise LartpcError(f"orient {orient!r}: choose from {', '.join(ORIENTS)}")
        if orient == "start":
            check_resolution(store.geometry, f"{store.paths[0].parent} (orient 'start')")
        self.indices = np.asarray(indices, np.int64)
        if len(self.indices) == 0:
            raise LartpcError(f"{store.paths[0].parent}: empty shard (no events for this rank)")
        self.batch_per_rank, self.seed, self.shuffle = batch_per_rank, seed, shuffle
        self.device = torch.device(device)
        self.shape = store.geometry.shape
        self.prefetch_depth = prefetch_depth
        if prefetch_threads < 1:
            raise LartpcError(f"prefetch_threads={prefetch_threads}: at least 1")
        if prefetch_threads > 1 and not self.threads_allowed:
            raise LartpcError(f"prefetch_threads={prefetch_threads}: the {self.mode} loader "
                              f"prepares its batches in one thread (the sparse loader takes "
                              f"several)")
        self.prefetch_threads = prefetch_threads
        self.epoch = 0
        self._iterating = False
        self._closed = False
        #: set once the running iteration's consumer is done (finished, failed or closed
        #: early): a producer waiting on something gives up (:func:`prefetch`'s ``stop``)
        self._stopping = threading.Event()
        self._steps = steps_per_epoch
        self._batches(0)  # validates batch_per_rank / steps_per_epoch before any heavy work
        # Batch buffers are allocated and first touched (page faults, pinning) in a
        # thread while the shard is read, so that cost stays off the loading time.
        self._buffers: list[torch.Tensor] = []  # rotating batch buffers, created zeroed
        # slot -> what its last batch wrote (the mode's record); absent: still all zeros
        self._written: dict[int, object] = {}
        failed: list[BaseException] = []

        def allocate() -> None:
            try:
                if self.dense_batches:  # later slots are made by the prefetch thread
                    self._slot_buffer(0)
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
        self.orient_s = 0.0
        if orient == "start":
            t0 = time.perf_counter()
            for ev in events:
                orient_event(ev, store.geometry)
            self.orient_s = time.perf_counter() - t0
        self.labels = np.array([e.label for e in events], np.int64)
        self.truth = _stack_truth(events)
        t0 = time.perf_counter()
        self._prepare(events)
        self.prepare_s = time.perf_counter() - t0
        log.info("%s loader: %d events, read %.2f s, %sprepared %.2f s, %.1f MB resident",
                 self.mode, len(self.indices), self.read_s,
                 f"oriented {self.orient_s:.2f} s, " if orient == "start" else "",
                 self.prepare_s, self.resident_bytes / 1e6)

    # -- to be provided by each mode
    def _new_buffer(self) -> torch.Tensor:
        """A zeroed (B, 1, H, W) float32 batch buffer (dense modes only)."""
        raise NotImplementedError

    def _nothing_written(self) -> object:
        """The record of a fresh, all-zero buffer (dense modes only)."""
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

    def close(self) -> None:
        """Release what outlives an iteration (the sparse loader's processes); the
        loader iterates no more."""
        self._closed = True

    # -- shared
    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def steps_per_epoch(self) -> int:
        return len(batch_sizes(len(self.indices), self.batch_per_rank, self._steps))

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the next iteration (same on every rank for a seed)."""
        self.epoch = int(epoch)

    def _batches(self, epoch: int) -> list[np.ndarray]:
        return epoch_batches(np.arange(len(self.indices)), self.batch_per_rank, epoch, self.seed,
                             shuffle=self.shuffle, steps=self._steps)

    def _slot_buffer(self, slot: int) -> torch.Tensor:
        while len(self._buffers) <= slot:  # slots are first used in order 0, 1, ...
            self._buffers.append(self._new_buffer())
            self._written[len(self._buffers) - 1] = self._nothing_written()
        return self._buffers[slot]

    def _begin_write(self, slot: int) -> object:
        """What buffer ``slot``'s last batch wrote, as the mode recorded it, or None when
        that is unknown (clear the whole buffer). Until :meth:`_end_write` the slot
        counts as unknown, so a batch that fails half-way never leaves a record that
        understates what the buffer holds."""
        return self._written.pop(slot, None)

    def _end_write(self, slot: int, record: object) -> None:
        self._written[slot] = record

    def _host_batch(self, positions: np.ndarray, **tensors) -> Batch:
        return Batch(labels=torch.from_numpy(self.labels[positions]), shape=self.shape,
                     event_ids=self.indices[positions],
                     truth={k: v[positions] for k, v in self.truth.items()}, **tensors)

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate()

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """One epoch of batches, from step ``start`` on (a run resumed mid-epoch)."""
        batches = self._batches(self.epoch)[start:]
        slots = n_slots(self.prefetch_depth, self.prefetch_threads)
        if self._closed:
            raise LartpcError(f"{self.mode} loader: closed (close() was called); build "
                              f"another to iterate again")
        if self._iterating:  # two producers would share the rotating buffers
            raise LartpcError(f"{self.mode} loader: an iteration is still running; finish or "
                              f"close it before starting another")
        self._iterating = True
        self._stopping = threading.Event()
        items = prefetch(lambda k: self._produce(batches[k], k % slots), len(batches),
                         self.prefetch_depth, name=f"{self.mode}-loader",
                         workers=self.prefetch_threads, stop=self._stopping)
        try:
            for b in items:
                yield self._finish(b)
        finally:
            # Its threads stopped and joined now: left to the garbage collector, they
            # would run on while a handler holds the exception that ended this epoch
            # (its traceback keeps the generator), beside the next iteration's.
            items.close()
            self._iterating = False
