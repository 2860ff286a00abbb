"""The run record, ``run.json``: the one reader and writer, for training and analysis.

``run.json`` is rewritten whole (a temporary file and a rename), so a reader finds the
old file or the new one, never a mix. A run is trained in *segments* (one per job:
requeued, preempted, resumed); each appends one to ``segments`` as it starts
(:func:`begin_segment`) and marks it as it ends (:func:`end_segment`), with the settings
that may change between segments, instead of overwriting the run's ``config``.

Readers: :func:`read_record` raises :class:`RunFolderError` naming the file (training,
analysis, the job scripts' helpers); :func:`peek_record` gives ``None`` for a file that
is missing or cannot be read whole (the live view and job status, which poll a folder
another process writes). Standard library only.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from lartpc.fsutil import UnsafePathError, atomic_write, read_nofollow
from lartpc.runfolder.lock import job_id
from lartpc.runfolder.schema import CHECKPOINT, RUN_JSON, RunFolderError, Status

log = logging.getLogger(__name__)
#: Recorded in every segment: these may change between segments of one run.
SEGMENT_SETTINGS = ("train.lr", "train.epochs", "train.time_limit_s", "train.budget_s",
                    "train.checkpoint_every_steps", "train.checkpoint_every_s")
#: What a training says about a run.json it cannot read.
_ADVICE = "; restore it from a backup, or move the run folder away to start afresh"


def record_path(run: Path | str) -> Path:
    """``<run>/run.json``."""
    return Path(run) / RUN_JSON


def write_text(path: Path, text: str) -> None:
    """Replace a run file with ``text`` (temporary file and rename: never torn), durably.

    Raises
    ------
    RunFolderError
        When it cannot be written (disk full...); ``path`` keeps its old content and no
        temporary file is left behind.
    """
    try:
        atomic_write(path, text)
    except OSError as e:
        raise RunFolderError(f"{path}: cannot write ({e.strerror or e})") from None


def write_record(run: Path | str, info: dict) -> None:
    """Rewrite ``run.json`` of ``run`` with ``info``."""
    write_text(record_path(run),
               json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path | str, advice: str = "") -> dict[str, Any]:
    """A run-folder JSON file as a dict; ``advice`` ends the message of a file that is
    not JSON (what the user can do about it).

    Raises
    ------
    RunFolderError
        Naming the file when it cannot be read, is a symbolic link, is not UTF-8, not
        JSON (with the line and column) or not a JSON object (a torn or edited file).
    """
    try:
        text = read_nofollow(path).decode("utf-8")  # a planted link is never read
    except UnsafePathError as e:
        raise RunFolderError(str(e)) from None
    except OSError as e:
        raise RunFolderError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise RunFolderError(f"{path}: not UTF-8 text (byte {e.start}), not JSON"
                             f"{advice}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                             f"{e.msg}){advice}") from None
    except RecursionError:
        raise RunFolderError(f"{path}: not valid JSON (nested too deeply){advice}") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_record(run: Path | str, advice: str = "") -> dict[str, Any]:
    """``run.json`` of the run folder ``run`` (see :func:`read_json`)."""
    return read_json(record_path(run), advice)


def peek_record(run: Path | str) -> dict[str, Any] | None:
    """``run.json`` of ``run``, or None when it is missing or cannot be read whole."""
    try:
        return read_record(run)
    except RunFolderError:
        return None


def batch_per_rank(meta: dict[str, Any]) -> Any:
    """Events per rank per step of a run record: ``config.train.batch_per_rank``, or the
    top-level ``batch_per_rank`` of a run.json written before that copy was dropped;
    None when neither is there (the value is not checked)."""
    train = meta.get("config")
    train = train.get("train") if isinstance(train, dict) else None
    if isinstance(train, dict) and "batch_per_rank" in train:
        return train["batch_per_rank"]
    return meta.get("batch_per_rank")


def check_continuable(run: Path | str, resume: bool) -> None:
    """Refuse a run folder whose ``run.json`` :func:`begin_segment` cannot continue.

    Checked where the folder is taken, before any backend starts, so every rank fails at
    once with the file and field named. A resume (``resume``: ``checkpoint.pt`` is
    there) keeps the record: it needs ``run.json`` with the run's ``config``,
    ``start_time`` and ``segments``. A restart from step 0 keeps only the old
    ``segments`` and ``discarded_segments`` (lists, where present).

    Raises
    ------
    RunFolderError
        Naming the file and the field, and what the user can do.
    """
    path = record_path(run)
    if not os.path.lexists(path):
        if resume:  # a new record would start after the rank logs' rows
            raise RunFolderError(f"{run}: {CHECKPOINT} but no {RUN_JSON} (the run's record); "
                                 f"restore {RUN_JSON} from a backup to resume, or move "
                                 f"{CHECKPOINT} away to restart the run from step 0")
        return
    info = read_json(path, _ADVICE)

    def segments(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(s, dict) for s in v)

    fields = {
        "config": (lambda v: isinstance(v, dict), "an object (the run's config)"),
        "start_time": (lambda v: isinstance(v, int | float) and not isinstance(v, bool),
                       "unix seconds (a number)"),
        # a checkpoint is written after its segment was opened: never with none
        "segments": (lambda v: segments(v) and len(v) > 0, "a non-empty list of objects"),
    } if resume else {"segments": (segments, "a list of objects"),
                      "discarded_segments": (segments, "a list of objects")}
    for key, (ok, what) in fields.items():
        if key not in info:
            if resume:
                raise RunFolderError(f"{path}: missing field '{key}' ({what}){_ADVICE}")
        elif not ok(info[key]):
            raise RunFolderError(f"{path}: field '{key}' must be {what}, got "
                                 f"{info[key]!r:.80}{_ADVICE}")


def flat(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def begin_segment(config: dict, out: Path, resume_step: int | None, process_start: float,
                  store_id: dict) -> dict:
    """The run record as this segment starts it (rank 0; written by the caller).

    ``config`` is this job's (``Config.to_dict()``); ``resume_step`` the checkpoint's
    global step, None for a start at step 0. A resumed run keeps its recorded config and
    start time; the segment notes the settings it runs with and every config value that
    differs from the recorded one. A restart from step 0 keeps earlier segments under
    ``discarded_segments``.
    """
    path = record_path(out)
    old = read_json(path, _ADVICE) if path.exists() else None
    if resume_step is not None and old is not None:
        info = old
    else:
        info = {"start_time": process_start, "segments": [], "config": config}
        if old is not None:
            info["discarded_segments"] = old.get("discarded_segments", []) + \
                old.get("segments", [])
    recorded, current = flat(info["config"]), flat(config)
    changed = {k: v for k, v in current.items() if recorded.get(k) != v}
    for k, v in changed.items():
        log.warning("config %s=%r for this segment (the run was started with %r)", k, v,
                    recorded.get(k))
    info["store"] = store_id
    info["segments"].append({
        "start_time": process_start, "end_time": None, "status": Status.RUNNING.value,
        "start_step": resume_step or 0, "job_id": job_id(),
        "settings": {k: current[k] for k in SEGMENT_SETTINGS}, "changed": changed})
    return info


def end_segment(info: dict, status: str, end_time: float | None,
                error: str | None = None) -> None:
    """Mark the run and its last segment with how this segment ended."""
    info.update(status=status, end_time=end_time)
    info["segments"][-1].update(status=status, end_time=end_time)
    if error is not None:
        info["error"] = error
    else:
        info.pop("error", None)
