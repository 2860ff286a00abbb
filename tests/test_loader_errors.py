"""How the sparse loader's processes and a loader's end fail: with the cause in the
caller's error, not a dead process named; an epoch that ends while a process is stuck
in a batch ends at once, and the loader goes on serving the right batches; a closed
loader says so."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from lartpc.data import BLOSC_CODECS, LOADERS
from lartpc.data import loaders as loaders_mod
from lartpc.data.blosc_cache import BloscConfig
from lartpc.data.loaders import build_loader
from lartpc.data.packing import unpack
from lartpc.data.processes import Processes
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError, LartpcError

pytestmark = pytest.mark.sparse

#: seconds a step that should end at once is given before the test calls it hung (a
#: guard against a hang, not a measurement: the old wait was 900 s)
HANG_GUARD_S = 120


def _unpicklable(x):
    return {"x": torch.full((x,), x), "call": lambda: x}  # a lambda: does not pickle


class _TwoArgs(Exception):
    def __init__(self, path, why):  # pickles, but cannot be rebuilt from its args
        super().__init__(f"{path}: {why}")


def _two_args(x):
    if x < 0:
        raise _TwoArgs("/data/events-00001.h5", f"pixel {x} out of range")
    return {"x": torch.full((x,), 2 * x)}


def test_a_batch_that_does_not_pickle_is_the_callers_error_with_its_cause():
    """The process used to crash on sending it: the caller read 'ended with exit code 1
    (killed, or out of memory?)' and the cause was on the process's stderr only."""
    pool = Processes(_unpicklable, 1, name="probe")
    try:
        with pytest.raises(RuntimeError, match=r"(?s)does not pickle.*Can't pickle local "
                                               r"object '_unpicklable.<locals>.<lambda>'"):
            pool(3)
        assert pool._procs[0][0].is_alive()  # not crashed: it serves the next call
        with pytest.raises(RuntimeError, match="does not pickle"):
            pool(2)
    finally:
        pool.close()


def test_an_exception_that_does_not_unpickle_is_the_callers_error_with_its_cause():
    """It pickled in the process and failed to unpickle in the caller: a TypeError about
    ``__init__`` there, the process ended for good, and every later call said it 'was
    interrupted while making a batch'."""
    pool = Processes(_two_args, 1, name="probe")
    try:
        with pytest.raises(RuntimeError, match=r"_TwoArgs: /data/events-00001.h5: pixel -1 "
                                               r"out of range"):
            pool(-1)
        assert unpack(*pool(3))["x"].tolist() == [6, 6, 6]  # and it goes on working
    finally:
        pool.close()


class _Gate:
    """A table builder whose second call in a process writes ``started`` and waits
    until ``release`` exists: a loader process stuck in a batch."""

    def __init__(self, folder):
        self.started, self.release, self.calls = folder / "started", folder / "release", 0

    def __call__(self, coords, batch_size):
        self.calls += 1
        if self.calls == 2:
            self.started.touch()
            while not self.release.exists():
                time.sleep(0.05)
        return None


def _wait_for(path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_an_epoch_ended_while_a_process_is_stuck_ends_at_once_and_the_loader_goes_on(
        train_events_dir, tmp_path):
    """Closing the epoch (a stop, a preemption) used to join the prefetch thread with
    no limit, while the thread waited up to 900 s for the stuck process: the
    preemption's checkpoint came after the scheduler's grace time. Now the thread stops
    waiting; the process's late reply is discarded, not served as the next batch."""
    store = EventStore(train_events_dir)
    kw = dict(seed=3, prefetch_depth=1, rulebooks=_Gate(tmp_path))
    gated = build_loader(store, "sparse", np.arange(len(store)), 7, processes=1, **kw)
    try:
        it = iter(gated)
        first = next(it)
        _wait_for(tmp_path / "started")  # batch 1's process is now stuck in it
        closer = threading.Thread(target=it.close, daemon=True)
        closer.start()
        closer.join(timeout=HANG_GUARD_S)
        assert not closer.is_alive(), "closing the epoch waited for the stuck process"
        (tmp_path / "release").touch()  # its reply, batch 1, now comes: unread
        again = list(gated)
    finally:
        (tmp_path / "release").touch()
        gated.close()
    threads = list(build_loader(store, "sparse", np.arange(len(store)), 7,
                                **{**kw, "rulebooks": None}))
    assert len(again) == len(threads) > 5
    for a, b in zip([threads[0], *threads], [first, *again], strict=True):
        assert list(a.event_ids) == list(b.event_ids)
        assert torch.equal(a.labels, b.labels) and torch.equal(a.coords, b.coords)
        assert torch.equal(a.features, b.features) and a.features.abs().sum() > 0


@pytest.mark.parametrize("mode,kw", [("sparse", {"processes": 2}), ("sparse", {}),
                                     ("blosc", {})])
def test_a_closed_loader_says_so(train_events_dir, mode, kw):
    """A closed sparse loader with processes used to say its process 'ended with exit
    code 0 while making a batch (killed, or out of memory?)'."""
    store = EventStore(train_events_dir)
    loader = build_loader(store, mode, np.arange(20), 4, **kw)
    assert len(next(iter(loader)).labels) == 4
    loader.close()
    loader.close()  # twice: nothing more to do
    with pytest.raises(LartpcError, match=f"{mode} loader: closed"):
        next(iter(loader))
    assert len(loader) == 5  # what it would yield is still known


def test_the_loader_modes_and_blosc_codecs_come_from_one_list():
    assert tuple(loaders_mod._CLASSES) == LOADERS
    for codec in BLOSC_CODECS:
        BloscConfig(codec=codec).cparams()
    with pytest.raises(ConfigError, match=f"choose from {', '.join(BLOSC_CODECS)}"):
        BloscConfig(codec="ndlz").cparams()
    # the config refuses the same names, with the option named, before anything is read
    from lartpc.config import load_config

    assert load_config("tiny-jishnet", ["data.blosc_codec=zstd"]).data.blosc_codec == "zstd"
    with pytest.raises(ConfigError, match="data.blosc_codec = 'ndlz': expected one of "
                                          + ", ".join(BLOSC_CODECS)):
        load_config("tiny-jishnet", ["data.blosc_codec=ndlz"])
