"""Every tensor of a nested object in one byte buffer, and back as views of it.

A batch with its index tables holds some twenty tensors. Sent between processes one by
one, each would cost its own shared-memory segment and file descriptor; copied to a GPU
one by one, each its own copy. :func:`pack` writes them all into one ``uint8`` buffer,
the tensors of one dtype back to back (each such run at an offset aligned to 8 bytes),
and leaves a :class:`Skeleton`: the object's form (its containers, with the places of
its tensors and of its other values), its other values, and where each tensor lies.
:func:`unpack` puts views of a buffer back in those places, wherever the buffer now is
(another process, the GPU): one copy moves the lot, and a run's views come from one
split. Walks tuples, lists, dicts and dataclasses; anything else is a value, kept as it
is. A tensor held twice comes back as one view held twice (``SiteMaps.indices`` is the
batch's ``coords``, and the model checks that identity).

The training process unpacks every batch a loader process makes, with the interpreter's
lock held while the step's thread waits for it, so unpacking is kept cheap: the form is
plain nested tuples (unpickled in C, not object by object), and what rebuilds an object
of a given form is made once (:func:`_builder`, cached) and reused by every batch of
that form, instead of walking the object anew.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

ALIGN = 8

# the kinds of node in a form: (kind, ...)
_TENSOR, _VALUE, _SEQUENCE, _DICT, _DATACLASS = range(5)


@dataclasses.dataclass(frozen=True)
class Skeleton:
    """A packed object without its tensors.

    ``form``: its containers as nested tuples, ``(_TENSOR, i)`` in the place of its
    i-th tensor (first seen first), ``(_VALUE, j)`` in the place of ``values[j]``.
    ``runs``: per run of one dtype in the buffer, ``(offset, dtype, numels, shapes)``
    of its tensors lying back to back. ``where[i]``: the i-th tensor's position among
    the runs' tensors, in their order."""

    form: tuple
    values: tuple
    runs: tuple[tuple[int, torch.dtype, tuple[int, ...], tuple[tuple[int, ...], ...]], ...]
    where: tuple[int, ...]


def _describe(obj, tensors: dict[int, tuple[int, torch.Tensor]], values: list) -> tuple:
    """``obj``'s form (see :class:`Skeleton`), its tensors added to ``tensors`` (id:
    (index, tensor), first seen first) and its other values to ``values``."""
    if isinstance(obj, torch.Tensor):
        return _TENSOR, tensors.setdefault(id(obj), (len(tensors), obj))[0]
    if isinstance(obj, tuple | list):
        start = len(values)
        parts = tuple(_describe(v, tensors, values) for v in obj)
        if type(obj) is tuple and all(p[0] == _VALUE for p in parts):
            del values[start:]  # a tuple of values (a shape, say) is one value
            values.append(obj)
            return _VALUE, start
        return _SEQUENCE, type(obj), parts
    if isinstance(obj, dict):
        return _DICT, tuple(obj), tuple(_describe(v, tensors, values) for v in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = tuple(f.name for f in dataclasses.fields(obj) if f.init)
        return _DATACLASS, type(obj), names, tuple(
            _describe(getattr(obj, n), tensors, values) for n in names)
    values.append(obj)
    return _VALUE, len(values) - 1


def walk(obj, leaf):
    """``obj`` with ``leaf(tensor)`` in place of every tensor it holds (once for a tensor
    held twice, whose result is then held twice)."""
    tensors: dict[int, tuple[int, torch.Tensor]] = {}
    values: list = []
    form = _describe(obj, tensors, values)
    return _builder(form)([leaf(t) for _, t in tensors.values()], tuple(values))


def pack(obj, into: torch.Tensor | None = None) -> tuple[torch.Tensor, Skeleton]:
    """(one contiguous ``uint8`` CPU buffer holding every tensor of ``obj``, its
    skeleton). Tensors must be on the CPU. The buffer is the start of ``into`` (a
    ``uint8`` tensor) where it fits there, a new tensor otherwise.

    The tensors of one dtype lie back to back (each such run starts at a multiple of
    :data:`ALIGN` bytes), so :func:`unpack` makes a run's views with one split."""
    tensors: dict[int, tuple[int, torch.Tensor]] = {}
    values: list = []
    form = _describe(obj, tensors, values)
    seen = [t for _, t in tensors.values()]
    for t in seen:
        if t.device.type != "cpu":
            raise ValueError(f"pack: a {t.device} tensor; only CPU tensors are packed")
    runs, where, offsets, gaps, size = [], [0] * len(seen), [], [], 0
    for dtype in dict.fromkeys(t.dtype for t in seen):  # first-seen order
        start = -(-size // ALIGN) * ALIGN
        gaps.append((size, start))
        size, numels, shapes = start, [], []
        for i, t in enumerate(seen):
            if t.dtype == dtype:
                where[i] = len(offsets)
                offsets.append((size, t))
                numels.append(t.numel())
                shapes.append(tuple(t.shape))
                size += t.numel() * t.element_size()
        runs.append((start, dtype, tuple(numels), tuple(shapes)))
    gaps.append((size, -(-size // ALIGN) * ALIGN))
    size = gaps[-1][1]
    fits = into is not None and into.numel() >= size
    buffer = into[:size] if fits else torch.empty(size, dtype=torch.uint8)
    for offset, t in offsets:
        buffer[offset: offset + t.numel() * t.element_size()].view(t.dtype).copy_(
            t.reshape(-1))
    for lo, hi in gaps:
        buffer[lo:hi].zero_()  # equal objects pack to equal bytes
    return buffer, Skeleton(form, tuple(values), tuple(runs), tuple(where))


def unpack(buffer: torch.Tensor, skeleton: Skeleton):
    """The packed object with views of ``buffer`` (any device) in its tensors' places:
    per run of one dtype a slice and a split, a reshape per tensor of more than one
    dimension, then the form's builder (the loader's thread does this for every
    batch)."""
    flat = []
    for start, dtype, numels, shapes in skeleton.runs:
        run = buffer[start: start + sum(numels) * dtype.itemsize].view(dtype)
        flat += [v if len(s) == 1 else v.view(s)
                 for v, s in zip(run.split(numels), shapes, strict=True)]
    views = [flat[k] for k in skeleton.where]
    return _builder(skeleton.form)(views, skeleton.values)


@functools.lru_cache(maxsize=64)
def _builder(form: tuple) -> Callable[[list, tuple], object]:
    """What makes an object of ``form`` from its tensors' views and its values: made
    once per form (a loader's batches share a few)."""
    kind = form[0]
    if kind == _TENSOR:
        i = form[1]
        return lambda views, values: views[i]
    if kind == _VALUE:
        j = form[1]
        return lambda views, values: values[j]
    if kind == _SEQUENCE:
        cls, parts = form[1], [_builder(p) for p in form[2]]
        return lambda views, values: cls([p(views, values) for p in parts])
    if kind == _DICT:
        keys, parts = form[1], [_builder(p) for p in form[2]]
        return lambda views, values: {k: p(views, values)
                                      for k, p in zip(keys, parts, strict=True)}
    cls, names, parts = form[1], form[2], [_builder(p) for p in form[3]]
    return lambda views, values: cls(**{n: p(views, values)
                                        for n, p in zip(names, parts, strict=True)})
