"""The job scripts' requeue decision (jobs/slurm/common.sh, shared by the LSF scripts)
on real `lartpc train` outcomes, with `scontrol` replaced by a recorder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from train_helpers import clean_env, train_cmd

pytestmark = pytest.mark.slow
COMMON = Path(__file__).resolve().parents[1] / "jobs" / "slurm" / "common.sh"


def _launch(tmp_path: Path, run: Path, cmd: list[str]) -> tuple[subprocess.CompletedProcess,
                                                                 list[str]]:
    """``lartpc_launch CMD`` as a SLURM job would run it; the result and the scontrol
    calls it made."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    calls.unlink(missing_ok=True)
    env = clean_env(SLURM_JOB_ID="4242", LARTPC_RUN=str(run))
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
