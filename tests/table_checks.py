"""Shared by the tests of SCNet's index tables (``test_table_kernels.py``,
``test_table_numba.py``, ``test_table_graph.py``): a real batch's coordinates, and the
check that two ways of building gave the same tables, integer for integer."""

from __future__ import annotations

import torch

from lartpc.bench.model import batch_from_events
from lartpc.data.store import EventStore
from lartpc.models import sparse_torch
from lartpc.models.scnet import POOLS


def batch_coords(data, first: int, n: int, device="cpu") -> tuple[torch.Tensor, tuple[int, int]]:
    """The (P, 3) coordinates of events ``first`` to ``first + n`` of the store ``data``,
    as the sparse loader batches them, on ``device``; and the image shape."""
    store = EventStore(data)
    shape = tuple(store.geometry.shape)
    events = store.read_many(range(first, first + n))
    return batch_from_events(events, shape, "sparse").coords.to(device), shape


def same_tables(a: sparse_torch.SiteMaps, b: sparse_torch.SiteMaps) -> None:
    """Every table of ``a`` equals ``b``'s, dtype and all."""
    assert torch.equal(a.order, b.order) and torch.equal(a.dense_index, b.dense_index)
    assert a.out_shape == b.out_shape and len(a.levels) == len(b.levels) == len(POOLS)
    for la, lb in zip(a.levels, b.levels, strict=True):
        assert la.shape == lb.shape and la.n_out == lb.n_out
        for name in ("keys", "neighbours", "slots", "mirrored"):
            ta, tb = getattr(la, name), getattr(lb, name)
            assert (ta is None) == (tb is None), name
            if ta is not None:
                assert ta.dtype == tb.dtype and torch.equal(ta, tb), name


def same_padded(a: sparse_torch.SiteMaps, b: sparse_torch.SiteMaps) -> None:
    """:func:`same_tables`, both padded from the same unpadded sizes and coordinates."""
    same_tables(a, b)
    assert a.unpadded == b.unpadded is not None and a.indices is b.indices
