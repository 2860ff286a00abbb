"""Writing a sweep's scripts and manifest, and submitting its points once.

``manifest.json`` in the sweep's folder is appended to, never replaced: a point keeps
every job id it was ever submitted as (``jobs``), a sweep run again adds its new points
beside the old ones, and ``sweeps`` records each invocation's settings. ``--submit``
skips a point whose run completed or whose last job is still queued or running, so
running the same command twice submits nothing twice. A submission that fails for a
reason the scheduler calls temporary (controller busy or unreachable, rate limit) is
retried after a pause.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from lartpc.jobs.sweep import SUBMIT, Point

from lartpc.errors import LartpcError
from lartpc.runfolder.durable import atomic_write, read_nofollow
from lartpc.runfolder.record import peek_record

log = logging.getLogger(__name__)

#: Pauses before the 2nd, 3rd and 4th try of a submission the scheduler refused for now.
BACKOFF_S = (5.0, 20.0, 60.0)
#: What sbatch/bsub print when the failure is the scheduler's moment, not the script.
TRANSIENT = re.compile(
    r"socket timed out|unable to contact slurm controller|temporarily unavailable|"
    r"try again|submission rate|slurm_persist_conn|connection refused|"
    r"batch system daemon not responding|lsf is down|cannot connect to lsf", re.I)
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


def write_manifest(manifest: Path, old: dict, points: list[Point], meta: dict) -> None:
    write_script(manifest, json.dumps(merge(old, points, meta), indent=2) + "\n")


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
    if shutil.which(cmd[0]) is None:
        return None
    out = subprocess.run(cmd, capture_output=True, text=True)
    state = out.stdout.strip().split("\n")[0].strip() if out.returncode == 0 else ""
    return state or None


def skip_reason(p: Point, scheduler: str, previous: dict) -> str | None:
    """Why ``p`` must not be submitted again, or None to submit it."""
    if run_status(p.run) == "completed":
        return "its run completed"
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


def submit(points: list[Point], scheduler: str, manifest: Path, meta: dict,
           old: dict, after: str | None = None) -> list[tuple[Point, str]]:
    """Submit every point not already done or queued; the skipped ones with the reason.

    ``after``: a job id each point starts after (the network measurement), whatever its
    outcome. Job ids go into the manifest as they come, so a failure half way keeps them.
    """
    exe = SUBMIT[scheduler]
    if shutil.which(exe) is None:
        raise LartpcError(f"--submit --scheduler {scheduler}: `{exe}` not found on PATH")
    previous = {p.get("name"): p for p in old.get("points", []) if isinstance(p, dict)}
    skipped = []
    for p in points:
        why = skip_reason(p, scheduler, previous.get(p.name, {}))
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
