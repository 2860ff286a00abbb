"""Per-rank loaders that yield :class:`~lartpc.data.batch.Batch` objects, three ways.

``dense``
    The paper's path: the shard is read once, densified and Blosc-compressed into RAM
    (:mod:`lartpc.data.blosc_cache`); each step decompresses the minibatch into a
    preallocated (pinned, with CUDA) buffer and copies it to the device. By default
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

import numpy as np
import torch

from lartpc.data.batch import Batch
from lartpc.data.blosc_cache import BloscConfig, BloscImageCache
from lartpc.data.loader_base import Loader, SparseEvents
from lartpc.data.store import Event, EventStore
from lartpc.errors import ConfigError

MODES = ("dense", "sparse", "device-dense")


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
    dense_batches = False

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
    dense_batches = True

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
