"""A one-node SLURM for the tests: start it, submit, wait for a job's end.

Starting runs ``jobs/slurm/local/start.sh`` (installs slurm-wlm with apt-get when
missing). Accounting is off there, so a finished job's state comes from
``scontrol show job`` (kept for MinJobAge = 600 s), not sacct.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
from pathlib import Path

from train_helpers import clean_env

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "jobs" / "slurm" / "local" / "start.sh"
STOP = ROOT / "jobs" / "slurm" / "local" / "stop.sh"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


class SlurmUnavailable(RuntimeError):
    """SLURM could not be started here; the message says why."""


#: One local SLURM per host: a test session holds this lock from start() to stop(), so a
#: second session (another checkout's suite) waits instead of restarting the controller
#: under the first one's jobs.
LOCK = Path(os.environ.get("LARTPC_SLURM_DIR", "/var/tmp/lartpc-slurm") + ".lock")
_held = None


def _take_lock(timeout_s: float) -> None:
    global _held
    if _held is not None:
        return
    f = LOCK.open("a")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _held = f
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise SlurmUnavailable(f"another test session has held the local SLURM "
                                       f"({LOCK}) for {timeout_s:.0f} s") from None
            time.sleep(1)


def _drop_lock() -> None:
    global _held
    if _held is not None:
        _held.close()  # closing the file releases the lock
        _held = None


def start(timeout_s: float = 600.0, nodes: int = 1) -> dict[str, str]:
    """Start the local SLURM with ``nodes`` nodes (2 or more: each in its own network
    namespace); the environment (with SLURM_CONF) to talk to it."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("not root: start.sh must install slurm-wlm and run slurmd")
    _take_lock(timeout_s)
    try:
        return _start(timeout_s, nodes)
    except BaseException:
        _drop_lock()  # a start that failed holds nothing (start.sh undoes its own part)
        raise


def _start(timeout_s: float, nodes: int) -> dict[str, str]:
    try:
        out = subprocess.run(["bash", str(START)], capture_output=True, text=True,
                             timeout=timeout_s,
                             env={**os.environ, "LARTPC_SLURM_NODES": str(nodes)})
    except subprocess.TimeoutExpired as e:
        raise SlurmUnavailable(f"{START} did not finish in {timeout_s:.0f} s") from e
    m = re.search(r"^export SLURM_CONF=(\S+)$", out.stdout, re.M)
    if out.returncode != 0 or not m:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise SlurmUnavailable(f"{START} failed (exit {out.returncode}):\n{tail}")
    # never an outer job's or launcher's settings (sbatch exports them all to the job)
    env = {k: v for k, v in clean_env().items() if not k.startswith("LARTPC_")}
    env["SLURM_CONF"] = m.group(1)
    return env


def stop() -> None:
    try:
        subprocess.run(["bash", str(STOP)], capture_output=True, text=True, timeout=60)
    finally:
        _drop_lock()


def sbatch(script: Path | str, env: dict[str, str], *args: str) -> str:
    """Submit ``script``; its job id."""
    out = subprocess.run(["sbatch", "--parsable", *args, str(script)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"sbatch {script} failed: {out.stderr}"
    return out.stdout.strip().split(";")[0]


def job_info(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job`` as key -> value (empty when SLURM forgot the job)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def wait(job_id: str, env: dict[str, str], timeout_s: float = 600.0) -> dict[str, str]:
    """Poll until the job reaches a final state (a requeued job is not final); its info."""
    deadline = time.monotonic() + timeout_s
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = job_info(job_id, env)
        if info.get("JobState") in FINAL_STATES:
            return info
        time.sleep(3)
    subprocess.run(["scancel", job_id], env=env, timeout=60)
    raise AssertionError(f"job {job_id} not finished after {timeout_s:.0f} s: {info}")


def start_or_skip(nodes: int = 1) -> dict[str, str]:
    """:func:`start` for a test fixture: where SLURM cannot be started the test skips
    with the reason, except under LARTPC_REQUIRE_SLURM=1 (CI), where it fails."""
    import pytest

    try:
        return start(nodes=nodes)
    except SlurmUnavailable as e:
        if os.environ.get("LARTPC_REQUIRE_SLURM") == "1":
            pytest.fail(f"LARTPC_REQUIRE_SLURM=1 but a {nodes}-node SLURM did not start: {e}")
        pytest.skip(f"{nodes}-node SLURM not available: {e}")
