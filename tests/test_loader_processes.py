"""``data.loader_processes`` (issue 36): the sparse loader's batches, index tables
included, made in forked processes and handed back as one packed buffer. The batches are
the threads' own, tensor for tensor; a training with them is the same training; the
graph's padded sizes reach the processes; failures in a process are the caller's errors.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal

import numpy as np
import pytest
import torch
from test_sparse_torch import _pair
from test_step_overlap import _fit, _same

from lartpc.config import load_config
from lartpc.data import packing, processes
from lartpc.data.loaders import build_loader
from lartpc.data.packing import pack, unpack, walk
from lartpc.data.processes import Processes
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError, LartpcError
from lartpc.models import sparse_torch
from lartpc.train.padding import Capacities

pytestmark = pytest.mark.sparse

TORCH = "model.sparse=torch"


def _tensors(obj) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in (obj if isinstance(obj, tuple) else (obj,)):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, sparse_torch.SiteMaps):
            out += v.tensors()
    return out


def test_pack_and_unpack_keep_values_types_and_shared_tensors():
    a = torch.arange(7, dtype=torch.int32).reshape(7, 1)
    b = torch.tensor([1.5, -2.0], dtype=torch.float64)
    empty = torch.zeros((0, 3), dtype=torch.int64)
    tree = {"a": a, "again": a, "pair": (b, [a[2:5], 3]), "none": None, "empty": empty,
            "odd": torch.tensor([7], dtype=torch.int16)}
    buffer, skeleton = pack(tree)
    # int32 a and a[2:5] back to back (40 bytes), float64 b (16), int64 empty (0), int16
    # (2, then zeros to a multiple of 8)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 40 + 16 + 8
    assert buffer[58:].eq(0).all()
    out = unpack(buffer, skeleton)
    assert torch.equal(out["a"], a) and out["a"].dtype == torch.int32
    assert out["again"] is out["a"]  # one tensor held twice stays one
    assert torch.equal(out["pair"][0], b) and torch.equal(out["pair"][1][0], a[2:5])
    assert out["pair"][1][1] == 3 and out["none"] is None
    assert out["empty"].shape == (0, 3) and out["empty"].dtype == torch.int64
    assert out["odd"].tolist() == [7] and out["odd"].dtype == torch.int16
    assert out["a"].untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    again, _ = pack(tree)
    assert torch.equal(again, buffer)  # the alignment gaps are zeros, not leftovers
    into = torch.full((100,), 255, dtype=torch.uint8)  # the gaps are written too
    there, _ = pack(tree, into=into)
    assert there.data_ptr() == into.data_ptr() and torch.equal(there, buffer)
    small = torch.empty(10, dtype=torch.uint8)
    assert pack(tree, into=small)[0].data_ptr() != small.data_ptr()  # did not fit
    doubled = walk(tree, lambda t: 2 * t)  # the same form, each tensor mapped once
    assert doubled["again"] is doubled["a"] and torch.equal(doubled["a"], 2 * a)
    assert doubled["pair"][1][1] == 3 and doubled["none"] is None


def test_batches_of_one_form_share_one_builder_and_dataclasses_come_back_whole():
    def tables(n: int, n_out: int) -> sparse_torch.SiteMaps:  # two levels, real sizes
        coords = torch.arange(3 * n, dtype=torch.int32).reshape(n, 3)
        levels = [sparse_torch.Level(keys=torch.arange(n), shape=(8, 8),
                                     neighbours=torch.full((n, 9), n, dtype=torch.int32),
                                     slots=torch.arange(n) % n_out, n_out=n_out,
                                     mirrored=None if k == 0 else
                                     torch.arange(9 * n, dtype=torch.int32))
                  for k in range(2)]
        return sparse_torch.SiteMaps(indices=coords, batch_size=2, spatial_shape=(8, 8),
                                     order=torch.arange(n), levels=levels,
                                     dense_index=torch.arange(n_out), out_shape=(1, 1))

    one, two = tables(5, 2), tables(9, 4)  # the same form, other sizes and counts
    (b1, s1), (b2, s2) = pack((torch.ones(2), one.indices, one)), pack((torch.ones(2),
                                                                        two.indices, two))
    assert s1.form == s2.form and s1.values != s2.values
    s2 = pickle.loads(pickle.dumps(s2))  # as a skeleton comes from a process
    hits = packing._builder.cache_info().hits
    unpack(b1, s1)
    _, coords, got = unpack(b2, s2)
    assert packing._builder.cache_info().hits > hits  # the second form was the first's
    assert type(got) is sparse_torch.SiteMaps and got.indices is coords
    assert got.spatial_shape == (8, 8) and [lv.n_out for lv in got.levels] == [4, 4]
    assert got.levels[0].mirrored is None and got.levels[1].mirrored.shape == (81,)
    for a, b in zip(got.tensors(), two.tensors(), strict=True):
        assert torch.equal(a, b) and a.dtype == b.dtype
    assert pack((coords, one))[1].form != s1.form  # another form, another builder


def _loader(data, builder, **kw):
    store = EventStore(data)
    return build_loader(store, "sparse", np.arange(len(store)), 7, seed=1, rulebooks=builder,
                        prefetch_depth=2, **kw)


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])


@pytest.mark.parametrize("device,locked", [
    ("cpu", None), pytest.param("cuda", None, marks=CUDA.marks),
    # only a batch's first 4 kB page-locked in the slot: the rest through a locked copy
    pytest.param("cuda", 4096, marks=CUDA.marks)])
def test_batches_made_in_processes_equal_the_threads(train_events_dir, device, locked,
                                                     monkeypatch):
    """Every tensor of every batch of an epoch (labels, coordinates, charges, each
    level's tables, padded to the graph's sizes) equals the prefetch thread's on the CPU,
    and the tables are built for the batch's very coordinate tensor (the model checks
    that); on CUDA every tensor is a view of one copy on the device, also for batches
    longer than the slot's page-locked part."""
    if locked is not None:
        monkeypatch.setattr(processes, "LOCKED_BYTES", locked)
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape)
    caps = Capacities()
    build = caps.padding(model.rulebook_builder(training=True))
    threads = list(_loader(train_events_dir, build))
    caps.fit(tuple(max(n) for n in zip(*(sparse_torch.sizes(b.rulebooks) for b in threads),
                                       strict=True)))
    threads = list(_loader(train_events_dir, build))
    elsewhere = _loader(train_events_dir, build, processes=2, device=device)
    assert elsewhere.prefetch_threads == 2 and len(elsewhere._pool) == 2
    # on CUDA the slots are page-locked once, so a batch is one DMA from its slot
    assert len(elsewhere._pool._locked) == (2 if device == "cuda" else 0)
    made = list(elsewhere)
    assert len(made) == len(threads) > 5
    for a, b in zip(threads, made, strict=True):
        assert b.rulebooks.fits(b.coords, b.data_size, shape, True)
        assert sparse_torch.sizes(b.rulebooks) == caps.rows  # padded in the process
        got = (b.labels, b.coords, b.features, b.rulebooks)
        if device == "cuda":
            held = _tensors(got)
            assert {t.device.type for t in held} == {"cuda"}
            assert len({t.untyped_storage().data_ptr() for t in held}) == 1
            torch.cuda.synchronize()
            got = walk(got, lambda t: t.cpu())
        assert torch.equal(a.labels, got[0]) and list(a.event_ids) == list(b.event_ids)
        ta = _tensors((a.coords, a.features, a.rulebooks))
        tb = _tensors(got[1:])
        assert len(ta) == len(tb) > 10
        assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(ta, tb,
                                                                              strict=True))
    elsewhere._pool.close()


def test_the_sizes_as_they_stand_reach_the_processes(train_events_dir):
    """Sizes set after the processes were forked pad their next batches."""
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape)
    caps = Capacities()
    loader = _loader(train_events_dir, caps.padding(model.rulebook_builder(training=True)),
                     processes=1)
    first = next(iter(loader))
    assert first.rulebooks.unpadded is None  # no sizes yet
    caps.fit(tuple(n + 40 for n in sparse_torch.sizes(first.rulebooks)))
    later = list(loader)[3]
    assert sparse_torch.sizes(later.rulebooks) == caps.rows
    loader._pool.close()


def _double(x):
    if x < 0:
        raise ValueError(f"negative: {x}")
    return {"x": torch.full((x,), 2 * x, dtype=torch.int64)}


def test_a_failure_in_a_process_is_the_callers_error(caplog):
    pool = Processes(_double, 2, name="probe", slot_bytes=64)
    buffer, skeleton = pool(3)
    assert unpack(buffer, skeleton)["x"].tolist() == [6, 6, 6]
    with caplog.at_level(logging.WARNING, logger="lartpc.data.processes"):
        buffer, skeleton = pool(100)  # 800 bytes: larger than the slot, through the pipe
    assert unpack(buffer, skeleton)["x"].tolist() == [200] * 100
    assert "larger than the processes' slots" in caplog.text
    with pytest.raises(ValueError, match="negative: -1"):
        pool(-1)
    assert unpack(*pool(2))["x"].tolist() == [4, 4]  # and it goes on working
    pool.close()


def test_a_process_ignores_stop_signals_and_a_killed_one_is_named():
    pool = Processes(_double, 1, name="probe")
    proc = pool._procs[0][0]
    assert unpack(*pool(2))["x"].tolist() == [4, 4]  # started: its handlers are set
    os.kill(proc.pid, signal.SIGTERM)  # the training decides when to stop, not the process
    assert unpack(*pool(1))["x"].tolist() == [2]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=10)
    with pytest.raises(LartpcError, match=r"probe: process probe-0 \(pid \d+\) ended with "
                                          r"exit code -9"):
        pool(1)
    pool.close()



def _slow_double(x):
    import time

    time.sleep(x / 10)
    return _double(x)


class _Alarm(Exception):
    pass


def test_a_call_cut_short_ends_its_process_instead_of_serving_a_stale_reply():
    """An exception in the caller's thread while it waits (a Ctrl-C, a MemoryError)
    used to put the process back with its reply unread: the next call took that reply
    for its own, and every batch after was the one before's (mislabelled data, nothing
    raised). Now the process is ended and later calls on it say why."""
    def alarm(*_):
        raise _Alarm

    pool = Processes(_slow_double, 1, name="probe")
    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Alarm):
            pool(10)  # a second's batch, cut short after 0.2 s
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    with pytest.raises(LartpcError, match="probe: process probe-0 was interrupted while "
                                          "making a batch"):
        pool(1)
    pool._procs[0][0].join(timeout=10)
    assert not pool._procs[0][0].is_alive()
    pool.close()


def test_a_hung_process_is_an_error_not_a_hang(monkeypatch):
    from lartpc.data import processes

    monkeypatch.setattr(processes, "BATCH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(processes, "PARENT_POLL_S", 0.2)
    pool = Processes(_slow_double, 1, name="probe")
    with pytest.raises(LartpcError, match=r"probe: process probe-0 \(pid \d+\) made no "
                                          r"batch in 1 s \(hung\?\)"):
        pool(50)  # five seconds
    with pytest.raises(LartpcError, match="made no batch in 1 s"):
        pool(1)
    pool.close()


def test_closing_a_pool_ends_its_processes_at_once_beside_another_pool():
    """A later pool's processes, forked with copies of the earlier pool's pipe ends,
    used to keep its processes waiting: close() took 5 s a process and left them
    running (they ignore SIGTERM). Now every pool's processes close the other live
    pools' ends, and a process that does not end is killed."""
    first = Processes(_double, 2, name="first")
    second = Processes(_double, 2, name="second")
    assert unpack(*first(2))["x"].tolist() == [4, 4]
    assert unpack(*second(3))["x"].tolist() == [6, 6, 6]
    first.close()  # was: 5 s a process, then a SIGTERM they ignore, and left running
    assert not any(proc.is_alive() for proc, _ in first._procs)
    assert unpack(*second(1))["x"].tolist() == [2]  # the other pool unharmed
    second.close()
    assert not any(proc.is_alive() for proc, _ in second._procs)

def test_training_with_loader_processes_is_the_same_training(world, train_events_dir,
                                                             tmp_path):
    """Two epochs through the loop: with the batches made in two processes, the rank log
    and the final parameters are bit for bit those of the loader's thread; with the
    graph's padded static step too, to rounding (which batches the loader pads depends on
    how far ahead it is, in either way)."""
    thread = _fit(world, train_events_dir, tmp_path / "thread", "tiny-scnet", TORCH)
    _same(thread, _fit(world, train_events_dir, tmp_path / "processes", "tiny-scnet", TORCH,
                       "data.loader_processes=2"))
    (pe, le) = thread
    pg, lg = _fit(world, train_events_dir, tmp_path / "graph", "tiny-scnet", TORCH,
                  "train.cuda_graph=true", "data.loader_processes=2")
    assert len(le) == len(lg) > 0
    for a, b in zip(le, lg, strict=True):
        want = float(a["global_loss"])
        assert abs(float(b["global_loss"]) - want) <= 1e-4 * max(1.0, want)
    for a, b in zip(pe, pg, strict=True):
        assert (a - b).abs().max() <= 1e-3 * a.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loader_streams_are_never_a_stream_the_training_captures_on(train_events_dir):
    """torch hands out its pool's streams in turn: with new prefetch threads each epoch,
    each with a stream of its own, a loader once got the stream a CUDA graph was being
    captured on (H200, 2026-11-28). Loader streams come from the other pool."""
    import threading

    loader = _loader(train_events_dir, None, device="cuda")
    mine = []
    for _ in range(40):  # forty threads asking, as forty epochs' prefetch threads would
        t = threading.Thread(target=lambda: mine.append(loader._stream().cuda_stream))
        t.start()
        t.join()
    theirs = {torch.cuda.Stream().cuda_stream for _ in range(64)}
    theirs.add(torch.cuda.current_stream().cuda_stream)
    assert len(mine) == 40 and not set(mine) & theirs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_graphed_cuda_training_with_eight_processes_over_many_epochs(train_events_dir,
                                                                        tmp_path):
    """Eight processes for six epochs: 48 prefetch threads' streams (more than torch's
    pool holds) while the step is captured; the training ends, its losses finite."""
    from lartpc import dist

    stats: dict = {}
    _, log_rows = _fit(dist.init("none", "cuda"), train_events_dir, tmp_path, "tiny-scnet",
                       TORCH, "train.device=cuda", "train.cuda_graph=true", "train.epochs=6",
                       "data.loader_processes=8", graph_stats=stats)
    assert stats["captures"] >= 1 and stats["replays"] > 0
    assert len(log_rows) > 0 and all(np.isfinite(float(r["global_loss"])) for r in log_rows)


@pytest.mark.parametrize("preset,sets,why", [
    ("tiny-jishnet", (), "the processes make the sparse loader's batches"),
    ("tiny-scnet", ("data.loader=device-dense",), "the processes make the sparse loader's"),
    ("tiny-scnet", ("data.prefetch_threads=2",), "one thread drives each process"),
    ("tiny-scnet", ("data.rulebooks=loader",), "spconv's rulebooks for a GPU are built on"),
    ("tiny-scnet", ("data.loader_processes=1000",), "must be at most 256"),
    ("tiny-scnet", ("data.loader_processes=-1",), "must be >= 0"),
])
def test_config_refusals_name_the_option(preset, sets, why):
    with pytest.raises(ConfigError, match=rf"^data.loader_processes = -?\d+: .*{why}"):
        load_config(preset, ["data.loader_processes=2", *sets])


def test_the_configs_auto_loader_is_the_one_each_model_needs():
    """``config.loader_of`` (the config's checks) and ``parts.loader_mode`` (what a
    training builds) resolve ``data.loader = auto`` alike."""
    from lartpc.config import AUTO_LOADER, loader_of
    from lartpc.models import build
    from lartpc.train.parts import loader_mode

    for name in AUTO_LOADER:
        cfg = load_config(f"tiny-{name}", ["data.loader=auto"])
        assert loader_of(cfg) == loader_mode(cfg, build(name, image_size=(400, 400)))


def test_only_the_sparse_loader_takes_processes(train_events_dir):
    store = EventStore(train_events_dir)
    for mode, kw, why in [("blosc", {}, "not the 'blosc' loader's"),
                          ("sparse", {"prefetch_threads": 2}, "set one of the two")]:
        with pytest.raises(ConfigError, match=why):
            build_loader(store, mode, np.arange(len(store)), 7, processes=2, **kw)


ORPHAN = """
import sys, time
sys.path.insert(0, {tests!r})
from test_loader_processes import _double
from lartpc.data.processes import Processes
pool = Processes(_double, 2, name="orphan")
pool(1)
print(" ".join(str(p.pid) for p, _ in pool._procs), flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Is ``pid`` a live process (not gone, not a zombie waiting to be reaped)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_the_processes_end_when_the_loaders_process_is_killed():
    """A training killed outright (SIGKILL: no cleanup runs) leaves no process behind:
    each notices within a few of its one-second checks that the loader's process is
    gone."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    code = ORPHAN.format(tests=str(Path(__file__).parent))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(p) for p in pids)
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_running(p) for p in pids)
    finally:
        parent.kill()
