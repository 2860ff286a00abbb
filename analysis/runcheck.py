"""Checks of what a run folder says: run.json fields and the values in its tables.

Only the shape of the files is checked in :mod:`lartpc.analysis.csvread`; here a value must also
make sense (a time before the run started, an accuracy of 2.5, a batch number beyond the
epoch, a ``steps_per_epoch`` the event count cannot give are errors naming file, line and
column). Names taken from files that end up in output file names are restricted to a
safe alphabet (:func:`safe_name`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lartpc.runfolder.record import batch_per_rank
from lartpc.runfolder.schema import STATUSES, RunFolderError  # noqa: F401 (re-exported)

#: A clock skew tolerated between the start time in run.json and the step times.
CLOCK_TOL_S = 1.0
MAX_TIME_S = 1e11  # unix seconds, year 5138: anything later is a unit or parse error
MAX_COUNT = 10 ** 12
MAX_WORLD = 10 ** 6
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def safe_name(text: str, max_len: int = 120) -> str:
    """``text`` as one file-name component: letters, digits and ``. _ + -`` only.

    Anything else (``/``, ``\\``, NUL, spaces) becomes ``_`` and leading dots are dropped,
    so the result can never leave the folder it is joined to.
    """
    name = _UNSAFE.sub("_", text).lstrip(".")[:max_len]
    return name or "_"


def is_int(v: Any, lo: int = 0, hi: int = MAX_COUNT) -> bool:
    """A JSON integer (not a bool) in [lo, hi]."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def is_time(v: Any) -> bool:
    """Unix seconds: a JSON number in [0, MAX_TIME_S] (bounded, so float() cannot overflow)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return 0 <= v <= MAX_TIME_S and math.isfinite(float(v))


def _check_segments(path: Path, segs: Any, start: float) -> None:
    if not isinstance(segs, list):
        raise RunFolderError(f"{path}: field 'segments' must be a list of "
                             f"{{start_time, end_time}} objects, got {segs!r:.80}")
    for i, seg in enumerate(segs):
        where = f"{path}: segments[{i}]"
        if not isinstance(seg, dict):
            raise RunFolderError(f"{where} must be an object, got {seg!r:.80}")
        if not is_time(seg.get("start_time")):
            raise RunFolderError(f"{where}.start_time must be unix seconds, "
                                 f"got {seg.get('start_time')!r:.80}")
        end = seg.get("end_time")
        if end is not None and not (is_time(end) and end >= seg["start_time"] - CLOCK_TOL_S):
            raise RunFolderError(f"{where}.end_time must be null or unix seconds not before "
                                 f"its start_time, got {end!r:.80}")
        if seg["start_time"] < start - CLOCK_TOL_S:
            raise RunFolderError(f"{where}.start_time {seg['start_time']} is before the "
                                 f"run's start_time {start}")


def _check_steps_per_epoch(path: Path, meta: dict[str, Any]) -> None:
    """steps_per_epoch = ceil(max shard / batch): between ceil(T/(N B)) and ceil(T/B)."""
    spe, events, batch = meta.get("steps_per_epoch"), meta.get("train_events"), \
        batch_per_rank(meta)
    if not events or not batch:
        return
    lo, hi = math.ceil(events / (batch * meta["world_size"])), math.ceil(events / batch)
    if not lo <= spe <= hi:
        raise RunFolderError(f"{path}: field 'steps_per_epoch' is {spe}, but {events} "
                             f"train_events in batches of {batch} on {meta['world_size']} "
                             f"rank(s) give between {lo} and {hi}")


def check_meta(path: Path, meta: Any) -> dict[str, Any]:
    """Validate a parsed ``run.json``; return it unchanged or raise naming the field."""
    if not isinstance(meta, dict):
        raise RunFolderError(f"{path}: expected a JSON object, got {type(meta).__name__}")

    def need(key: str, ok, what: str) -> None:
        if key not in meta:
            hint = ""
            if key == "steps_per_epoch":
                hint = (f"; the run never started training (status "
                        f"{meta.get('status')!r}: it failed or was killed during set-up)")
            raise RunFolderError(f"{path}: missing field '{key}' ({what}){hint}")
        if not ok(meta[key]):
            raise RunFolderError(f"{path}: field '{key}' must be {what}, got {meta[key]!r:.80}")

    need("model", lambda v: isinstance(v, str) and _MODEL.fullmatch(v) is not None,
         "a model name (letters, digits, '._+-', at most 64 characters)")
    need("world_size", lambda v: is_int(v, 1, MAX_WORLD), f"an integer in 1..{MAX_WORLD}")
    need("start_time", is_time, "unix seconds (a number)")
    need("status", lambda v: isinstance(v, str) and v in STATUSES,
         f"one of {', '.join(STATUSES)}")
    need("steps_per_epoch", lambda v: is_int(v, 1), "a positive integer")
    end = meta.get("end_time")
    if end is not None and not (is_time(end) and end >= meta["start_time"] - CLOCK_TOL_S):
        raise RunFolderError(f"{path}: field 'end_time' must be null or unix seconds not "
                             f"before start_time, got {end!r:.80}")
    for key, v in (("train_events", meta.get("train_events")),
                   ("eval_events", meta.get("eval_events")),
                   ("batch_per_rank", batch_per_rank(meta))):
        if v is not None and not is_int(v):
            raise RunFolderError(f"{path}: field '{key}' must be an integer in "
                                 f"0..{MAX_COUNT}, got {v!r:.80}")
    _check_segments(path, meta.get("segments", []), meta["start_time"])
    _check_steps_per_epoch(path, meta)
    return meta


def _need(path: Path, ok: bool, field: str, what: str, value) -> None:
    if not ok:
        raise RunFolderError(f"{path}: field '{field}' must be {what}, got {value!r:.80}")


def _setting_ok(name: str, v) -> bool:
    """``train.epochs`` a positive integer, ``train.time_limit_s`` seconds >= 0 (or null)."""
    if v is None:
        return True
    if name == "epochs":
        return is_int(v, 1)
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf


def check_live_meta(path: Path, meta: dict) -> dict:
    """The fields of a ``run.json`` that ``lartpc watch`` reads, checked; ``meta`` unchanged.

    Lighter than :func:`check_meta`: a training that has just started has not recorded
    all of them yet, so a missing field is fine, a wrong one is not.

    Raises
    ------
    RunFolderError
        Naming the file and the field.
    """
    if "status" in meta:
        _need(path, meta["status"] in STATUSES, "status", f"one of {', '.join(STATUSES)}",
              meta["status"])
    if "world_size" in meta:
        _need(path, is_int(meta["world_size"], 1, MAX_WORLD), "world_size",
              f"an integer in 1..{MAX_WORLD}", meta["world_size"])
    if "model" in meta:
        _need(path, isinstance(meta["model"], str), "model", "a model name", meta["model"])
    if meta.get("steps_per_epoch") is not None:
        _need(path, is_int(meta["steps_per_epoch"], 1), "steps_per_epoch",
              "a positive integer", meta["steps_per_epoch"])
    config = meta.get("config", {})
    _need(path, isinstance(config, dict), "config", "an object", config)
    train = config.get("train", {})
    _need(path, isinstance(train, dict), "config.train", "an object", train)
    segments = meta.get("segments", [])
    _need(path, isinstance(segments, list), "segments", "a list", segments)
    for i, seg in enumerate(segments):
        _need(path, isinstance(seg, dict), f"segments[{i}]", "an object", seg)
        _need(path, is_time(seg.get("start_time")), f"segments[{i}].start_time",
              "unix seconds", seg.get("start_time"))
        settings = seg.get("settings", {})
        _need(path, isinstance(settings, dict), f"segments[{i}].settings", "an object",
              settings)
        for name in ("epochs", "time_limit_s"):
            v = settings.get(f"train.{name}")
            _need(path, _setting_ok(name, v), f"segments[{i}].settings.train.{name}",
                  "a positive integer" if name == "epochs" else "seconds", v)
    for name in ("epochs", "time_limit_s"):
        _need(path, _setting_ok(name, train.get(name)), f"config.train.{name}",
              "a positive integer" if name == "epochs" else "seconds", train.get(name))
    return meta


def _first_bad(path: Path, df: pd.DataFrame, column: str, bad: np.ndarray, what: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise RunFolderError(f"{path}:{i + 2}: column '{column}': {df[column].iloc[i]!r} "
                             f"{what}")


def _fraction(path: Path, df: pd.DataFrame, column: str) -> None:
    v = df[column].to_numpy()
    _first_bad(path, df, column, ~np.isnan(v) & ~((v >= 0) & (v <= 1)),
               "is not a fraction in [0, 1]")


def check_times(path: Path, df: pd.DataFrame, start: float) -> None:
    """Column ``time``: finite unix seconds, not before the run's start (within the skew)."""
    t = df["time"].to_numpy()
    _first_bad(path, df, "time", ~np.isfinite(t), "is not finite")
    _first_bad(path, df, "time", (t < start - CLOCK_TOL_S) | (t > MAX_TIME_S),
               f"is not a time after the run's start_time {start} (unix seconds)")


def check_steps(path: Path, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    """Value checks of one ``rank-NNN.csv`` against its run.json."""
    check_times(path, df, float(meta["start_time"]))
    for col in ("epoch", "batchno", "data_size"):
        _first_bad(path, df, col, df[col].to_numpy() < 0, "is negative")
    spe = meta["steps_per_epoch"]
    _first_bad(path, df, "batchno", df["batchno"].to_numpy() >= spe,
               f"is not below steps_per_epoch {spe} in run.json")
    for col in ("local_acc", "global_acc"):
        _fraction(path, df, col)
    for col in ("data_s", "compute_s", "comm_s"):
        v = df[col].to_numpy()
        _first_bad(path, df, col, ~np.isnan(v) & ~((v >= 0) & (v < MAX_TIME_S)),
                   "is not a non-negative duration")


def check_evals(path: Path, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    """Value checks of ``eval.csv``: epochs, counts, steps and images >= 0 (the last two
    nan in rows written before issue 37), accuracies in [0, 1]."""
    check_times(path, df, float(meta["start_time"]))
    for col in ("epoch", "n_events", "step", "images"):
        _first_bad(path, df, col, df[col].to_numpy() < 0, "is negative")
    for col in df.columns:
        if col == "accuracy" or col.startswith("acc_"):
            _fraction(path, df, col)


def drop_duplicate_steps(path: Path, df: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """Keep the last row of each (epoch, batchno); rows are then in time order.

    Two writers on one folder, or a resume that did not cut the log back, log a step
    twice; counting both inflates the epoch rate. The last row is the step as it stands
    in the finished run (a resumed job redoes the steps after its checkpoint).
    """
    dup = df.duplicated(["epoch", "batchno"], keep="last").to_numpy()
    if dup.any():
        notes.append(f"{path}: {int(dup.sum())} row(s) repeat an (epoch, batchno) logged "
                     "later; kept the last of each (two writers, or a resume that did not "
                     "cut the log)")
        df = df[~dup]
    back = int((np.diff(df["time"].to_numpy()) < 0).sum())
    if back:
        notes.append(f"{path}: time goes backwards {back} time(s) in file order; rows "
                     "sorted by time")
    return df.sort_values("time", kind="stable").reset_index(drop=True)
