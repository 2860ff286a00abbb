"""Every tensor of a nested object in one byte buffer, and back as views of it.

A batch with its index tables holds some twenty tensors. Sent between processes one by
one, each would cost its own shared-memory segment and file descriptor; copied to a GPU
one by one, each its own copy. :func:`pack` writes them all into one ``uint8`` buffer
(each at an offset aligned to 8 bytes) and leaves a *skeleton*: the same object with
every tensor replaced by its place in the buffer. :func:`unpack` puts views of a buffer
back in those places, wherever the buffer now is (another process, the GPU): one copy
moves the lot. Walks tuples, lists, dicts and dataclasses; anything else is kept as
it is. A tensor held twice comes back as one view held twice (``SiteMaps.indices`` is
the batch's ``coords``, and the model checks that identity).
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


def pack(obj, into: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
    """(one contiguous ``uint8`` CPU buffer holding every tensor of ``obj``, its
    skeleton). Tensors must be on the CPU. The buffer is the start of ``into`` (a
    ``uint8`` tensor) where it fits there, a new tensor otherwise."""
    places: dict[int, Place] = {}
    tensors: list[tuple[Place, torch.Tensor]] = []
    size = 0

    def place(t: torch.Tensor) -> Place:
        nonlocal size
        if t.device.type != "cpu":
            raise ValueError(f"pack: a {t.device} tensor; only CPU tensors are packed")
        if id(t) not in places:
            places[id(t)] = p = Place(size, t.dtype, tuple(t.shape))
            tensors.append((p, t))
            size += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        return places[id(t)]

    skeleton = walk(obj, place)
    fits = into is not None and into.numel() >= size
    buffer = into[:size] if fits else torch.empty(size, dtype=torch.uint8)
    ends = [p.offset for p, _ in tensors[1:]] + [size]
    for (p, t), end in zip(tensors, ends, strict=True):
        stop = p.offset + t.numel() * t.element_size()
        buffer[p.offset: stop].view(t.dtype).copy_(t.reshape(-1))
        buffer[stop: end].zero_()  # the alignment gap: equal batches pack to equal bytes
    return buffer, skeleton


def unpack(buffer: torch.Tensor, skeleton):
    """The packed object with views of ``buffer`` (any device) in its tensors' places."""
    views: dict[Place, torch.Tensor] = {}

    def view(p: Place) -> torch.Tensor:
        if p not in views:
            n = 1
            for s in p.shape:
                n *= s
            views[p] = buffer[p.offset: p.offset + n * p.dtype.itemsize].view(p.dtype).view(
                p.shape)
        return views[p]

    return walk(skeleton, view)
