"""Issue 37 in `lartpc sweep`: --max-requeues written into each job script, and a
user's train.time_limit_s kept when it is the smaller limit."""

from __future__ import annotations

import subprocess
import sys


def lartpc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc", *args], capture_output=True,
                          text=True, timeout=120)


def _dry_run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return lartpc("sweep", "--scheduler", "slurm", "--launcher", "torchrun", "--models",
                  "jishnet", "--gpus", "1", "--cores-per-rank", "1", "--data", str(tmp_path),
                  "--out-dir", str(tmp_path / "runs"), "--time", "04:00:00", "--dry-run",
                  *args)


def test_max_requeues_is_written_into_the_script(tmp_path):
    res = _dry_run(tmp_path, "--max-requeues", "3")
    assert res.returncode == 0, res.stderr
    assert "\nexport LARTPC_MAX_REQUEUES=3\n" in res.stdout
    res = _dry_run(tmp_path)
    assert res.returncode == 0 and "\nexport LARTPC_MAX_REQUEUES=20\n" in res.stdout
    res = _dry_run(tmp_path, "--max-requeues", "-1")
    assert res.returncode == 2 and "--max-requeues -1: must be 0 or more" in res.stderr


def test_users_smaller_time_limit_is_the_only_one_on_the_launch_line(tmp_path):
    res = _dry_run(tmp_path, "--set", "train.time_limit_s=3600")
    assert res.returncode == 0, res.stderr
    launch = next(ln for ln in res.stdout.splitlines() if ln.startswith("### launch:"))
    assert launch.count("train.time_limit_s=") == 1
    assert "--set train.time_limit_s=3600" in launch
