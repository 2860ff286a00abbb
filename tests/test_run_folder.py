"""Run-folder safety without training: lock, safe checkpoint loading, durable writes."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lartpc.errors import LartpcError
from lartpc.runfolder import record, tables
from lartpc.runfolder.lock import RunLock, holder_gone
from lartpc.runfolder.schema import LOCK, RUN_JSON, RunFolderError
from lartpc.train import checkpoint

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lartpc.runfolder.lock import RunLock
    RunLock(Path(sys.argv[1]), 123.0).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def hold_lock(run, env=None) -> subprocess.Popen:
    """A process holding ``run``'s lock (until killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_names_holder_and_dies_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    holder = hold_lock(tmp_path)
    try:
        record = json.loads((tmp_path / LOCK).read_text())
        assert record["pid"] == holder.pid and record["job_id"] == "4242"
        assert record["start_time"] == 123.0 and record["host"]
        with pytest.raises(RunFolderError, match=f"pid {holder.pid} on host .* \\(job 4242\\)"):
            RunLock(tmp_path, 1.0).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(tmp_path, 2.0).acquire()  # the kernel released the dead holder's lock
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()


def test_lock_without_flock_checks_the_recorded_holder(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = RunLock(tmp_path, time.time())  # the holder's record, written as it runs
        (tmp_path / LOCK).write_text(json.dumps({**lock.info, "pid": sleeper.pid}))
        with pytest.raises(RunFolderError, match=f"pid {sleeper.pid} .*no flock"):
            lock.acquire()
        # a record older than the live process of its pid: the pid was reused by
        # another process, the holder is gone (it refused the folder for good)
        stale = {**lock.info, "pid": sleeper.pid, "start_time": time.time() - 30 * 86400}
        (tmp_path / LOCK).write_text(json.dumps(stale))
        assert holder_gone(tmp_path / LOCK)
        RunLock(tmp_path, time.time()).acquire().release()
    finally:
        sleeper.kill()
        sleeper.wait()
    RunLock(tmp_path, 1.0).acquire().release()  # a dead holder is taken over


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_checkpoint_with_pickled_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": {}, "global_step": 1, "x": _Payload(marker)},
               tmp_path / checkpoint.CHECKPOINT)
    with pytest.raises(RunFolderError, match="checkpoint.pt: refused.*move it away"):
        checkpoint.load(tmp_path)
    assert not marker.exists()


def _save(run, step: int):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), betas=(0.8, 0.9))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return checkpoint.write(run, {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 0,
        "step_in_epoch": step, "global_step": step, "world_size": 1,
        "config": {"train": {"lr": 1e-3}}, "eval_rows": [{"epoch": 0, "loss": 1.5}],
        "train_time_s": 2.5, "scaler": None, "store": {"events": 3, "sha256": "ab"},
        "rng": checkpoint.rng_state()})


def test_checkpoint_round_trip_restores_every_rng(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal()  # a cached Gaussian is part of numpy's state
    _save(tmp_path, 5)
    expect = (torch.rand(3), np.random.normal(size=3), random.random())
    state = checkpoint.load(tmp_path)
    assert state["global_step"] == 5 and state["store"] == {"events": 3, "sha256": "ab"}
    assert state["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    checkpoint.restore_rng(state)
    got = (torch.rand(3), np.random.normal(size=3), random.random())
    assert torch.equal(got[0], expect[0]) and np.array_equal(got[1], expect[1])
    assert got[2] == expect[2]


def test_checkpoint_says_its_format_version_and_refuses_an_unknown_one(tmp_path):
    path = _save(tmp_path, 5)
    assert checkpoint.load(tmp_path)["format_version"] == checkpoint.FORMAT_VERSION == 2
    state = torch.load(path, weights_only=True)
    del state["format_version"]  # as every checkpoint before the field: version 1
    torch.save(state, path)
    assert checkpoint.load(tmp_path)["global_step"] == 5
    for bad in (checkpoint.FORMAT_VERSION + 1, 0, "2"):
        torch.save({**state, "format_version": bad}, path)
        with pytest.raises(RunFolderError, match=rf"checkpoint.pt: checkpoint format_version "
                                                 rf"{bad!r}: this lartpc reads versions 1 to 2"):
            checkpoint.load(tmp_path)


def _disk_full(obj, f, *args, **kwargs):
    f.write(b"partial")  # torch.save writes into the open temporary file
    raise OSError(errno.ENOSPC, "No space left on device")


def test_checkpoint_on_full_disk_keeps_the_last_one(tmp_path, monkeypatch):
    _save(tmp_path, 4)
    monkeypatch.setattr(torch, "save", _disk_full)
    with pytest.raises(RunFolderError, match=r"checkpoint.pt: cannot write the checkpoint "
                                             r"\(No space left on device\)"):
        _save(tmp_path, 8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert checkpoint.load(tmp_path)["global_step"] == 4


def test_atomic_write_on_full_disk_leaves_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / RUN_JSON
    record.write_record(tmp_path, {"status": "running"})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(RunFolderError, match="run.json: cannot write"):
        record.write_record(tmp_path, {"status": "completed"})
    assert [p.name for p in tmp_path.iterdir()] == [RUN_JSON]
    assert record.read_json(path) == {"status": "running"}


@pytest.mark.parametrize("content,message", [
    (None, "rank-000.csv: is missing but checkpoint.pt is at step 3"),
    ("h\n1\n2\n3", "rank-000.csv: has 2 complete rows but checkpoint.pt is at step 3"),
])
def test_step_log_behind_the_checkpoint_is_a_clear_error(tmp_path, content, message):
    if content is not None:
        tables.rank_csv_path(tmp_path, 0).write_text(content)
    with pytest.raises(RunFolderError, match=message + ".*move checkpoint.pt away"):
        tables.StepLog(tmp_path, 0, keep_steps=3)


def test_stop_signals_are_recorded_and_a_second_sigint_aborts():
    import signal

    from lartpc.train.signals import StopRequests

    stops = StopRequests().install()
    try:
        assert stops.requested is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stops.requested == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a later signal changes nothing
        assert stops.requested == signal.SIGUSR1
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stops.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


#: Installs the stop handlers, then holds the main thread in one ~2 s call into C (no
#: Python handler runs inside it, as inside a step's torch kernels) and prints what the
#: signals sent meanwhile did. With "fork", a forked child sits in C longer still.
IN_C = textwrap.dedent("""
    import hashlib, os, signal, sys, time
    from lartpc.train.signals import StopRequests

    # CPU time, not wall time: a process preempted while it calibrates would size its
    # C call too short (the signals below would come after it); this way only longer
    t = time.thread_time()
    hashlib.pbkdf2_hmac("sha256", b"k", b"s", 50_000)
    rate = 50_000 / max(time.thread_time() - t, 1e-6)

    def in_c(seconds):
        hashlib.pbkdf2_hmac("sha256", b"k", b"s", int(rate * seconds))

    stops = StopRequests().install()
    child = os.fork() if "fork" in sys.argv else None
    if child == 0:
        try:
            in_c(6.0)
        finally:
            os._exit(0)
    print("ready", os.getpid(), child or "", flush=True)
    try:
        in_c(2.0)
        result = signal.Signals(stops.requested).name if stops.requested else "none"
    except KeyboardInterrupt:
        result = "aborted"
    stops.restore()
    if child:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    print(result, flush=True)
""")


def _signalled_in_c(*signals: int, fork: bool = False) -> str:
    """What ``signals``, sent 50 ms apart (to the forked child too, as a Ctrl-C reaches
    the whole process group) while :data:`IN_C` is inside its C call, did."""
    p = subprocess.Popen([sys.executable, "-c", IN_C, *["fork"] * fork],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [int(w) for w in p.stdout.readline().split()[1:]]
    start = time.monotonic()
    time.sleep(0.2)
    for i, sig in enumerate(signals):
        time.sleep(0.05 * (i > 0))
        for pid in pids:
            os.kill(pid, sig)
    assert time.monotonic() - start < 1.5, "sent too late: not inside the C call"
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    return out.strip()


@pytest.mark.parametrize("signals,result", [
    ((signal.SIGINT, signal.SIGINT), "aborted"),  # Ctrl-C twice within one step
    ((signal.SIGINT,), "SIGINT"),
    ((signal.SIGTERM, signal.SIGTERM), "SIGTERM"),  # a scheduler's repeated TERM
    ((signal.SIGINT, signal.SIGTERM), "SIGINT"),
    # a scheduler's TERM, then the user's Ctrl-C: Python runs SIGINT's handler first
    # (signal-number order), so it read as the first and did not abort
    ((signal.SIGTERM, signal.SIGINT), "aborted"),
    ((signal.SIGUSR1, signal.SIGINT), "aborted"),
])
def test_signals_that_arrive_within_one_c_call_each_count(signals, result):
    """Two Ctrl-Cs 50 ms apart during a long step abort: CPython runs the handler once
    for both (it ended "preempted" after the step); a scheduler's second TERM still
    changes nothing."""
    assert _signalled_in_c(*signals) == result


def test_a_forked_childs_signal_does_not_count_in_the_parent():
    """A loader process forked after the handlers were installed: one Ctrl-C reaches it
    and the training; the training counts one, not two, and checkpoints."""
    assert _signalled_in_c(signal.SIGINT, fork=True) == "SIGINT"


@pytest.mark.parametrize("data,message", [
    (b'{\n  "status": "running",\n  oops\n}', r"not valid JSON \(line 3, column 3"),
    (b"\xff\xfe{", r"not UTF-8 text \(byte 0\)"),
    (b"[1, 2]", "expected a JSON object, found list"),
])
def test_run_record_reader_names_the_file(tmp_path, data, message):
    (tmp_path / RUN_JSON).write_bytes(data)
    with pytest.raises(RunFolderError, match=f"{RUN_JSON}: {message}"):
        record.read_record(tmp_path)
    assert record.peek_record(tmp_path) is None  # the views that poll a folder
    (tmp_path / RUN_JSON).unlink()
    with pytest.raises(RunFolderError, match=f"{RUN_JSON}: cannot read"):
        record.read_record(tmp_path)
    assert record.peek_record(tmp_path) is None


def test_batch_per_rank_from_the_config_or_an_old_record():
    assert record.batch_per_rank({"config": {"train": {"batch_per_rank": 56}}}) == 56
    assert record.batch_per_rank({"batch_per_rank": 7, "config": {"train": {}}}) == 7
    assert record.batch_per_rank({"config": "torn"}) is None


@pytest.mark.parametrize("name", ["run-scnet-beam", "run-scnet-isotropic"])
def test_committed_run_folders_with_the_old_top_level_copy_load(name):
    """Written while run.json held batch_per_rank twice; they still load and agree."""
    from lartpc.analysis.runs import load_run

    run = load_run(Path(__file__).resolve().parents[1] / "docs/results/fidelity-runs" / name)
    assert record.batch_per_rank(run.meta) == run.meta["batch_per_rank"] == 56


def test_segments_keep_a_resumed_record_and_discard_on_restart(tmp_path):
    from lartpc.config import load_config

    cfg = load_config("tiny-jishnet").to_dict()
    seg = {"start_time": 1.0, "end_time": 2.0, "status": "time_limit"}
    record.write_record(tmp_path, {"start_time": 1.0, "segments": [seg], "config": cfg,
                                   "batch_per_rank": 7, "status": "time_limit"})
    info = record.begin_segment(cfg, tmp_path, 5, 3.0, {"events": 9})
    assert (info["start_time"], info["batch_per_rank"], info["store"]) == (1.0, 7, {"events": 9})
    assert [s["start_step"] for s in info["segments"][1:]] == [5]
    record.end_segment(info, "completed", 4.0)
    assert info["status"] == info["segments"][-1]["status"] == "completed"
    record.write_record(tmp_path, info)
    fresh = record.begin_segment(cfg, tmp_path, None, 5.0, {"events": 9})
    assert "batch_per_rank" not in fresh and fresh["start_time"] == 5.0
    assert len(fresh["discarded_segments"]) == 2 and len(fresh["segments"]) == 1


def test_run_folder_object_takes_records_and_lets_go(tmp_path):
    from lartpc.runfolder.folder import RunFolder

    run = RunFolder(tmp_path / "run").take(process_start=1.0, world_size=1)
    with pytest.raises(RunFolderError, match="in use by another training"):
        RunFolder(tmp_path / "run").take(process_start=2.0, world_size=1)
    from lartpc.config import Config

    run.begin_segment(Config().to_dict(), None, 1.0, {"events": 3, "sha256": "ab"},
                      model="scnet", world_size=2)
    on_disk = record.read_record(run.path)
    assert on_disk["status"] == "running" and on_disk["model"] == "scnet"
    assert on_disk["segments"][-1]["status"] == "running" and on_disk["store"]["events"] == 3
    run.update(steps_per_epoch=4)
    assert run.record()["steps_per_epoch"] == 4
    run.info["train_time_s"] = 2.5  # kept for the end of the segment
    run.end_segment("completed")
    done = run.record()
    assert done["status"] == done["segments"][-1]["status"] == "completed"
    assert done["train_time_s"] == 2.5 and done["end_time"] is not None
    run.release()
    RunFolder(tmp_path / "run").take(process_start=3.0, world_size=1).release()  # free again
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "thesis.tex").write_text("mine\n")
    with pytest.raises(LartpcError, match="not a run folder"):
        RunFolder(tmp_path / "user").take(process_start=4.0, world_size=1)
