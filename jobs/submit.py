"""Writing a sweep's scripts and manifest, and submitting its points once.

``manifest.json`` in the sweep's folder is appended to, never replaced: a point keeps
every job id it was ever submitted as (``jobs``), a sweep run again adds its new points
beside the old ones, and ``sweeps`` records each invocation's settings. ``--submit``
skips a point whose run completed or spent its study budget (``train.budget_s``; one
this sweep raises trains on), or whose last job is still queued or running, so
running the same command twice submits nothing twice. Every point's job is asked about
before anything is submitted: when ``squeue``/``bjobs`` fails (other than for a job it
no longer knows) nothing is submitted, since a point whose job may still be queued must
not get a second one. A SLURM requeue keeps its job id; an LSF job that resubmits itself
records the new id here (``python -m lartpc.jobs.submit``, run by common.sh), so a
requeue chain is one point's. A submission that fails for a reason the scheduler calls
temporary (controller busy or unreachable, rate limit) is retried after a pause.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lartpc.jobs.sweep import SUBMIT, Point

from lartpc.errors import LartpcError
from lartpc.fsutil import atomic_write, open_nofollow, read_nofollow
from lartpc.runfolder.record import peek_record

log = logging.getLogger(__name__)

#: Pauses before the 2nd, 3rd and 4th try of a submission the scheduler refused for now.
BACKOFF_S = (5.0, 20.0, 60.0)
#: What sbatch/bsub print when the failure is the scheduler's moment, not the script.
TRANSIENT = re.compile(
    r"socket timed out|unable to contact slurm controller|temporarily unavailable|"
    r"try again|submission rate|slurm_persist_conn|connection refused|"
    r"batch system daemon not responding|lsf is down|cannot connect to lsf", re.I)
#: What squeue/bjobs say of a job they no longer know (ended and purged): not queued.
UNKNOWN_JOB = re.compile(r"invalid job id|is not found|no matching job", re.I)
#: Seconds a squeue/bjobs may take before the sweep gives up (and submits nothing).
QUERY_TIMEOUT_S = 120
#: Job states in which a job will still run or is running.
ACTIVE = {
    "slurm": {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
              "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED", "STOPPED",
              "SIGNALING", "STAGE_OUT"},
    "lsf": {"PEND", "RUN", "PSUSP", "USUSP", "SSUSP", "WAIT", "PROV"},
}


def write_script(path: Path, text: str, mode: int = 0o644) -> None:
    """``text`` into ``path`` atomically, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text, mode)


def read_manifest(manifest: Path) -> dict:
    """The manifest already in the sweep folder (empty when there is none).

    Raises
    ------
    LartpcError
        When it exists but is not a manifest: nothing is written over it.
    """
    try:  # a manifest.json planted as a link is refused, never merged into ours
        doc = json.loads(read_nofollow(manifest))
        if not isinstance(doc, dict) or not isinstance(doc.get("points", []), list):
            raise ValueError("expected an object with a list of points")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise LartpcError(f"{manifest}: not a readable sweep manifest ({e}); move it "
                          "away or choose another --out-dir") from e
    return doc


def merge(old: dict, points: list[Point], meta: dict) -> dict:
    """``old`` manifest with this sweep's points and settings added."""
    by_name = {p.get("name"): p for p in old.get("points", []) if isinstance(p, dict)}
    for p in points:
        entry = asdict(p)
        prev = by_name.get(p.name, {})
        entry["jobs"] = list(prev.get("jobs", []))
        if p.job_id and p.job_id not in entry["jobs"]:
            entry["jobs"].append(p.job_id)
        if not p.job_id:
            entry["job_id"] = prev.get("job_id")
        by_name[p.name] = entry
    sweeps = [*old.get("sweeps", []), {k: v for k, v in meta.items() if k != "network"}]
    first = old.get("created", meta.get("created"))
    network = meta.get("network") or old.get("network")
    return {**meta, "created": first, "sweeps": sweeps, "points": list(by_name.values()),
            **({"network": network} if network else {})}


@contextlib.contextmanager
def manifest_lock(manifest: Path):
    """One writer of ``manifest`` at a time (the sweep, a job recording its resubmission),
    through ``flock`` on ``.manifest.lock`` beside it; unprotected where there is none."""
    manifest.parent.mkdir(parents=True, exist_ok=True)
    fd = open_nofollow(manifest.parent / ".manifest.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)


def write_manifest(manifest: Path, old: dict, points: list[Point], meta: dict) -> None:
    """``old`` with this sweep merged in, keeping the job ids jobs recorded meanwhile."""
    with manifest_lock(manifest):
        doc = merge(old, points, meta)
        known = {p.get("name"): p.get("jobs", []) for p in old.get("points", [])
                 if isinstance(p, dict)}
        now = {p.get("name"): p for p in read_manifest(manifest).get("points", [])
               if isinstance(p, dict)}
        for entry in doc["points"]:
            new = [j for j in now.get(entry["name"], {}).get("jobs", [])
                   if j not in entry["jobs"] and j not in known.get(entry["name"], [])]
            if new:  # an LSF job resubmitted itself while this sweep ran
                if entry.get("job_id") in known.get(entry["name"], []) + [None]:
                    entry["job_id"] = new[-1]
                entry["jobs"] = [*entry["jobs"], *new]
        write_script(manifest, json.dumps(doc, indent=2) + "\n")


def record_job(manifest: Path, name: str, job_id: str) -> bool:
    """Record ``job_id`` as point ``name``'s job (an LSF resubmission); False when the
    manifest has no such point (a script run by hand)."""
    with manifest_lock(manifest):
        doc = read_manifest(manifest)
        for entry in doc.get("points", []):
            if isinstance(entry, dict) and entry.get("name") == name:
                jobs = entry.setdefault("jobs", [])
                if job_id not in jobs:
                    jobs.append(job_id)
                entry["job_id"] = job_id
                write_script(manifest, json.dumps(doc, indent=2) + "\n")
                return True
    return False


def write(points: list[Point], scripts: dict[str, str], manifest: Path, meta: dict) -> dict:
    """Every script, then the manifest (atomic files); the manifest found before."""
    old = read_manifest(manifest)
    for p in points:
        write_script(Path(p.script), scripts[p.name], 0o755)
    write_manifest(manifest, old, points, meta)
    return old


def run_status(run: str) -> str | None:
    """The run folder's status (run.json), or None (no run.json, or not readable)."""
    return (peek_record(run) or {}).get("status")


def job_state(scheduler: str, job_id: str) -> str | None:
    """The scheduler's state of ``job_id`` (``PENDING``, ``RUN``...), None if it knows none."""
    if scheduler == "slurm":
        cmd = ["squeue", "-h", "-j", job_id, "-o", "%T"]
    else:
        cmd = ["bjobs", "-noheader", "-o", "stat", job_id]
    def refuse(why: str) -> LartpcError:
        return LartpcError(f"--submit: {why}, so whether job {job_id} is still queued is "
                           "unknown; nothing submitted (run --submit again when it answers)")

    if shutil.which(cmd[0]) is None:
        raise refuse(f"`{cmd[0]}` not found on PATH")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise refuse(f"`{' '.join(cmd)}` failed ({e})") from None
    message = " ".join((out.stderr or "").split())
    if UNKNOWN_JOB.search(message) or UNKNOWN_JOB.search(out.stdout):
        return None  # ended long enough ago that the scheduler forgot it
    if out.returncode != 0:
        raise refuse(f"`{' '.join(cmd)}` failed (exit {out.returncode}: "
                     f"{message[:200] or 'no message'})")
    state = out.stdout.strip().split("\n")[0].strip()
    return state or None


def budget_spent(run: str, budget_s: float | None) -> bool:
    """True when the run's job would end at once: run.json says its study budget is spent
    and this sweep's ``train.budget_s`` (None: not known) allows no more training time
    than the run has had (a raised budget trains on, as the job's resume would)."""
    record = peek_record(run) or {}
    if record.get("budget_spent") is not True:
        return False
    had = record.get("train_time_s", record.get("budget_s"))
    return budget_s is None or not isinstance(had, int | float) or had >= budget_s


def skip_reason(p: Point, scheduler: str, previous: dict,
                budget_s: float | None = None) -> str | None:
    """Why ``p`` must not be submitted again, or None to submit it. ``budget_s``: the
    point's ``train.budget_s`` in this sweep (None: a spent budget is final)."""
    if run_status(p.run) == "completed":
        return "its run completed"
    if budget_spent(p.run, budget_s):
        return "its run has spent its study budget (train.budget_s)"
    job = previous.get("job_id")
    if job:
        state = job_state(scheduler, str(job))
        if state in ACTIVE[scheduler]:
            return f"its job {job} is {state.lower()}"
    return None


def submit_one(exe: str, script: str, options: tuple[str, ...] = ()) -> str:
    """Submit ``script`` (with extra sbatch ``options``), retrying what the scheduler
    calls temporary; the job id."""
    for attempt in range(len(BACKOFF_S) + 1):
        if exe == "sbatch":
            out = subprocess.run([exe, "--parsable", *options, script], capture_output=True,
                                 text=True)
            job_id = out.stdout.strip().split(";")[0]
        else:  # bsub reads the script on stdin so its #BSUB lines count
            with open(script) as f:
                out = subprocess.run([exe], stdin=f, capture_output=True, text=True)
            m = re.search(r"Job <(\d+)>", out.stdout)
            job_id = m.group(1) if m else ""
        if out.returncode == 0 and job_id:
            return job_id
        message = (out.stderr or out.stdout).strip()
        if attempt < len(BACKOFF_S) and TRANSIENT.search(message):
            log.warning("%s %s: %s; trying again in %.0f s", exe, script, message,
                        BACKOFF_S[attempt])
            time.sleep(BACKOFF_S[attempt])
            continue
        raise LartpcError(f"{exe} {script} failed (exit {out.returncode}): {message}")
    raise AssertionError("not reached")


def submit_network(script: str, profile: Path, old: dict) -> str | None:
    """Submit the network measurement unless its profile exists or its job is still
    queued or running; the job id the points should wait for (None: nothing to wait)."""
    if profile.exists():
        log.info("network profile %s exists: not measured again", profile)
        return None
    job = (old.get("network") or {}).get("job_id")
    if job and job_state("slurm", str(job)) in ACTIVE["slurm"]:
        return str(job)
    return submit_one("sbatch", script)


def skip_reasons(points: list[Point], scheduler: str, old: dict,
                 budgets: dict[str, float] | None = None) -> dict[str, str]:
    """Point name -> why it is not submitted, asked of the scheduler for every point
    before any is submitted (a failed ``squeue``/``bjobs`` raises, submitting nothing).
    ``budgets``: model -> ``train.budget_s`` of this sweep's points."""
    previous = {p.get("name"): p for p in old.get("points", []) if isinstance(p, dict)}
    reasons = {p.name: skip_reason(p, scheduler, previous.get(p.name, {}),
                                   (budgets or {}).get(p.model)) for p in points}
    return {name: why for name, why in reasons.items() if why}


def submit(points: list[Point], scheduler: str, manifest: Path, meta: dict,
           old: dict, after: str | None = None,
           reasons: dict[str, str] | None = None) -> list[tuple[Point, str]]:
    """Submit every point not already done or queued; the skipped ones with the reason.

    ``after``: a job id each point starts after (the network measurement), whatever its
    outcome. ``reasons``: :func:`skip_reasons`, when asked already. Job ids go into the
    manifest as they come, so a failure half way keeps them.
    """
    exe = SUBMIT[scheduler]
    if shutil.which(exe) is None:
        raise LartpcError(f"--submit --scheduler {scheduler}: `{exe}` not found on PATH")
    if reasons is None:
        reasons = skip_reasons(points, scheduler, old)
    skipped = []
    for p in points:
        why = reasons.get(p.name)
        if why:
            skipped.append((p, why))
            continue
        try:
            p.job_id = submit_one(exe, p.script,
                                  (f"--dependency=afterany:{after}",) if after else ())
        finally:
            write_manifest(manifest, old, points, meta)
        log.info("submitted %s as job %s", p.name, p.job_id)
    return skipped


def main(argv: list[str]) -> int:
    """``python -m lartpc.jobs.submit MANIFEST POINT JOB_ID``: record an LSF job's
    resubmission of itself (jobs/slurm/common.sh) in the sweep's manifest."""
    if len(argv) != 3:
        print("usage: python -m lartpc.jobs.submit MANIFEST POINT JOB_ID", file=sys.stderr)
        return 2
    manifest, name, job_id = argv
    try:
        found = record_job(Path(manifest), name, job_id)
    except (OSError, LartpcError) as e:
        print(f"manifest {manifest}: job {job_id} of {name} not recorded: {e}", file=sys.stderr)
        return 1
    if not found:
        print(f"manifest {manifest}: no point {name}; job {job_id} not recorded",
              file=sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
