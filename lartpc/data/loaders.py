"""Per-rank loaders that yield :class:`~lartpc.data.batch.Batch` objects, three ways.

``blosc``
    The paper's path: the shard is read once, densified and Blosc-compressed into RAM
    (:mod:`lartpc.data.blosc_cache`); each step decompresses the minibatch into a
    preallocated (pinned, with CUDA) buffer, clearing only the bands the buffer's last
    image wrote, and copies it to the device on a stream of its own. By default
    each event is compressed when epoch 0 first densifies it (``compress_at``), not
    all up front, so the loading time is little more than the read.
``sparse``
    Events stay sparse; a batch is ``coords`` int32 (P, 3) = (batch index, row, col)
    and ``features`` float32 (P, 1), spconv's layout, built without densifying.
``device-dense``
    Beyond the paper: events stay sparse in RAM and are scattered into a dense
    buffer on the device, so the dense model needs no Blosc at all.

The shared machinery (reading, epochs, prefetch, buffers) is in
:mod:`lartpc.data.loader_base`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from lartpc.data import LOADERS, processes
from lartpc.data.batch import Batch
from lartpc.data.blosc_cache import BloscConfig, BloscImageCache
from lartpc.data.loader_base import Loader, SparseEvents
from lartpc.data.packing import pack, unpack
from lartpc.data.processes import Processes
from lartpc.data.store import Event, EventStore
from lartpc.errors import ConfigError
from lartpc.models import sparse_torch


class DenseBloscLoader(Loader):
    """The paper's path: Blosc-compressed dense images in RAM (see module docstring).

    A slot's record is, per batch row, the bands its last image wrote: the next image
    clears only those it does not overwrite (a median event touches 23 of 225 bands at
    full resolution). On CUDA the prefetch thread also copies each pinned batch to the
    device on a stream of its own, so the copy of batch k+1 runs while the model
    computes on batch k instead of queueing behind it.
    """

    mode = "blosc"

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
        self._copied: dict[int, torch.cuda.Event] = {}  # slot -> its host-to-device copy
        self._copy_stream = (loader_stream(self.device)
                             if self.device.type == "cuda" else None)

    def _new_buffer(self) -> torch.Tensor:
        shape = (self.batch_per_rank, 1, *self.shape)
        if self.device.type == "cuda":
            return torch.zeros(shape, dtype=torch.float32, pin_memory=True)
        # calloc'd: pages are mapped on first write, so zero bands cost nothing until reused
        return torch.from_numpy(np.zeros(shape, np.float32))

    def _nothing_written(self) -> list:
        return [[] for _ in range(self.batch_per_rank)]

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

    def _produce(self, positions: np.ndarray, slot: int) -> Batch | _Copied:
        if slot in self._copied:  # the previous copy out of this slot must be done
            self._copied.pop(slot).synchronize()
        buf = self._slot_buffer(slot)[: len(positions)]
        arr = buf.numpy()
        bands = self._begin_write(slot)
        if bands is None:  # unknown: clear every row
            bands = [None] * self.batch_per_rank
        for j, p in enumerate(positions):
            p = int(p)
            if self.cache.has(p):
                bands[j] = self.cache.decompress_into(p, arr[j, 0], stale=bands[j])
                continue
            # first sight: densify straight into the batch, compress from there
            ev = self._pending[p]
            if bands[j] is None:
                ev.dense(self.shape, out=arr[j, 0])
            else:
                self.cache.clear_bands(arr[j, 0], bands[j])
                arr[j, 0][ev.row, ev.col] = ev.charge
            self.cache.put(p, arr[j, 0], ev.row)
            bands[j] = self.cache.bands(p)
            self._pending[p] = None
        self._end_write(slot, bands)
        batch = self._host_batch(positions, dense=buf)
        if self._copy_stream is None:
            return batch
        with torch.cuda.device(self.device), torch.cuda.stream(self._copy_stream):
            out = batch.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._copy_stream)
        self._copied[slot] = done
        return _Copied(out, done)

    def _finish(self, item: Batch | _Copied) -> Batch:
        if not isinstance(item, _Copied):
            return item.to(self.device)
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(item.done)  # the model's kernels start once the copy is in
        for t in (item.batch.dense, item.batch.labels):
            t.record_stream(stream)  # allocated on the copy stream, used on this one
        return item.batch


def loader_stream(device: torch.device) -> torch.cuda.Stream:
    """A CUDA stream for a loader's copies and tables: from torch's pool of high-priority
    streams. torch hands out its pool's streams in turn, the default-priority ones to
    anyone who asks (the CUDA graph's capture stream among them): a loader thread's
    stream could be the very stream a graph was being captured on, its copies then
    recorded into the graph (seen on the H200, 2026-11-28, with 8 prefetch threads a
    loader: new threads each epoch, new streams). No stream of the other pool is ever
    one the training captures on."""
    return torch.cuda.Stream(device=device, priority=-1)


def _to_device(stream: torch.cuda.Stream, view: torch.Tensor) -> torch.Tensor:
    """``view`` copied to ``stream``'s device on ``stream``, back once the copy is done
    (``view`` may then be overwritten): one DMA from page-locked memory, else staged by
    the driver; no pinned memory of torch's is allocated."""
    with torch.cuda.device(stream.device), torch.cuda.stream(stream):
        copy = view.to(stream.device, non_blocking=True)
    stream.synchronize()
    return copy


def _slot_to_device(stream: torch.cuda.Stream, view: torch.Tensor) -> torch.Tensor:
    """A batch in a loader process's slot copied as :func:`_to_device` copies it. Only
    the slot's first :data:`~lartpc.data.processes.LOCKED_BYTES` are page-locked: a
    batch longer than that is first copied into page-locked memory of torch's (one DMA
    from a range only partly locked is not one the driver promises to get right)."""
    if view.numel() > processes.LOCKED_BYTES:
        view = view.pin_memory()
    return _to_device(stream, view)


class _Copied:
    """A batch on its way to the GPU on the loader's copy stream; ``done`` marks arrival."""

    __slots__ = ("batch", "done", "packed")

    def __init__(self, batch: Batch, done: torch.cuda.Event, packed: bool = False):
        #: ``packed``: every tensor of the batch is a view of one copy
        self.batch, self.done, self.packed = batch, done, packed


class SparseLoader(Loader):
    """Sparse batches: coords int32 (P, 3) = (batch index, row, col), features (P, 1).

    With ``rulebooks`` (a model's ``f(coords, batch_size)``, ``data.rulebooks = loader``)
    the prefetch thread also builds each batch's spconv rulebooks, handed over in
    ``batch.rulebooks``; on CUDA it copies the coordinates to the device and builds them
    there on a stream of its own, and the consumer's stream waits for that stream. A
    builder that keeps tables per event (``data.table_cache``, ``takes_positions``) is
    given the events when the loader starts and each batch's positions; it joins the
    tables on the CPU, and on CUDA the batch and its tables go to the device as one copy.

    With ``processes`` (``data.loader_processes``) each batch, tables included, is made on
    the CPU by one of that many forked processes (:mod:`lartpc.data.processes`) and comes
    back as one buffer, on CUDA copied to the device in one copy on the prefetch thread's
    stream; one prefetch thread drives each process.
    """

    mode = "sparse"
    dense_batches = False
    threads_allowed = True  # a batch is a pure function of its positions

    def __init__(self, *args, rulebooks: Callable | None = None, processes: int = 0, **kw):
        self._rulebooks = rulebooks
        self._streams = threading.local()  # each prefetch thread builds on its own stream
        self.processes = processes
        self._pool: Processes | None = None  # started by _prepare
        if processes:  # one prefetch thread drives each process
            kw["prefetch_threads"] = processes
        super().__init__(*args, **kw)

    def _prepare(self, events: list[Event]) -> None:
        self.pixels = SparseEvents(events, self.shape)
        attach = getattr(self._rulebooks, "attach", None)
        if attach is not None:  # a table cache: every event's tables, before any fork
            attach(self.pixels)
        if self.processes:  # forked here, from the constructor's thread, with the events
            if self._rulebooks is not None:  # compiled once here, not in every process
                sparse_torch.warm_cpu_tables()
            self._pool = Processes(self._made_elsewhere, self.processes,
                                   name=f"{self.mode}-loader")
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    self._pool.page_lock()

    def _stream(self) -> torch.cuda.Stream | None:
        """This thread's CUDA stream (None off CUDA)."""
        if self.device.type != "cuda":
            return None
        if getattr(self._streams, "stream", None) is None:
            self._streams.stream = loader_stream(self.device)
        return self._streams.stream

    @property
    def resident_bytes(self) -> int:
        return self.pixels.nbytes

    def close(self) -> None:
        super().close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _coords(self, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's coords int32 (P, 3) and features float32 (P, 1), on the host."""
        bidx, row, col, charge = self.pixels.gather(positions)
        coords = np.empty((len(row), 3), np.int32)
        coords[:, 0], coords[:, 1], coords[:, 2] = bidx, row, col
        return torch.from_numpy(coords), torch.from_numpy(charge.reshape(-1, 1))

    def _made_elsewhere(self, positions: np.ndarray, state) -> tuple:
        """What a loader process makes of one batch (on the CPU): labels, coords,
        features and, with a builder, its tables (built with the builder's ``state`` as
        the loader had it when it asked: the graph's padded sizes)."""
        coords, features = self._coords(positions)
        tables = None
        if self._rulebooks is not None:
            if state is not None:
                self._rulebooks.restore(state)  # this process's own copy of the builder
            tables = self._tables(coords, positions)
        return torch.from_numpy(self.labels[positions]), coords, features, tables

    def _tables(self, coords: torch.Tensor, positions: np.ndarray):
        """The builder's tables for the batch of ``positions`` with ``coords``."""
        if getattr(self._rulebooks, "takes_positions", False):
            return self._rulebooks(coords, len(positions), positions=positions)
        return self._rulebooks(coords, len(positions))

    def _produce_elsewhere(self, positions: np.ndarray) -> Batch | _Copied:
        """One batch made by a loader process: on CUDA, its one buffer copied to the
        device on this thread's stream straight from the process's (page-locked) slot,
        every tensor a view of the copy."""
        snapshot = getattr(self._rulebooks, "snapshot", None)
        state = snapshot() if snapshot else None
        stream = self._stream()
        if stream is None:
            buffer, skeleton = self._pool(positions, state, stop=self._stopping)
            labels, coords, features, tables = unpack(buffer, skeleton)
            return replace(self._host_batch(positions), labels=labels, coords=coords,
                           features=features, rulebooks=tables)
        copy, skeleton = self._pool(positions, state, take=partial(_slot_to_device, stream),
                                    stop=self._stopping)
        done = torch.cuda.Event()
        done.record(stream)  # already reached (the copy was waited for): no wait
        labels, coords, features, tables = unpack(copy, skeleton)
        return _Copied(replace(self._host_batch(positions), labels=labels, coords=coords,
                               features=features, rulebooks=tables), done, packed=True)

    def _produce(self, positions: np.ndarray, slot: int) -> Batch | _Copied:
        if self.processes:
            return self._produce_elsewhere(positions)
        coords, features = self._coords(positions)
        batch = self._host_batch(positions, coords=coords, features=features)
        if self.device.type == "cuda":
            return self._produce_cuda(batch, positions)
        if self._rulebooks is None:
            return batch
        return replace(batch, rulebooks=self._tables(batch.coords, positions))

    def _produce_cuda(self, batch: Batch, positions: np.ndarray) -> Batch | _Copied:
        """``batch`` (on the host) readied for a GPU on this thread: pinned, or with a
        builder sent to the device with its tables (built there on this thread's stream,
        or joined on the CPU by a table cache)."""
        if self._rulebooks is not None and getattr(self._rulebooks, "takes_positions", False):
            return self._joined_to_device(batch, positions)
        # Pinned here, in the prefetch thread: the consumer's non-blocking copy is then
        # queued behind the step in flight; from pageable memory the driver may first
        # wait for the device to drain (issue 36: a host-bound step's idle GPU)
        batch = replace(batch, labels=batch.labels.pin_memory(),
                        coords=batch.coords.pin_memory(),
                        features=batch.features.pin_memory())
        if self._rulebooks is None:
            return batch
        stream = self._stream()
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            # labels and features too: the step's thread then copies nothing (issue 36)
            labels, coords, features = (t.to(self.device, non_blocking=True) for t in (
                batch.labels, batch.coords, batch.features))
            rulebooks = self._rulebooks(coords, batch.data_size)
            done = torch.cuda.Event()
            done.record(stream)
        return _Copied(replace(batch, labels=labels, coords=coords, features=features,
                               rulebooks=rulebooks), done)

    def _joined_to_device(self, batch: Batch, positions: np.ndarray) -> _Copied:
        """A batch whose tables the builder joins on the CPU (a table cache): the batch
        and its tables packed into this thread's page-locked buffer and copied to the
        device on this thread's stream in one copy, every tensor a view of it (as a
        loader process's batch)."""
        tables = self._tables(batch.coords, positions)
        pinned = getattr(self._streams, "pinned", None)
        buffer, skeleton = pack((batch.labels, batch.coords, batch.features, tables),
                                into=pinned)
        if pinned is None or buffer.data_ptr() != pinned.data_ptr():  # grown: 1.5x
            pinned = torch.empty(buffer.numel() * 3 // 2, dtype=torch.uint8).pin_memory()
            self._streams.pinned = pinned
            buffer = pinned[:buffer.numel()].copy_(buffer)
        stream = self._stream()
        copy = _to_device(stream, buffer)  # waited for: the buffer is free again after
        done = torch.cuda.Event()
        done.record(stream)
        labels, coords, features, tables = unpack(copy, skeleton)
        return _Copied(replace(batch, labels=labels, coords=coords, features=features,
                               rulebooks=tables), done, packed=True)

    def _finish(self, item: Batch | _Copied) -> Batch:
        if not isinstance(item, _Copied):
            return super()._finish(item)
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(item.done)  # the step's kernels start once the rulebooks are built
        rb = item.batch.rulebooks
        # allocated on the loader's stream, used on this one; from a loader process every
        # tensor is a view of one copy, and marking one view marks the copy
        b = item.batch
        held = [b.coords] if item.packed else [  # (packed: views of one copy)
            b.labels, b.coords, b.features, *([] if rb is None else rb.tensors())]
        for t in held:
            if t.is_cuda:
                t.record_stream(stream)
        return item.batch.to(self.device, non_blocking=True)


class DeviceDenseLoader(SparseLoader):
    """Sparse events in RAM, scattered into a preallocated dense buffer on the device.

    A slot's record is the flat indices its last batch wrote: the next batch sets just
    those back to zero instead of clearing the whole buffer.
    """

    mode = "device-dense"
    dense_batches = True
    threads_allowed = False  # a slot's record needs its batches made in order

    def _new_buffer(self) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.from_numpy(np.zeros((self.batch_per_rank, 1, *self.shape), np.float32))
        buffer = torch.zeros((self.batch_per_rank, 1, *self.shape), dtype=torch.float32,
                             device=self.device)
        # Filled on this (prefetch) thread's stream, scattered into on the consumer's,
        # which need not be ordered after it: wait for the fill (once a slot).
        torch.cuda.current_stream(self.device).synchronize()
        return buffer

    def _nothing_written(self) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.int64, device=self.device)

    def _produce(self, positions: np.ndarray, slot: int) -> _Scatter:
        bidx, row, col, charge = self.pixels.gather(positions)
        h, w = self.shape
        flat = torch.from_numpy(bidx * (h * w) + row.astype(np.int64) * w + col)
        vals = torch.from_numpy(charge)
        batch = self._host_batch(positions, dense=self._slot_buffer(slot)[: len(positions)],
                                 dense_reused=True)
        if self.device.type == "cpu":  # all host work: do it here, in the prefetch thread
            job = _Scatter(self, slot, batch, flat, vals)
            job.run()
            return job
        # page-locked here, so the consumer's copies are queued without waiting: a copy
        # from pageable memory waits for the consumer's stream, i.e. for the last step
        # (which the step's time would then count as waiting for data); torch's pinned
        # allocator keeps each block until its copy is done
        batch = replace(batch, labels=batch.labels.pin_memory())  # the same for its labels
        return _Scatter(self, slot, batch, flat.pin_memory(), vals.pin_memory())

    def _finish(self, job: _Scatter) -> Batch:
        return job.run().to(self.device, non_blocking=True)


class _Scatter:
    """A device-dense batch waiting for its pixels to be scattered into its slot's buffer.

    Jobs of one loader run in one thread, in batch order, so each finds its slot's
    record as the slot's previous batch left it.
    """

    __slots__ = ("loader", "slot", "batch", "flat", "vals", "done")

    def __init__(self, loader: DeviceDenseLoader, slot: int, batch: Batch, flat: torch.Tensor,
                 vals: torch.Tensor):
        self.loader, self.slot, self.batch = loader, slot, batch
        self.flat, self.vals, self.done = flat, vals, False

    def run(self) -> Batch:
        """The batch, its pixels scattered (once: a job already run is not run again)."""
        if not self.done:
            whole = self.loader._slot_buffer(self.slot).view(-1)  # a short batch is a prefix
            stale = self.loader._begin_write(self.slot)
            if stale is None:
                whole.zero_()
            else:
                whole[stale] = 0.0
            flat = self.flat.to(whole.device, non_blocking=True)
            whole[flat] = self.vals.to(whole.device, non_blocking=True)
            self.loader._end_write(self.slot, flat)
            self.done = True
        return self.batch


#: each mode's class, by its name (the names config allows are ``LOADERS``)
_CLASSES = {cls.mode: cls for cls in (DenseBloscLoader, SparseLoader, DeviceDenseLoader)}


def build_loader(store: EventStore, mode: str, indices: np.ndarray, batch_per_rank: int = 7, *,
                 device: torch.device | str = "cpu", seed: int = 0, shuffle: bool = True,
                 steps_per_epoch: int | None = None, prefetch_depth: int = 1,
                 blosc: BloscConfig | None = None, orient: str = "none",
                 rulebooks: Callable | None = None, prefetch_threads: int = 1,
                 processes: int = 0) -> Loader:
    """Build the loader of one rank.

    Parameters
    ----------
    store : the event store.
    mode : ``blosc`` (Blosc, the paper), ``sparse`` or ``device-dense``.
    indices : store indices this rank owns (``ShardPlan.train_indices(rank)``).
    batch_per_rank : events per step (the last batch of a shard may be shorter).
    device : where batches end up.
    seed : shuffle seed, shared by all ranks; each epoch reshuffles within the shard.
    shuffle : False for evaluation (store order).
    steps_per_epoch : force this many steps (``ShardPlan.steps_per_epoch``) so all
        ranks step together; default ``ceil(len(indices) / batch_per_rank)``.
    prefetch_depth : batches prepared ahead by the background thread (0 = inline).
    blosc : compression settings of the ``blosc`` mode.
    orient : ``none``, or ``start``: each event turned by the start-finding stage
        (:mod:`lartpc.data.orient`) as it is read.
    rulebooks : ``sparse`` mode only: ``f(coords, batch_size)`` building a sparse
        model's rulebooks for each batch in the prefetch thread (``data.rulebooks =
        loader``); None: the model builds them in its forward.
    prefetch_threads : ``sparse`` mode only: threads preparing batches, each a whole
        batch in turn (the order is kept); more than one pays where one thread cannot
        keep up with the step (tables built on a GPU, ``data.prefetch_threads``).
    processes : ``sparse`` mode only: forked processes making the batches and their
        tables on the CPU (``data.loader_processes``; 0 = none, the prefetch threads
        make them); one prefetch thread drives each, ``prefetch_threads`` unused. The
        tables must be the torch layers' (spconv's pair builders for a GPU run there).

    Returns
    -------
    Loader
        Iterate for one epoch of :class:`Batch`; ``set_epoch(e)`` before each epoch.
    """
    if mode not in _CLASSES:
        raise ConfigError(f"loader mode {mode!r}: choose from {', '.join(LOADERS)}")
    kw = {"blosc": blosc} if mode == "blosc" else {}
    if rulebooks is not None:
        if mode != "sparse":
            raise ConfigError(f"rulebooks built in the loader need the sparse loader, not "
                              f"{mode!r}")
        kw["rulebooks"] = rulebooks
    if processes:
        if mode != "sparse":
            raise ConfigError(f"loader processes ({processes}) make the sparse loader's "
                              f"batches, not the {mode!r} loader's")
        if prefetch_threads > 1:
            raise ConfigError(f"loader processes ({processes}) with prefetch_threads="
                              f"{prefetch_threads}: one thread drives each process; set one "
                              "of the two")
        kw["processes"] = processes
    return _CLASSES[mode](store, indices, batch_per_rank, device=device, seed=seed, shuffle=shuffle,
                          steps_per_epoch=steps_per_epoch, prefetch_depth=prefetch_depth,
                          orient=orient, prefetch_threads=prefetch_threads, **kw)
