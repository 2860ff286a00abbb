"""Dense (Blosc), sparse and device-dense loaders, prefetching and bad shards."""

from __future__ import annotations

import json
import shutil
import threading
import time

import h5py
import numpy as np
import pytest
import torch

from lartpc.config import load_config
from lartpc.data import EventStore, EventStoreError
from lartpc.data.blosc_cache import BloscConfig
from lartpc.data.loaders import build_loader
from lartpc.data.prefetch import n_slots, prefetch
from lartpc.data.sharding import ShardPlan, epoch_batches
from lartpc.errors import ConfigError, LartpcError


@pytest.fixture(scope="module")
def store(events_dir):
    return EventStore(events_dir)


def _check_dense(store, batch):
    assert batch.dense.shape == (batch.data_size, 1, *store.geometry.shape)
    for j, ev in enumerate(store.read_many(batch.event_ids)):
        assert np.array_equal(batch.dense[j, 0].numpy(), ev.dense(store.geometry.shape))
        assert int(batch.labels[j]) == ev.label
        assert batch.truth["pdg"][j] == ev.truth["pdg"]


def _check_epochs(store, loader, epochs, indices):
    """Every dense batch of each epoch equals its events; each epoch covers ``indices``."""
    for epoch in epochs:
        loader.set_epoch(epoch)
        seen = []
        for b in loader:
            _check_dense(store, b)
            seen += b.event_ids.tolist()
        assert sorted(seen) == list(indices)


@pytest.mark.parametrize("blosc", [
    BloscConfig(),  # lz4, no shuffle, compressed during epoch 0
    BloscConfig(compress_at="start", threads=2),
    BloscConfig(codec="zstd", clevel=3, shuffle="bitshuffle", band_rows=7, compress_at="start"),
    BloscConfig(codec="blosclz", shuffle="shuffle", band_rows=1000, threads=1),
])
def test_dense_images_equal_stored_events(store, blosc):
    idx = np.arange(0, 40, 3)
    loader = build_loader(store, "blosc", idx, 4, blosc=blosc, seed=1)
    _check_epochs(store, loader, (0, 1), idx)  # epoch 0 may compress, 1 decompresses only
    assert all(loader.cache.has(i) for i in range(len(idx)))  # epoch 0 compressed them all
    assert loader.resident_bytes == loader.cache.resident_bytes  # no sparse copy left
    assert loader.cache.compression_ratio > 20
    assert loader.resident_bytes < 0.05 * len(idx) * 4 * np.prod(store.geometry.shape)




def test_an_epoch_ended_by_an_error_stops_its_threads_at_once(store):
    """An error in the consumer's part of a batch (a device out of memory, say) ends the
    epoch; its prefetch thread used to run on while the exception was held (its
    traceback keeps the epoch's generator), beside the next epoch's on the same
    buffers. Now the epoch's threads are joined before the error leaves it."""
    idx = np.arange(0, 40, 2)
    loader = build_loader(store, "blosc", idx, 2, seed=1)
    finish, calls = loader._finish, []

    def failing(b):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("out of device memory (stood in)")
        return finish(b)

    loader._finish = failing
    with pytest.raises(MemoryError) as held:
        for _ in loader:
            pass
    assert held.value is not None  # the exception, and its traceback, still held
    assert not [th for th in threading.enumerate() if th.name.startswith("blosc-loader")]
    loader._finish = finish
    _check_epochs(store, loader, (0, 1), idx)  # and the next epochs are whole

@pytest.mark.parametrize("when", ["start", "first-epoch"])
def test_a_runs_blosc_compress_at_reaches_its_loader(store, when):
    """``data.blosc_compress_at`` is the run's choice of when the blosc loader
    compresses: ``start`` (the paper's, and its preset's: the whole shard before the
    first batch, inside the data loading time) or ``first-epoch`` (overlapped with epoch
    0). It reached no loader before: every training compressed during epoch 0."""
    from lartpc.train.parts import make_loader

    cfg = load_config("tiny-jishnet", [f"data.blosc_compress_at={when}"])
    idx = np.arange(0, 20, 2)
    loader = make_loader(cfg, store, "blosc", idx, torch.device("cpu"), train=True)
    assert loader.blosc.compress_at == when
    ready = [loader.cache.has(i) for i in range(len(idx))]
    assert ready == [when == "start"] * len(idx)  # before any batch: all or none
    _check_epochs(store, loader, (0,), idx)
    assert all(loader.cache.has(i) for i in range(len(idx)))


def test_the_paper_preset_compresses_before_training_and_a_bad_choice_is_refused():
    assert load_config("paper-jishnet").data.blosc_compress_at == "start"
    assert load_config("tiny-jishnet").data.blosc_compress_at == "first-epoch"
    with pytest.raises(ConfigError, match="data.blosc_compress_at = 'later'"):
        load_config("tiny-jishnet", ["data.blosc_compress_at=later"])

def test_dense_full_resolution(full_res_events_dir):
    store = EventStore(full_res_events_dir)
    assert store.geometry.shape == (3600, 3600)
    loader = build_loader(store, "blosc", np.arange(len(store)), 7, seed=2)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        sizes = []
        for b in loader:
            _check_dense(store, b)
            sizes.append(b.data_size)
        assert sizes == [7, 3]


def test_sparse_batches_equal_events(store):
    loader = build_loader(store, "sparse", np.arange(len(store)), 7, seed=4)
    seen = []
    for b in loader:
        assert b.dense is None and b.coords.dtype == torch_int32() and b.features.shape[1] == 1
        coords, feats = b.coords.numpy(), b.features.numpy()[:, 0]
        for j, ev in enumerate(store.read_many(b.event_ids)):
            m = coords[:, 0] == j
            assert np.array_equal(coords[m, 1], ev.row) and np.array_equal(coords[m, 2], ev.col)
            assert np.array_equal(feats[m], ev.charge)
        assert np.array_equal(b.labels.numpy(), store.labels[b.event_ids])
        seen += b.event_ids.tolist()
    assert sorted(seen) == list(range(len(store)))


def torch_int32():
    import torch

    return torch.int32


def test_duplicate_pixels_keep_the_last_charge_like_event_dense(store, tmp_path):
    from lartpc.data import Event, write_shard

    evs = store.read_many([0, 1])
    ev = evs[0]  # repeat its first pixel at the end with another charge
    evs[0] = Event(np.append(ev.row, ev.row[0]), np.append(ev.col, ev.col[0]),
                   np.append(ev.charge, np.float32(123.5)), ev.label, ev.truth, ev.event_id)
    write_shard(tmp_path / "events-00000.h5", evs, store.geometry)
    dup = EventStore(tmp_path)
    want = evs[0].dense(dup.geometry.shape)
    assert want[ev.row[0], ev.col[0]] == np.float32(123.5)
    for mode in ("blosc", "device-dense"):
        b = next(iter(build_loader(dup, mode, np.arange(2), 2, shuffle=False)))
        assert np.array_equal(b.dense[0, 0].numpy(), want)
    b = next(iter(build_loader(dup, "sparse", np.arange(2), 2, shuffle=False)))
    m = b.coords[:, 0].numpy() == 0
    assert m.sum() == len(ev.row)  # unique pixels only, as spconv requires
    img = np.zeros(dup.geometry.shape, np.float32)
    img[b.coords[m, 1].numpy(), b.coords[m, 2].numpy()] = b.features[m, 0].numpy()
    assert np.array_equal(img, want)


def test_one_iteration_at_a_time(store):
    loader = build_loader(store, "blosc", np.arange(20), 4)
    first = iter(loader)
    next(first)
    with pytest.raises(LartpcError, match="iteration is still running"):
        next(iter(loader))
    first.close()
    assert len(list(loader)) == 5


def test_device_dense_equals_dense(store):
    idx = np.arange(5, 30)
    dense = build_loader(store, "blosc", idx, 6, seed=9)
    dev = build_loader(store, "device-dense", idx, 6, seed=9)
    for epoch in (0, 1):
        dense.set_epoch(epoch), dev.set_epoch(epoch)
        n = 0
        for a, b in zip(dense, dev, strict=True):
            assert np.array_equal(a.event_ids, b.event_ids)
            assert np.array_equal(a.dense.numpy(), b.dense.numpy())
            n += 1
        assert n == dense.steps_per_epoch == dev.steps_per_epoch == 5


def test_device_dense_images_equal_stored_events_as_slots_are_reused(store):
    """A reused slot clears only the pixels its last batch wrote: every image is still
    exactly the event's, epoch after epoch (short last batches included)."""
    idx = np.arange(3, 36, 2)
    _check_epochs(store, build_loader(store, "device-dense", idx, 5, seed=4), range(3), idx)


@pytest.mark.parametrize("mode", ["blosc", "device-dense"])
def test_batch_failing_half_way_leaves_no_stale_pixels(store, mode, monkeypatch):
    """A batch that fails after writing part of its buffer (here: garbage over a whole
    image, then an error) must not let the slot's next batch trust an old record."""
    loader = build_loader(store, mode, np.arange(12), 4, seed=3, prefetch_depth=0)
    list(loader)  # epoch 0 (the dense mode compresses here)
    calls = {"n": 0}
    if mode == "blosc":
        real = loader.cache.decompress_into

        def flaky(i, dst, stale=None):
            calls["n"] += 1
            if calls["n"] == 2:
                dst[:] = 7.0
                raise OSError("read error")
            return real(i, dst, stale)

        monkeypatch.setattr(loader.cache, "decompress_into", flaky)
    else:
        real = loader.pixels.gather

        def flaky(positions):
            calls["n"] += 1
            if calls["n"] == 2:
                loader._slot_buffer(1).fill_(7.0)
                loader._begin_write(1)  # as a scatter interrupted after its clear
                raise OSError("read error")
            return real(positions)

        monkeypatch.setattr(loader.pixels, "gather", flaky)
    loader.set_epoch(1)
    with pytest.raises(OSError, match="read error"):
        list(loader)
    monkeypatch.undo()
    _check_epochs(store, loader, (2, 3), range(12))


@pytest.mark.parametrize("mode", ["blosc", "sparse", "device-dense"])
def test_ranks_cover_the_epoch_once_in_step(store, mode):
    plan = ShardPlan(len(store), 3, 5, seed=8, eval_fraction=0.1, labels=store.labels)
    loaders = [build_loader(store, mode, plan.train_indices(r), 5, seed=plan.seed,
                            steps_per_epoch=plan.steps_per_epoch) for r in range(3)]
    for epoch in (0, 1):
        seen = []
        for r, loader in enumerate(loaders):
            loader.set_epoch(epoch)
            ids = [b.event_ids for b in loader]
            assert len(ids) == plan.steps_per_epoch
            want = epoch_batches(plan.train_indices(r), 5, epoch, plan.seed,
                                 steps=plan.steps_per_epoch)
            assert [x.tolist() for x in ids] == [x.tolist() for x in want]
            seen += np.concatenate(ids).tolist()
        assert sorted(seen) == plan.train.tolist()
    ev = build_loader(store, mode, plan.eval_indices(0), 5, shuffle=False)
    assert np.concatenate([b.event_ids for b in ev]).tolist() == plan.eval_indices(0).tolist()


@pytest.mark.parametrize("workers", [1, 3])
def test_prefetch_keeps_order_with_slow_consumer_and_rotating_slots(workers):
    depth = 2
    slots = [np.zeros(4) for _ in range(n_slots(depth, workers))]
    threads = set()

    def produce(k):
        threads.add(threading.current_thread().name)
        time.sleep(0.002 * (k % 3))  # uneven items: the threads finish out of order
        slots[k % len(slots)][:] = k  # writes a rotating buffer, as the loaders do
        return k, slots[k % len(slots)]

    got = []
    for k, buf in prefetch(produce, 13, depth, workers=workers):
        time.sleep(0.01)  # the producers run ahead meanwhile
        assert np.all(buf == k)  # the held buffer was not overwritten
        got.append(k)
    assert got == list(range(13))
    assert len(threads) == workers
    assert n_slots(depth) == depth + 2  # one thread: the buffers it always needed


@pytest.mark.parametrize("workers", [1, 3])
def test_prefetch_reraises_at_the_failing_item_and_stops_the_thread(workers):
    def produce(k):
        if k == 5:
            raise ValueError("bad item 5")
        return k

    got = []
    with pytest.raises(ValueError, match="bad item 5"):
        for k in prefetch(produce, 10, 3, workers=workers):
            got.append(k)
    assert got == [0, 1, 2, 3, 4]
    before = threading.active_count()
    it = prefetch(lambda k: k, 1000, 2, workers=workers)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()  # consumer stops early: the threads must end
    assert threading.active_count() <= before
    assert list(prefetch(lambda k: k * k, 4, 0, workers=workers)) == [0, 1, 4, 9]
    assert list(prefetch(lambda k: k, 0, 2, workers=workers)) == []
    assert list(prefetch(lambda k: k, 2, 1, workers=workers)) == [0, 1]  # fewer than threads


def test_several_prefetch_threads_make_the_same_sparse_batches(store):
    """A sparse batch is a pure function of its positions: three threads give the batches
    one gives, in the same order; the dense loaders refuse more than one."""
    def epoch(threads):
        loader = build_loader(store, "sparse", np.arange(len(store)), 3, seed=4,
                              prefetch_threads=threads)
        return [(b.event_ids.tolist(), b.coords.clone(), b.features.clone()) for b in loader]

    one, three = epoch(1), epoch(3)
    assert len(one) == len(three) > 3
    for (ia, ca, fa), (ib, cb, fb) in zip(one, three, strict=True):
        assert ia == ib and torch.equal(ca, cb) and torch.equal(fa, fb)
    for mode in ("blosc", "device-dense"):
        with pytest.raises(LartpcError, match="prefetch_threads=2: the .* loader prepares"):
            build_loader(store, mode, np.arange(len(store)), 3, prefetch_threads=2)
    for sets in (["data.prefetch_threads=0"], ["data.prefetch_threads=2000"],
                 ["data.prefetch_threads=2", "data.loader=blosc"]):
        with pytest.raises(ConfigError, match="data.prefetch_threads"):
            load_config("tiny-scnet", sets)
    with pytest.raises(ConfigError, match="prefetch_threads = 2 with data.loader = 'auto'"):
        load_config("tiny-jishnet", ["data.prefetch_threads=2", "data.loader=auto"])
    assert load_config("tiny-scnet", ["data.prefetch_threads=3"]).data.prefetch_threads == 3


def test_empty_shard_and_bad_options(store):
    with pytest.raises(LartpcError, match="empty shard"):
        build_loader(store, "blosc", np.zeros(0, np.int64), 7)
    with pytest.raises(ConfigError, match="loader mode .dense."):  # the old name
        build_loader(store, "dense", np.arange(3), 7)
    with pytest.raises(ConfigError, match="blosc codec 'snappyy'"):
        build_loader(store, "blosc", np.arange(3), 7, blosc=BloscConfig(codec="snappyy"))


@pytest.mark.parametrize("damage", ["row", "charge"])
def test_corrupt_shard_names_file_and_event(events_dir, tmp_path, damage):
    bad = tmp_path / "events"
    shutil.copytree(events_dir, bad)
    target = bad / "events-00001.h5"
    with h5py.File(target, "r+") as f:
        a, b = f["offsets"][3], f["offsets"][4]  # pixels of event 3 of that file
        if damage == "row":
            f["row"][a] = 30000  # beyond the 900-row image
        else:
            f["charge"][b - 1] = np.nan
    store = EventStore(bad)
    for mode in ("blosc", "sparse", "device-dense"):
        with pytest.raises(EventStoreError, match=r"events-00001\.h5: event 3 "):
            build_loader(store, mode, np.arange(15, 30), 7)


def test_truncated_shard_names_file(events_dir, tmp_path):
    bad = tmp_path / "events"
    shutil.copytree(events_dir, bad)
    target = bad / "events-00000.h5"
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with pytest.raises(EventStoreError, match=r"events-00000\.h5"):
        build_loader(EventStore(bad), "blosc", np.arange(10), 7)


def test_bench_loader_prints_json(events_dir, capsys):
    from lartpc.cli import main

    rc = main(["bench", "loader", "--data", str(events_dir), "--mode", "blosc", "--ranks", "2",
               "--repeats", "1", "--steps", "2"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["events"] == 20 and out["geometry"] == [900, 900]
    for key in ("dlt_s", "read_s", "batch_s", "batch_gbps", "compression_ratio",
                "resident_bytes_per_event"):
        assert out[key] > 0
    assert out["dlt_s"] >= out["loader_read_s"]  # the loading time includes its read


@pytest.mark.parametrize("mode", ["blosc", "sparse"])
def test_bench_loader_times_mirrored_batches(events_dir, capsys, monkeypatch, mode):
    from lartpc.cli import main
    from lartpc.data import augment

    calls = []
    real = augment.mirror
    monkeypatch.setattr(augment, "mirror", lambda b, s, e: calls.append(e) or real(b, s, e))
    rc = main(["bench", "loader", "--data", str(events_dir), "--mode", mode,
               "--repeats", "1", "--steps", "3", "--augment", "mirror"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["augment"] == "mirror" and out["batch_s"] > 0
    assert len(calls) >= 3 + 1 and 0 in calls and max(calls) >= 1  # epoch 0 and a later one
