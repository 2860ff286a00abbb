"""Two Horovod ranks and the run folder: the lock refuses both, a signal stops both."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from train_helpers import BIN, clean_env, rows, run, train_cmd

pytestmark = [pytest.mark.slow, pytest.mark.horovod]
HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lartpc.runfolder.lock import RunLock
    RunLock(Path(sys.argv[1]), 0.0).acquire()
    print("locked", flush=True)
    time.sleep(300)
""")


def _horovodrun(data, out, *sets: str) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
            *train_cmd(data, out, *sets)]


def test_locked_folder_fails_both_ranks(train_events_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True, env=clean_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = run(_horovodrun(train_events_dir, out), timeout=300)
    finally:
        holder.kill()
        holder.wait()
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"in use by another training, pid {holder.pid}" in text
    assert f"rank 0: {out}: in use by another training" in text  # rank 1 agreed
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # nothing written


def _rank_process(launcher: subprocess.Popen, rank: int):
    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("HOROVOD_RANK") == str(rank) and "train" in child.cmdline():
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@pytest.fixture(scope="module")
def reference(train_events_dir, tmp_path_factory):
    """An uninterrupted 2-rank, 2-epoch run: what every split run must end as."""
    ref = tmp_path_factory.mktemp("segments") / "ref"
    r = run(_horovodrun(train_events_dir, ref), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    return ref


def _same_as(ref, split) -> None:
    """``split`` ended with ``ref``'s loss rows on both ranks, parameters and Adam state."""
    for rank in ("000", "001"):
        a, b = rows(ref / f"rank-{rank}.csv"), rows(split / f"rank-{rank}.csv")
        assert [x["local_loss"] for x in a] == [x["local_loss"] for x in b]
        assert [x["global_loss"] for x in a] == [x["global_loss"] for x in b]
    ca = torch.load(ref / "checkpoint.pt", weights_only=True)
    cb = torch.load(split / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    for key, sa in ca["optimizer"]["state"].items():
        sb = cb["optimizer"]["state"][key]
        assert all(torch.equal(sa[n], sb[n]) for n in ("exp_avg", "exp_avg_sq"))


def test_sigterm_to_one_rank_preempts_all_and_resumes(train_events_dir, tmp_path,
                                                      reference):
    """SIGTERM to one rank, wherever in the epoch it lands: both ranks checkpoint at
    the same step, and the resumed run ends as the uninterrupted one (rows, parameters,
    Adam state)."""
    out = tmp_path / "run"
    cmd = _horovodrun(train_events_dir, out)
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline, victim = time.monotonic() + 240, None
        while time.monotonic() < deadline and victim is None and proc.poll() is None:
            log = out / "rank-001.csv"
            if log.exists() and len(log.read_text().splitlines()) > 2:
                victim = _rank_process(proc, 1)
            time.sleep(0.05)
        assert victim is not None, "rank 1 never started training"
        victim.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=240) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "preempted"
    step = torch.load(out / "checkpoint.pt", weights_only=True)["global_step"]
    assert 0 < step < 2 * info["steps_per_epoch"]
    assert len(rows(out / "rank-000.csv")) == len(rows(out / "rank-001.csv")) == step
    r = run(cmd, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert [s["status"] for s in info["segments"]] == ["preempted", "completed"]
    r0, r1 = rows(out / "rank-000.csv"), rows(out / "rank-001.csv")
    assert len(r0) == len(r1) == 2 * info["steps_per_epoch"]
    assert [x["global_loss"] for x in r0] == [x["global_loss"] for x in r1]
    assert len({(x["epoch"], x["batchno"]) for x in r0}) == len(r0)
    _same_as(reference, out)


def _adam_steps(run_dir) -> set[float]:
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)["optimizer"]["state"]
    return {float(s["step"]) for s in state.values()}


@pytest.mark.parametrize("first, status, stop", [
    ("train.epochs=1", "completed", (1, 0)),  # at the epoch's end
    ("train.time_limit_s=1", "time_limit", (0, 1)),  # after its first step: mid-epoch
])
def test_split_run_matches_uninterrupted(train_events_dir, tmp_path, reference, first,
                                         status, stop):
    """A 2-rank Horovod run trained in two segments (its first stopped at an epoch's
    end, or after its first step, the limit being checked after each) ends with the
    rows, parameters and Adam state of an uninterrupted 2-epoch run; before the fix the
    resumed segment restarted Adam from step 0."""
    ref, split = reference, tmp_path / "split"
    r = run(_horovodrun(train_events_dir, split, first), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    saved = torch.load(split / "checkpoint.pt", weights_only=True)
    assert (saved["epoch"], saved["step_in_epoch"]) == stop
    r = run(_horovodrun(train_events_dir, split), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    info = json.loads((split / "run.json").read_text())
    assert [s["status"] for s in info["segments"]] == [status, "completed"]
    for rank in ("000", "001"):
        assert len(rows(split / f"rank-{rank}.csv")) == 2 * info["steps_per_epoch"]
    total = 2 * info["steps_per_epoch"]
    # train.noise_scale=auto by default: measured across the two ranks, resumed too
    assert len(rows(ref / "noise.csv")) == len(rows(split / "noise.csv")) > 0
    assert _adam_steps(ref) == _adam_steps(split) == {float(total)}
    _same_as(ref, split)
