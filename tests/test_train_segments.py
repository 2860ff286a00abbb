"""`lartpc train` across segments: lock, signals, restarts, resume checks, failures.

One uninterrupted reference run (module fixture) is copied and altered by each test.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from train_helpers import clean_env, final_params, rows, run, train_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(train_events_dir, tmp_path_factory):
    """A completed 2-epoch run, and the time just before it was launched."""
    out = tmp_path_factory.mktemp("reference") / "run"
    t_launch = time.time()
    r = run(train_cmd(train_events_dir, out))
    assert r.returncode == 0, r.stderr
    return out, t_launch


def _copy(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    return out


def _info(out) -> dict:
    return json.loads((out / "run.json").read_text())


def _losses(out) -> list[tuple]:
    return [(x["epoch"], x["batchno"], x["local_loss"]) for x in rows(out / "rank-000.csv")]


def _wait_rows(out, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    log = out / "rank-000.csv"
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) - 1 >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{log}: never reached {n} rows")


def test_segment_start_uses_the_step_clock(reference):
    out, t_launch = reference
    seg = _info(out)["segments"][0]
    assert t_launch <= seg["start_time"] < float(rows(out / "rank-000.csv")[0]["time"])


def test_one_rank_run_measures_no_noise_by_default(reference):
    """train.noise_scale=auto is off on one rank (halves would change its rounding)."""
    assert not (reference[0] / "noise.csv").exists()
    assert _info(reference[0])["config"]["train"]["noise_scale"] == "auto"


def test_completed_run_is_left_alone(reference, train_events_dir, tmp_path):
    out = _copy(reference, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"}
    r = run(train_cmd(train_events_dir, out), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "is complete (2 of 2 epochs): nothing to do" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"} == before


def test_sigterm_checkpoints_preempted_and_resume_is_exact(reference, train_events_dir,
                                                          tmp_path):
    # A held folder: a second training exits at once, naming the holder (one that
    # cannot end by itself meanwhile: a thousand epochs, killed afterwards).
    held = tmp_path / "held"
    holder = subprocess.Popen(train_cmd(train_events_dir, held, "train.epochs=1000"),
                              env=clean_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_rows(held, 1, holder)
        second = run(train_cmd(train_events_dir, held), timeout=120)
        assert holder.poll() is None
        assert second.returncode == 2
        assert f"in use by another training, pid {holder.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        holder.kill()
        holder.wait(timeout=60)
    # SIGTERM as soon as three steps are logged (nothing runs in between, so the
    # two-epoch training cannot have ended)
    out = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(train_events_dir, out), env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_rows(out, 3, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    info = _info(out)
    assert info["status"] == "preempted" and info["segments"][0]["status"] == "preempted"
    done = len(rows(out / "rank-000.csv"))
    assert 3 <= done < 2 * info["steps_per_epoch"]
    assert final_params(out) is not None
    import torch

    assert torch.load(out / "checkpoint.pt", weights_only=True)["global_step"] == done
    r = run(train_cmd(train_events_dir, out))
    assert r.returncode == 0, r.stderr
    assert _losses(out) == _losses(reference[0])
    pa, pb = final_params(reference[0]), final_params(out)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert [s["status"] for s in _info(out)["segments"]] == ["preempted", "completed"]


def test_run_without_checkpoint_restarts_from_step_0(reference, train_events_dir, tmp_path):
    out = _copy(reference, tmp_path)
    (out / "checkpoint.pt").unlink()  # killed before its first checkpoint
    info = _info(out)
    info.update(status="running", end_time=None)
    (out / "run.json").write_text(json.dumps(info))
    r = run(train_cmd(train_events_dir, out))
    assert r.returncode == 0, r.stderr
    assert "restarting the run from step 0" in r.stderr
    assert _losses(out) == _losses(reference[0])  # the stale rows were replaced, not kept
    now = _info(out)
    assert now["status"] == "completed" and len(now["segments"]) == 1
    assert now["discarded_segments"] == info["segments"]


def test_resume_records_changed_settings_per_segment(reference, train_events_dir, tmp_path):
    out = _copy(reference, tmp_path)
    (out / ".checkpoint.pt.k1ll3d.lartpc-tmp").write_bytes(b"")  # left by a killed writer
    (out / ".draft.tmp").write_text("the user's")  # not ours: kept
    r = run(train_cmd(train_events_dir, out, "train.epochs=3", "train.lr=0.0005"))
    assert r.returncode == 0, r.stderr
    info = _info(out)
    assert info["config"]["train"]["lr"] == 0.001 and info["config"]["train"]["epochs"] == 2
    seg = info["segments"][-1]
    assert seg["changed"] == {"train.epochs": 3, "train.lr": 0.0005}
    assert seg["settings"]["train.lr"] == 0.0005 and seg["start_step"] == 16
    assert len(rows(out / "rank-000.csv")) == 3 * info["steps_per_epoch"]
    assert sorted(p.name for p in out.glob(".*")) == [".draft.tmp"]


def test_resume_refuses_another_store(reference, train_events_dir, tmp_path):
    out = _copy(reference, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(train_events_dir / "events-00000.h5", other)  # 35 of the 70 events
    r = run(train_cmd(other, out, "train.epochs=3"), timeout=120)
    assert r.returncode == 2
    assert "checkpoint.pt was trained on 70 events" in r.stderr and "has 35" in r.stderr
    assert "Traceback" not in r.stderr
    assert _info(out)["status"] == "completed"


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_rank_log_behind_checkpoint_is_refused(reference, train_events_dir, tmp_path, damage):
    out = _copy(reference, tmp_path)
    log = out / "rank-000.csv"
    if damage == "delete":
        log.unlink()
    else:
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:5]))
    r = run(train_cmd(train_events_dir, out, "train.epochs=3"), timeout=120)
    assert r.returncode == 2
    has = "is missing" if damage == "delete" else "has 4 complete rows"
    assert f"rank-000.csv: {has} but checkpoint.pt is at step 16" in r.stderr
    assert "Traceback" not in r.stderr


def test_crafted_checkpoint_runs_no_code(reference, train_events_dir, tmp_path):
    out = _copy(reference, tmp_path)
    marker = tmp_path / "pwned"
    code = textwrap.dedent(f"""
        import os, torch
        class P:
            def __reduce__(self):
                return os.system, ("touch {marker}",)
        torch.save({{"global_step": 1, "p": P()}}, "{out / 'checkpoint.pt'}")
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    r = run(train_cmd(train_events_dir, out), timeout=120)
    assert r.returncode == 2 and "checkpoint.pt: refused" in r.stderr
    assert not marker.exists()


def test_non_finite_loss_stops_as_diverged(train_events_dir, tmp_path):
    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out, "train.lr=1e30", "train.epochs=1"))
    assert r.returncode == 1
    assert "loss is not finite (nan)" in r.stderr and "train.lr=1e+30" in r.stderr
    info = _info(out)
    assert info["status"] == "diverged"
    log = rows(out / "rank-000.csv")
    assert log[-1]["global_loss"] == "nan" and len(log) < info["steps_per_epoch"]


DISK_FULL = textwrap.dedent("""
    import errno, sys, torch
    from lartpc.cli import main
    real, calls = torch.save, []
    def save(obj, f, *a, **k):
        calls.append(f)
        if len(calls) == 1:
            return real(obj, f, *a, **k)
        f.write(b"partial")
        if sys.argv[1] == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        # what torch.save's zip writer raises when the disk fills
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos "
                           "64 vs 0\\nPytorchStreamWriter failed writing file data/0: "
                           "file write failed")
    torch.save = save
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.parametrize("kind,reason", [
    ("oserror", "No space left on device"),
    # torch.save reports a full disk as RuntimeError; it used to leave "running"
    ("runtimeerror", "[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"),
])
def test_disk_full_fails_cleanly_and_retry_resumes(reference, train_events_dir, tmp_path,
                                                   kind, reason):
    out = tmp_path / "run"
    cmd = train_cmd(train_events_dir, out)
    r = run([sys.executable, "-c", DISK_FULL, kind, *cmd[1:]])
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"checkpoint.pt: cannot write the checkpoint ({reason}); the " \
           "previous checkpoint is kept" in r.stderr
    assert "Traceback" not in r.stderr
    info = _info(out)
    assert info["status"] == "failed" and reason in info["error"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    import torch

    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    assert _losses(out) == _losses(reference[0])


def _hup(disposition):
    """A child's SIGHUP disposition as a terminal (SIG_DFL) or ``nohup`` (SIG_IGN) leaves
    it, whatever the test runner inherited (a suite started under nohup ignores it)."""
    return lambda: signal.signal(signal.SIGHUP, disposition)


def test_sighup_checkpoints_preempted(train_events_dir, tmp_path):
    """A closed terminal or ssh session (SIGHUP) stops the run as preempted, with a
    checkpoint at the last logged step, instead of leaving status "running"."""
    out = tmp_path / "run"
    # epochs enough that it cannot complete before the signal lands on a busy host
    proc = subprocess.Popen(train_cmd(train_events_dir, out, "train.epochs=1000"),
                            env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=_hup(signal.SIG_DFL))
    try:
        _wait_rows(out, 2, proc)
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    import torch

    assert _info(out)["status"] == "preempted"
    done = len(rows(out / "rank-000.csv"))
    assert torch.load(out / "checkpoint.pt", weights_only=True)["global_step"] == done >= 2


def test_sighup_is_left_ignored_under_nohup(train_events_dir, tmp_path):
    """Started under nohup (SIGHUP ignored), the training outlives the terminal: SIGHUP
    changes nothing, and a later SIGTERM still stops it as preempted."""
    out = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(train_events_dir, out, "train.epochs=1000"),
                            env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=_hup(signal.SIG_IGN))
    try:
        _wait_rows(out, 2, proc)
        proc.send_signal(signal.SIGHUP)
        seen = len(rows(out / "rank-000.csv"))
        _wait_rows(out, seen + 3, proc)  # still training, three steps later
        assert _info(out)["status"] == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _info(out)["status"] == "preempted"


KILL_BEFORE_EVAL = textwrap.dedent("""
    import os, sys
    from lartpc.cli import main
    from lartpc.train.trainer import Trainer
    def evaluate(self):  # killed after the epoch's last step checkpoint, before evaluating
        os._exit(137)
    Trainer.evaluate = evaluate
    sys.exit(main(sys.argv[1:]))
""")


def test_kill_before_an_epoch_end_evaluation_is_made_up_on_resume(reference, train_events_dir,
                                                                  tmp_path):
    """A step checkpoint on an epoch's last step comes before that epoch's evaluation; a
    job killed between them used to resume past the epoch, its eval.csv row lost for good."""
    import torch

    out = tmp_path / "run"
    spe = _info(reference[0])["steps_per_epoch"]
    cmd = train_cmd(train_events_dir, out, f"train.checkpoint_every_steps={spe}")
    r = run([sys.executable, "-c", KILL_BEFORE_EVAL, *cmd[1:]])
    assert r.returncode == 137, r.stderr[-2000:]
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (ck["epoch"], ck["step_in_epoch"], ck["eval_rows"]) == (0, spe, [])
    r = run(cmd)
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = rows(out / "eval.csv"), rows(reference[0] / "eval.csv")
    assert [x["epoch"] for x in got] == ["0", "1"]
    # the made-up evaluation and the rest of the run are those of an uninterrupted run
    assert [{k: v for k, v in x.items() if k != "time"} for x in got] == \
           [{k: v for k, v in x.items() if k != "time"} for x in want]
    assert _losses(out) == _losses(reference[0])
    pa, pb = final_params(reference[0]), final_params(out)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
