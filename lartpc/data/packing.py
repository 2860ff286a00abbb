"""Every tensor of a nested object in one byte buffer, and back as views of it.

A batch with its index tables holds some twenty tensors. Sent between processes one by
one, each would cost its own shared-memory segment and file descriptor; copied to a GPU
one by one, each its own copy. :func:`pack` writes them all into one ``uint8`` buffer,
the tensors of one dtype back to back (each such run at an offset aligned to 8 bytes),
and leaves a :class:`Skeleton`: the same object with every tensor replaced by its place
in the buffer. :func:`unpack` puts views of a buffer back in those places, wherever the
buffer now is (another process, the GPU): one copy moves the lot, and a run's views
come from one split. Walks tuples, lists, dicts and dataclasses; anything else is kept
as it is. A tensor held twice comes back as one view held twice (``SiteMaps.indices``
is the batch's ``coords``, and the model checks that identity).
"""

from __future__ import annotations

import dataclasses

import torch

ALIGN = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Place:
    """Where one tensor lies in a packed buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def walk(obj, leaf):
    """``obj`` with ``leaf(tensor)`` in place of every tensor it holds."""
    if isinstance(obj, torch.Tensor | Place):
        return leaf(obj)
    if isinstance(obj, tuple | list):
        return type(obj)(walk(v, leaf) for v in obj)
    if isinstance(obj, dict):
        return {k: walk(v, leaf) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: walk(getattr(obj, f.name), leaf)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


@dataclasses.dataclass(frozen=True, slots=True)
class Skeleton:
    """A packed object with :class:`Place` in its tensors' places (``tree``), and the
    places in runs of one dtype lying back to back in the buffer (``runs``)."""

    tree: object
    runs: tuple[tuple[Place, ...], ...]


def pack(obj, into: torch.Tensor | None = None) -> tuple[torch.Tensor, Skeleton]:
    """(one contiguous ``uint8`` CPU buffer holding every tensor of ``obj``, its
    skeleton). Tensors must be on the CPU. The buffer is the start of ``into`` (a
    ``uint8`` tensor) where it fits there, a new tensor otherwise.

    The tensors of one dtype lie back to back (each such run starts at a multiple of
    :data:`ALIGN` bytes), so :func:`unpack` makes a run's views with one split."""
    tensors: dict[int, torch.Tensor] = {}

    def collect(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            raise ValueError(f"pack: a {t.device} tensor; only CPU tensors are packed")
        tensors.setdefault(id(t), t)
        return t

    walk(obj, collect)
    places: dict[int, Place] = {}
    runs, gaps, size = [], [], 0
    for dtype in dict.fromkeys(t.dtype for t in tensors.values()):  # first-seen order
        start = -(-size // ALIGN) * ALIGN
        gaps.append((size, start))
        size, run = start, []
        for key, t in tensors.items():
            if t.dtype == dtype:
                places[key] = Place(size, dtype, tuple(t.shape))
                run.append(places[key])
                size += t.numel() * t.element_size()
        runs.append(tuple(run))
    gaps.append((size, -(-size // ALIGN) * ALIGN))
    size = gaps[-1][1]
    fits = into is not None and into.numel() >= size
    buffer = into[:size] if fits else torch.empty(size, dtype=torch.uint8)
    for key, t in tensors.items():
        p = places[key]
        buffer[p.offset: p.offset + t.numel() * t.element_size()].view(t.dtype).copy_(
            t.reshape(-1))
    for lo, hi in gaps:
        buffer[lo:hi].zero_()  # equal objects pack to equal bytes
    return buffer, Skeleton(walk(obj, lambda t: places[id(t)]), tuple(runs))


def _numel(p: Place) -> int:
    n = 1
    for s in p.shape:
        n *= s
    return n


def unpack(buffer: torch.Tensor, skeleton: Skeleton):
    """The packed object with views of ``buffer`` (any device) in its tensors' places:
    per run of one dtype a slice and a split, then a reshape per tensor (the loader's
    thread does this for every batch)."""
    views: dict[Place, torch.Tensor] = {}
    for run in skeleton.runs:
        numels = [_numel(p) for p in run]
        start = run[0].offset
        flat = buffer[start: start + sum(numels) * run[0].dtype.itemsize].view(run[0].dtype)
        for p, v in zip(run, flat.split(numels), strict=True):
            views[p] = v.view(p.shape)
    return walk(skeleton.tree, views.__getitem__)
