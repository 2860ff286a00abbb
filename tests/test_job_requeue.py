"""The job scripts' requeue decision (jobs/slurm/common.sh, shared by the LSF scripts)
on real `lartpc train` outcomes, with `scontrol` replaced by a recorder."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from train_helpers import clean_env, train_cmd

pytestmark = pytest.mark.slow
COMMON = Path(__file__).resolve().parents[1] / "jobs" / "slurm" / "common.sh"


def _launch(tmp_path: Path, run: Path, cmd: list[str], **extra: str
            ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``lartpc_launch CMD`` as a SLURM job would run it; the result and the scontrol
    calls it made."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    calls.unlink(missing_ok=True)
    env = clean_env(SLURM_JOB_ID="4242", LARTPC_RUN=str(run), **extra)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    script = f'set -euo pipefail; source "{COMMON}"; lartpc_launch "$@"'
    r = subprocess.run(["bash", "-c", script, "launch", *cmd], capture_output=True,
                       text=True, env=env, timeout=300)
    return r, calls.read_text().splitlines() if calls.exists() else []


def test_time_limit_requeues_but_a_refused_resume_does_not(train_events_dir, tmp_path):
    run = tmp_path / "run"
    cmd = train_cmd(train_events_dir, run, "train.epochs=5", "train.time_limit_s=1")
    r, calls = _launch(tmp_path, run, cmd)
    assert r.returncode == 0, r.stderr[-2000:]
    assert calls == ["requeue 4242"]
    assert "run status: time_limit" in r.stderr
    # The next segment's resume is refused (another seed): status stays time_limit from
    # the segment before, and the job must end with the refusal, not requeue itself.
    r, calls = _launch(tmp_path, run, [*cmd, "--set", "train.seed=7"])
    assert r.returncode == 2, r.stderr[-2000:]
    assert calls == []
    assert "train.seed" in r.stderr
    assert "training refused to run or failed on its input (exit 2" in r.stderr
    assert "not requeued" in r.stderr
    # The same refusal while the scheduler's wall-time signal arrives: the launcher
    # (which ignores the TERM passed on to it, as a slow-to-stop launcher would) signals
    # the job script, then the refused training exits 2. A checkpoint is there, yet the
    # job must end with the refusal, not requeue.
    signalled = ["bash", "-c", 'trap "" TERM; kill -USR1 "$PPID"; sleep 1; exec "$@"',
                 "launcher", *cmd, "--set", "train.seed=7"]
    r, calls = _launch(tmp_path, run, signalled)
    assert r.returncode == 2, r.stderr[-2000:]
    assert calls == []
    assert "wall-time signal while training still runs" in r.stderr
    assert "train.seed" in r.stderr
    assert "training refused to run or failed on its input (exit 2" in r.stderr
    assert "not requeued" in r.stderr


def test_torchrun_refused_resume_with_a_signal_is_not_requeued(train_events_dir, tmp_path):
    """torchrun exits 1 when a rank exits 2: the job script requeued the refusal once
    when the scheduler's signal came during it (issue 38 N12). The rank now records its
    exit 2 for the job script (LARTPC_EXIT_FILE)."""
    run = tmp_path / "run"
    cmd = train_cmd(train_events_dir, run, "train.epochs=5", "train.time_limit_s=1")
    r, calls = _launch(tmp_path, run, cmd)
    assert r.returncode == 0 and calls == ["requeue 4242"], r.stderr[-2000:]
    torchrun = [str(Path(cmd[0]).parent / "torchrun"), "--standalone", "--nproc-per-node=1",
                "-m", "lartpc", *cmd[1:], "--set", "train.seed=7"]
    signalled = ["bash", "-c", 'trap "" TERM; kill -USR1 "$PPID"; sleep 1; exec "$@"',
                 "launcher", *torchrun]
    r, calls = _launch(tmp_path, run, signalled)
    assert "wall-time signal while training still runs" in r.stderr
    assert "launcher exit code 1, but a rank exited 2" in r.stderr
    assert r.returncode == 2, r.stderr[-2000:]
    assert calls == []
    assert "training refused to run or failed on its input (exit 2" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_the_budget_ends_a_requeue_chain(train_events_dir, tmp_path):
    """Issue 37: a run that has spent train.budget_s (training time over its segments)
    is not requeued, however many requeues are left."""
    run = tmp_path / "run"
    cmd = train_cmd(train_events_dir, run, "train.epochs=50", "train.time_limit_s=1")
    r, calls = _launch(tmp_path, run, cmd)
    assert r.returncode == 0 and calls == ["requeue 4242"], r.stderr[-2000:]
    first = json.loads((run / "run.json").read_text())
    assert first["budget_spent"] is False and first["status"] == "time_limit"
    steps = len((run / "rank-000.csv").read_text().splitlines()) - 1
    # the requeued job: a budget just over what the first segment trained: its first
    # step reaches it, and the run stops there
    budget = first["train_time_s"] + 1e-6
    later = [*cmd[:-2], "--set", f"train.budget_s={budget!r}"]
    r, calls = _launch(tmp_path, run, later, SLURM_RESTART_COUNT="1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert calls == []
    assert "study budget spent" in r.stderr and "not requeued" in r.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["budget_spent"] is True and info["train_time_s"] >= budget
    assert len((run / "rank-000.csv").read_text().splitlines()) - 1 == steps + 1
    assert "study budget reached" in r.stderr
    # a job started again (by hand, or a requeue already queued) does nothing and
    # requeues nothing
    r, calls = _launch(tmp_path, run, later, SLURM_RESTART_COUNT="2")
    assert r.returncode == 0 and calls == [], r.stderr[-2000:]
    assert "has spent its budget" in r.stderr and "study budget spent" in r.stderr


def test_the_budget_spent_on_resume_is_recorded(train_events_dir, tmp_path):
    """A budget lowered below what the run has trained: nothing trains, and run.json
    says so for the job script."""
    run = tmp_path / "run"
    cmd = train_cmd(train_events_dir, run, "train.epochs=50", "train.time_limit_s=1")
    r, calls = _launch(tmp_path, run, cmd)
    assert calls == ["requeue 4242"], r.stderr[-2000:]
    r, calls = _launch(tmp_path, run, [*cmd[:-2], "--set", "train.budget_s=1e-9"])
    assert r.returncode == 0 and calls == [], r.stderr[-2000:]
    info = json.loads((run / "run.json").read_text())
    assert info["budget_spent"] is True and info["budget_s"] == 1e-9


def _setup_args(tmp_path: Path, sets: str, job_s: str) -> list[str]:
    """``lartpc_setup``'s train arguments for LARTPC_SET=``sets`` in a job whose
    computed limit is ``job_s`` (as LARTPC_TIME_LIMIT_S gives it, without a clock)."""
    env = clean_env(LARTPC_CONFIG="tiny-jishnet", LARTPC_DATA=str(tmp_path / "d"),
                    LARTPC_RUN=str(tmp_path / "r"), LARTPC_SET=sets, LARTPC_TIME_LIMIT_S=job_s,
                    LARTPC_DRY_RUN="1")
    script = (f'set -euo pipefail; source "{COMMON}"; lartpc_setup gloo; '
              'printf "%s\\n" "${LARTPC_TRAIN_ARGS[@]}"')
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.mark.parametrize(("sets", "job_s", "limit"), [
    # the launch line read --set train.time_limit_s=3600 --set ...=14100
    ("train.time_limit_s=3600 train.lr=0.1", "14100", "3600"),
    ("train.time_limit_s=20000", "14100", "14100"),
    ("train.time_limit_s=3600.5", "14100", "3600.5"),
    ("train.lr=0.1", "3300", "3300"),  # no user's: the job's
    ("train.time_limit_s=inf", "3300", "3300"),
])
def test_a_segment_limit_is_the_smaller_of_the_users_and_the_jobs(tmp_path, sets, job_s,
                                                                    limit):
    args = _setup_args(tmp_path, sets, job_s)
    limits = [a for a in args if a.startswith("train.time_limit_s=")]
    assert limits == [f"train.time_limit_s={limit}"]
    assert ("train.lr=0.1" in args) == ("train.lr" in sets)


def test_the_segment_limit_counts_from_when_the_job_worked_it_out(train_events_dir,
                                                                   tmp_path):
    """The job script exports when it computed the segment's limit
    (``$LARTPC_LIMIT_FROM``), and ``lartpc train`` counts the limit from there, so a
    slow launch (srun, torchrun, interpreters on a shared file system) cannot push the
    training's own stop past the scheduler's warning. Here the launch took "50 minutes"
    of a 60 s limit: the training stops after its first step (the limit is checked after
    each) instead of running its 60 s."""
    import time

    env = clean_env(LARTPC_CONFIG="tiny-jishnet", LARTPC_DATA=str(tmp_path / "d"),
                    LARTPC_RUN=str(tmp_path / "r"), LARTPC_TIME_LIMIT_S="60",
                    LARTPC_DRY_RUN="1")
    script = f'set -euo pipefail; source "{COMMON}"; lartpc_setup gloo; echo "$LARTPC_LIMIT_FROM"'
    before = time.time()
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(before) <= int(r.stdout.split()[-1]) <= time.time()  # exported, now
    run = tmp_path / "run"
    cmd = train_cmd(train_events_dir, run, "train.epochs=5", "train.time_limit_s=60")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=clean_env(LARTPC_LIMIT_FROM=str(int(time.time()) - 3000)))
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "time_limit"
    assert len((run / "rank-000.csv").read_text().splitlines()) == 2  # header, one step


def test_a_stale_or_bad_limit_origin(monkeypatch, caplog):
    """An origin over an hour old is not this job's (a shell that kept a job's
    environment): the limit counts from the process's start, with a warning; one that
    is no number is refused, naming the variable."""
    import time

    from lartpc.commands.train import segment_start
    from lartpc.errors import ConfigError

    now = time.time()
    monkeypatch.delenv("LARTPC_LIMIT_FROM", raising=False)
    assert segment_start(now) == now
    monkeypatch.setenv("LARTPC_LIMIT_FROM", str(now - 30))
    assert segment_start(now) == now - 30
    for stale in (now - 7200, now + 30):
        monkeypatch.setenv("LARTPC_LIMIT_FROM", str(stale))
        assert segment_start(now) == now
    assert "not within the last hour" in caplog.text
    monkeypatch.setenv("LARTPC_LIMIT_FROM", "soon")
    with pytest.raises(ConfigError, match=r"\$LARTPC_LIMIT_FROM='soon'"):
        segment_start(now)
