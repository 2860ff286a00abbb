"""``data.table_cache`` (issue 36): SCNet's index tables made once per event and joined
for each batch are the tables ``build_maps`` makes for the batch, integer for integer
(unpadded, padded to a graph's capacities, or left unpadded where they do not fit);
batches they cannot serve are built as before; a training with them is the same
training, in the loader's thread or its processes."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from test_loader_processes import CUDA, _loader, _tensors
from test_step_overlap import _fit, _same

from lartpc.config import load_config
from lartpc.data.loader_base import SparseEvents
from lartpc.data.packing import walk
from lartpc.data.store import Event, EventStore
from lartpc.errors import ConfigError
from lartpc.models import sparse_torch, table_cache
from lartpc.models.scnet import KERNEL, POOLS
from lartpc.models.table_cache import CHUNK, CachedTables
from lartpc.train.padding import Capacities

pytestmark = pytest.mark.sparse

TORCH = "model.sparse=torch"


def _same_maps(a: sparse_torch.SiteMaps, b: sparse_torch.SiteMaps) -> None:
    assert (a.batch_size, a.spatial_shape, a.out_shape, a.unpadded) == (
        b.batch_size, b.spatial_shape, b.out_shape, b.unpadded)
    assert a.indices is b.indices and len(a.levels) == len(b.levels)
    pairs = [(a.order, b.order), (a.dense_index, b.dense_index)]
    for x, y in zip(a.levels, b.levels, strict=True):
        assert (x.shape, x.n_out) == (y.shape, y.n_out)
        assert (x.mirrored is None) == (y.mirrored is None)
        pairs += [(x.keys, y.keys), (x.neighbours, y.neighbours), (x.slots, y.slots)]
        pairs += [] if x.mirrored is None else [(x.mirrored, y.mirrored)]
    for x, y in pairs:
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def _coords(pixels: SparseEvents, positions) -> torch.Tensor:
    bidx, row, col, _ = pixels.gather(np.asarray(positions))
    coords = np.empty((len(row), 3), np.int32)
    coords[:, 0], coords[:, 1], coords[:, 2] = bidx, row, col
    return torch.from_numpy(coords)


def _cached(events: list[Event], shape) -> tuple[SparseEvents, CachedTables, partial]:
    pixels = SparseEvents(events, shape)
    build = partial(sparse_torch.build_maps, spatial_shape=shape, kernel=KERNEL, pools=POOLS,
                    training=True)
    cached = CachedTables(build)
    cached.attach(pixels)
    return pixels, cached, build


@pytest.mark.parametrize("store,frame,wide", [
    ("full_res_events_dir", None, False),  # 3600 x 3600: every pool divides its image
    ("train_events_dir", None, False),  # 400 x 400
    ("train_events_dir", None, True),  # the rows stored in int32 (events of 32,767 sites)
    ("train_events_dir", (430, 430), False),  # the same events in a larger frame: pools
    # that leave rows and columns out (86 -> 17, 17 -> 4), so sites the pools drop
])
def test_joined_tables_are_those_build_maps_makes(store, frame, wide, request, monkeypatch):
    if wide:
        monkeypatch.setattr(table_cache, "SMALL_ROWS", 0)
    events_dir = request.getfixturevalue(store)
    st = EventStore(events_dir)
    shape = frame or tuple(st.geometry.shape)
    events = st.read_many(range(len(st)))
    pixels, cached, build = _cached(events, shape)
    assert cached.cache.events == len(events) and cached.cache.nbytes > 0
    assert {lv.table.dtype for lv in cached.cache.levels[:-1]} == {
        np.dtype(np.int32 if wide else np.int16)}
    rng = np.random.default_rng(7)
    for k in range(6):
        positions = rng.choice(len(events), min(7, len(events)), replace=False)
        if k == 0:
            positions = np.sort(positions)[::-1].copy()  # any order of events
        coords = _coords(pixels, positions)
        want = build(coords, len(positions))
        assert cached.cache.join(positions, coords, len(positions)) is not None  # joined
        _same_maps(want, cached(coords, len(positions), positions=positions))
        have = sparse_torch.sizes(want)
        for rows in (have, tuple(n + 5 + n // 3 for n in have), (*have[:-1], have[-1] - 1)):
            # padded to capacities (exactly the sizes, above them) and, where the last
            # pool's sites do not fit, unpadded, as build_maps leaves them
            got = cached(coords, len(positions), rows=rows, positions=positions)
            _same_maps(build(coords, len(positions), rows=rows), got)
        # without positions (or of coordinates on another device) it is build_maps
        _same_maps(want, cached(coords, len(positions)))


@pytest.mark.parametrize("room", [None, 0.0])
def test_chunks_and_an_event_without_pixels(train_events_dir, room, monkeypatch):
    """Events in more than one chunk of the start-up's building, one of them without a
    pixel: a batch holding it joins the others' tables as build_maps builds them; a
    batch of only that event has no tables (None), as build_maps gives. ``room`` 0:
    every level's arrays start with one row's room and grow at each chunk."""
    if room is not None:
        monkeypatch.setattr(table_cache, "ROOM", room)
        monkeypatch.setattr(table_cache, "SLACK", 1)
    st = EventStore(train_events_dir)
    shape = tuple(st.geometry.shape)
    events = st.read_many(range(len(st)))
    empty = Event(events[3].row[:0], events[3].col[:0], events[3].charge[:0], events[3].label)
    events = (events * (CHUNK // len(events) + 2))[: CHUNK + 9]
    events[CHUNK + 2] = empty
    pixels, cached, build = _cached(events, shape)
    for positions in ([CHUNK + 2, 0, CHUNK + 5, 4], [CHUNK - 1, CHUNK, CHUNK + 8]):
        coords = _coords(pixels, positions)
        _same_maps(build(coords, len(positions)),
                   cached(coords, len(positions), positions=np.array(positions)))
    coords = _coords(pixels, [CHUNK + 2])
    assert cached(coords, 1, positions=np.array([CHUNK + 2])) is None


def test_coordinates_of_other_events_are_refused(train_events_dir):
    """Coordinates that are not those of the batch's positions (another event's, or a
    batch size that is not the positions') are a ValueError, not tables of the wrong
    row count that SCNet would compute a wrong forward on."""
    st = EventStore(train_events_dir)
    events = st.read_many(range(len(st)))
    pixels, cached, _ = _cached(events, tuple(st.geometry.shape))
    sites = [len(e.row) for e in events]
    a = int(np.argmin(sites))
    b = int(np.argmax(sites))
    assert sites[a] != sites[b]
    with pytest.raises(ValueError, match=r"coordinates \(\d+ sites, batch_size=1\) are not "
                                         r"those of the events at its positions"):
        cached(_coords(pixels, [b]), 1, positions=np.array([a]))
    with pytest.raises(ValueError, match="batch_size=2"):
        cached.cache.join(np.array([a]), _coords(pixels, [a]), 2)
    assert cached(_coords(pixels, [a]), 1, positions=np.array([a])) is not None


def test_a_column_grows_and_widens_as_rows_arrive():
    """The start's arrays: filled chunk by chunk in place, moving to a larger one when
    out of room and to int32 when a chunk's rows need it, equal to the chunks
    concatenated (numpy's promotion)."""
    rng = np.random.default_rng(3)
    sizes = ((5, np.int16), (0, np.int16), (9, np.int16), (4, np.int32), (7, np.int16))
    chunks = [rng.integers(-1, 300, (n, 25)).astype(t) for n, t in sizes]
    column = table_cache._Column(6)
    for c in chunks:
        column.add(c)
    got = column.array(np.int16)
    want = np.concatenate(chunks)
    assert got.dtype == want.dtype == np.int32 and np.array_equal(got, want)
    assert table_cache._Column(6).array(np.int16).dtype == np.int16  # no rows


def test_the_loaders_batches_with_the_cache_are_the_same(train_events_dir):
    """An epoch of the sparse loader with a cached builder padded to a graph's sizes:
    batch for batch the tables (and everything else) of the builder without."""
    from test_sparse_torch import _pair

    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape)
    caps = Capacities()
    plain = list(_loader(train_events_dir, caps.padding(model.rulebook_builder(training=True))))
    caps.fit(tuple(max(n) for n in zip(*(sparse_torch.sizes(b.rulebooks) for b in plain),
                                       strict=True)))
    plain = list(_loader(train_events_dir, caps.padding(model.rulebook_builder(training=True))))
    cached = list(_loader(train_events_dir,
                          caps.padding(model.rulebook_builder(training=True, cache=True))))
    assert len(plain) == len(cached) > 5
    for a, b in zip(plain, cached, strict=True):
        assert b.rulebooks.fits(b.coords, b.data_size, shape, True)
        assert sparse_torch.sizes(b.rulebooks) == caps.rows
        ta = _tensors((a.labels, a.coords, a.features, a.rulebooks))
        tb = _tensors((b.labels, b.coords, b.features, b.rulebooks))
        assert len(ta) == len(tb) > 10
        assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


def test_the_cuda_way_packs_the_batch_and_its_tables_into_one_reused_buffer(
        train_events_dir, monkeypatch):
    """The loader thread's CUDA way with a cache (``SparseLoader._joined_to_device``) run
    on the CPU, the device copy, its stream and event stood in
    (``test_cuda_branches.stand_in_cuda``): the batch and its joined tables packed into
    one page-locked buffer, grown when a batch needs more, reused otherwise; what comes
    back, every tensor a view of the one copy, equals the CPU's batch."""
    from test_cuda_branches import stand_in_cuda
    from test_sparse_torch import _pair

    copies = stand_in_cuda(monkeypatch)["copies"]
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape)
    host = list(_loader(train_events_dir, model.rulebook_builder(training=True)))
    loader = _loader(train_events_dir, model.rulebook_builder(training=True, cache=True))
    loader.device = torch.device("cuda")  # its thread's stream: the stand-in's
    made = [loader._joined_to_device(b, loader._batches(0)[k])
            for k, b in enumerate(_loader(train_events_dir, None))]
    assert len(made) == len(host) > 5
    # one copy a batch, from the thread's buffer: reused, grown only for larger batches
    assert len(copies) == len(made) and len(set(copies)) <= 3
    assert copies[-1] == loader._streams.pinned.data_ptr()
    for a, item in zip(host, made, strict=True):
        b = item.batch
        assert item.packed and b.rulebooks.fits(b.coords, b.data_size, shape, True)
        got = _tensors((b.labels, b.coords, b.features, b.rulebooks))
        assert len({t.untyped_storage().data_ptr() for t in got}) == 1
        want = _tensors((a.labels, a.coords, a.features, a.rulebooks))
        assert len(want) == len(got) > 10
        assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(want, got,
                                                                              strict=True))


@pytest.mark.parametrize("device", [CUDA])
def test_on_cuda_a_cached_batch_is_one_copy(train_events_dir, device):
    """On CUDA the loader's thread joins the tables on the CPU and sends the batch and
    its tables as one copy: every tensor a view of it, equal to the CPU's batch."""
    from test_sparse_torch import _pair

    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape)
    host = list(_loader(train_events_dir, model.rulebook_builder(training=True)))
    made = list(_loader(train_events_dir, model.rulebook_builder(training=True, cache=True),
                        device=device))
    assert len(made) == len(host) > 5
    for a, b in zip(host, made, strict=True):
        held = _tensors((b.labels, b.coords, b.features, b.rulebooks))
        assert {t.device.type for t in held} == {"cuda"}
        assert len({t.untyped_storage().data_ptr() for t in held}) == 1
        torch.cuda.synchronize()
        got = walk((b.labels, b.coords, b.features, b.rulebooks), lambda t: t.cpu())
        want = _tensors((a.labels, a.coords, a.features, a.rulebooks))
        assert all(x.dtype == y.dtype and torch.equal(x, y)
                   for x, y in zip(want, _tensors(got), strict=True))


def test_training_with_the_table_cache_is_the_same_training(world, train_events_dir,
                                                            tmp_path):
    """Two epochs through the loop with the cache, in the loader's thread and in two
    loader processes: the rank log and the final parameters bit for bit those without."""
    plain = _fit(world, train_events_dir, tmp_path / "plain", "tiny-scnet", TORCH)
    _same(plain, _fit(world, train_events_dir, tmp_path / "cache", "tiny-scnet", TORCH,
                      "data.table_cache=true"))
    _same(plain, _fit(world, train_events_dir, tmp_path / "processes", "tiny-scnet", TORCH,
                      "data.table_cache=true", "data.loader_processes=2"))


@pytest.mark.parametrize("sets,why", [
    ((), "keeps the index tables of SCNet's torch layers"),  # spconv's layers
    ((TORCH, "data.rulebooks=forward"), "the tables are the sparse loader's"),
    ((TORCH, "data.augment=mirror"), "change every epoch"),
])
def test_config_refusals_name_the_option(sets, why):
    with pytest.raises(ConfigError, match=rf"^data.table_cache = true: .*{why}"):
        load_config("tiny-scnet", ["data.table_cache=true", *sets])
    with pytest.raises(ConfigError, match="data.table_cache = true: .*SCNet's torch layers"):
        load_config("tiny-jishnet", ["data.table_cache=true"])
