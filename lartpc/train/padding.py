"""SCNet's index tables padded to fixed sizes for ``train.cuda_graph`` (issue 36): the
capacities (rows per level) that only grow, shared by the loader's thread and the graphed
step (:class:`Capacities`), and the table builder the loader calls, whose tables come
padded to them (:class:`Padding`). Padding changes no result
(:func:`~lartpc.models.sparse_torch.pad_maps`); it gives every table a shape a captured
graph can replay (:mod:`lartpc.train.graphed`)."""

from __future__ import annotations

import threading

import torch

from lartpc.models import sparse_torch

#: padded row counts are multiples of this (small: the last levels have a few dozen
#: sites of 128-256 channels, and a CPU pays for every padded row)
MULTIPLE = 32
#: a batch that does not fit grows the capacities to this many times its own sizes
HEADROOM = 1.25


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _holds(rows: tuple[int, ...] | None, need) -> bool:
    """Do capacities ``rows`` hold sizes ``need``, level by level?"""
    return rows is not None and len(rows) == len(need) and all(
        n <= c for n, c in zip(need, rows, strict=True))


class Capacities:
    """The padded sizes (rows per level, :func:`~lartpc.models.sparse_torch.sizes`)
    shared by the loader's thread and the step; they only grow."""

    def __init__(self, multiple: int = MULTIPLE, headroom: float = HEADROOM):
        self.multiple, self.headroom = multiple, headroom
        self.rows: tuple[int, ...] | None = None
        self._lock = threading.Lock()

    def fit(self, need) -> tuple[int, ...]:
        """The capacities, grown first where ``need`` does not fit them."""
        with self._lock:
            if not _holds(self.rows, need):
                old = self.rows if self.rows is not None and len(self.rows) == len(need) \
                    else (-1,) * len(need)
                self.rows = tuple(c if n <= c else round_up(max(1, int(n * self.headroom)),
                                                            self.multiple)
                                  for n, c in zip(need, old, strict=True))
            return self.rows

    def pad(self, maps, grow: bool = True):
        """``maps`` padded to the capacities, grown first to hold them (``grow``; the
        step) or as they stand (the loader's thread: tables that do not fit stay as they
        are); tables the graph cannot take (:func:`graphable`) as they are."""
        if not graphable(maps):
            return maps
        real = maps.unpadded or sparse_torch.sizes(maps)
        want = self.fit(real) if grow else self.rows
        if not _holds(want, real):
            return maps
        return maps if sparse_torch.sizes(maps) == want else sparse_torch.pad_maps(maps, want)

    def padding(self, builder) -> Padding:
        """``builder`` (a model's ``f(coords, batch_size)``, in the loader's thread) with
        its tables padded to the capacities as they stand."""
        return Padding(self, builder)


class Padding:
    """A table builder whose tables come padded to the capacities as they stand
    (:meth:`Capacities.padding`). A loader process holds a copy of it made when the
    process started: :meth:`snapshot` is what the loader sends with each batch it asks
    for, :meth:`restore` what the process sets its copy to before building."""

    def __init__(self, capacities: Capacities, builder):
        self.capacities, self.builder = capacities, builder

    def __call__(self, coords: torch.Tensor, batch_size: int, **kw):
        rows = self.capacities.rows
        if rows is None:
            return self.builder(coords, batch_size, **kw)
        # built padded in place (sparse_torch.build_maps); unpadded where they do not fit
        return self.capacities.pad(self.builder(coords, batch_size, rows=rows, **kw),
                                   grow=False)

    @property
    def takes_positions(self) -> bool:
        """Whether the builder wants the batch's positions (a table cache's)."""
        return getattr(self.builder, "takes_positions", False)

    def attach(self, pixels) -> None:
        """The loader's events to the builder, where it keeps tables per event."""
        attach = getattr(self.builder, "attach", None)
        if attach is not None:
            attach(pixels)

    def snapshot(self) -> tuple[int, ...] | None:
        return self.capacities.rows

    def restore(self, rows: tuple[int, ...] | None) -> None:
        self.capacities.rows = rows


def graphable(maps) -> bool:
    """Tables a graph can take: every level there and sites left after the last pool
    (else the network's output is its no-site zeros, which the eager step makes)."""
    return isinstance(maps, sparse_torch.SiteMaps) and maps.levels[-1].n_out > 0
