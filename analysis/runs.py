"""Reading and validating run folders (run.json, rank-NNN.csv, eval.csv, confusion.csv).

The folder layout is the contract with the training side (see DESIGN.md). Everything a
user can get wrong raises :class:`RunFolderError` naming the file and, for tables, the line.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

#: Class names in index order; the same as ``lartpc.CLASSES`` (a test checks they agree).
#: Kept here so the analysis never needs the training package.
CLASSES: tuple[str, ...] = ("gamma", "electron", "muon", "pion", "kaon")

STEP_COLUMNS: tuple[str, ...] = (
    "time", "epoch", "rank", "batchno", "data_size", "local_loss", "global_loss",
    "local_acc", "global_acc", "data_s", "compute_s", "comm_s")
EVAL_COLUMNS: tuple[str, ...] = (
    "epoch", "time", "loss", "accuracy", "n_events", *(f"acc_{c}" for c in CLASSES))
CONFUSION_HEADER: tuple[str, ...] = ("true", *CLASSES)
STATUSES = ("running", "completed", "time_limit", "failed")
_INT_STEP_COLUMNS = ("epoch", "rank", "batchno", "data_size")
_RANK_FILE = re.compile(r"rank-(\d{3,})\.csv$")


class RunFolderError(ValueError):
    """A run folder, or a file in it, does not follow the run-folder contract."""


@dataclass
class Run:
    """One training run as read from its folder.

    Attributes
    ----------
    path : Path
        The run folder.
    meta : dict
        The parsed ``run.json``.
    steps : dict[int, pandas.DataFrame]
        Per-rank step tables (columns :data:`STEP_COLUMNS`), in file order.
    evals : pandas.DataFrame | None
        ``eval.csv`` when present.
    confusion : numpy.ndarray | None
        5x5 counts from ``confusion.csv`` (rows true, columns predicted) when present.
    """

    path: Path
    meta: dict[str, Any]
    steps: dict[int, pd.DataFrame] = field(default_factory=dict)
    evals: pd.DataFrame | None = None
    confusion: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model(self) -> str:
        return str(self.meta["model"])

    @property
    def world_size(self) -> int:
        return int(self.meta["world_size"])

    @property
    def seed(self) -> int | None:
        """The ``seed`` found anywhere in the resolved config, if any."""
        return _find_key(self.meta.get("config") or {}, "seed")


def _find_key(d: Any, key: str) -> Any:
    if isinstance(d, dict):
        if key in d and not isinstance(d[key], dict):
            return d[key]
        for v in d.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run folders named by ``paths``: each is a run folder or a folder holding some below it.

    Raises
    ------
    RunFolderError
        A path does not exist, or no ``run.json`` is found under it.
    """
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RunFolderError(f"{p}: no such file or directory")
        if p.is_file():
            p = p.parent if p.name == "run.json" else p
        if (p / "run.json").is_file():
            found.append(p)
            continue
        below = sorted(q.parent for q in p.rglob("run.json"))
        if not below:
            raise RunFolderError(f"{p}: not a run folder (missing {p / 'run.json'}) "
                                 "and no run.json found below it")
        found.extend(below)
    unique = list(dict.fromkeys(q.resolve() for q in found))
    return unique


def _check_meta(path: Path, meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise RunFolderError(f"{path}: expected a JSON object, got {type(meta).__name__}")

    def need(key: str, ok, what: str) -> None:
        if key not in meta:
            raise RunFolderError(f"{path}: missing field '{key}' ({what})")
        if not ok(meta[key]):
            raise RunFolderError(f"{path}: field '{key}' must be {what}, got {meta[key]!r}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v: Any) -> bool:
        return is_int(v) or (isinstance(v, float) and math.isfinite(v))

    need("model", lambda v: isinstance(v, str) and v != "", "a model name string")
    need("world_size", lambda v: is_int(v) and v >= 1, "a positive integer")
    need("start_time", is_num, "unix seconds (a number)")
    need("status", lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}")
    need("steps_per_epoch", lambda v: is_int(v) and v >= 1, "a positive integer")
    if meta.get("end_time") is not None and not is_num(meta["end_time"]):
        raise RunFolderError(f"{path}: field 'end_time' must be a number or null, "
                             f"got {meta['end_time']!r}")
    for key in ("train_events", "eval_events", "batch_per_rank"):
        if key in meta and not (is_int(meta[key]) and meta[key] >= 0):
            raise RunFolderError(f"{path}: field '{key}' must be a non-negative integer, "
                                 f"got {meta[key]!r}")
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """Parse and validate one ``run.json``."""
    try:
        text = path.read_text()
    except OSError as e:
        raise RunFolderError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from e
    return _check_meta(path, meta)


def _scan_for_error(path: Path, columns: tuple[str, ...]) -> None:
    """Find the first bad line the fast reader choked on; raise naming it."""
    with path.open(newline="") as f:
        for lineno, row in enumerate(csv.reader(f), start=1):
            if lineno == 1:
                continue
            if len(row) != len(columns):
                raise RunFolderError(f"{path}:{lineno}: expected {len(columns)} fields, "
                                     f"found {len(row)}")
            for name, value in zip(columns, row, strict=True):
                try:
                    float(value)
                except ValueError:
                    raise RunFolderError(f"{path}:{lineno}: column '{name}': {value!r} is "
                                         "not a number") from None


def _complete_lines(path: Path) -> Path | io.BytesIO:
    """``path``, or its text without a last line that lacks its newline: a running
    training is writing that line (or a kill tore it), so it is not data yet."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return path
    log.debug("%s: leaving out a partial last line", path)
    return io.BytesIO(data[:data.rfind(b"\n") + 1])


def read_table(path: Path, columns: tuple[str, ...],
               int_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Read a numeric CSV whose header must be exactly ``columns``.

    ``nan``/``inf`` are accepted (a diverged loss is a real outcome); empty cells, text and
    wrong field counts are errors naming the line. ``int_columns`` must hold whole numbers.
    """
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), None)
    except OSError as e:
        raise RunFolderError(f"{path}: cannot read: {e.strerror or e}") from e
    if header is None:
        raise RunFolderError(f"{path}:1: empty file, expected header {','.join(columns)}")
    if tuple(h.strip() for h in header) != columns:
        raise RunFolderError(f"{path}:1: header is {','.join(header)!r}, expected "
                             f"{','.join(columns)!r}")
    try:
        df = pd.read_csv(_complete_lines(path), dtype=np.float64, keep_default_na=False,
                         na_values=["nan", "NaN"], index_col=False, on_bad_lines="error")
    except (ValueError, pd.errors.ParserError) as e:
        _scan_for_error(path, columns)
        raise RunFolderError(f"{path}: malformed CSV: {e}") from e
    df.columns = list(columns)
    for name in int_columns:
        v = df[name].to_numpy()
        bad = ~np.isfinite(v) | (v != np.round(v))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RunFolderError(f"{path}:{i + 2}: column '{name}': {v[i]!r} is not a whole "
                                 "number")
    return df


def read_confusion(path: Path) -> np.ndarray:
    """Read ``confusion.csv``: header ``true,<classes>``, then one row per true class."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(c.strip() for c in rows[0]) != CONFUSION_HEADER:
        got = ",".join(rows[0]) if rows else ""
        raise RunFolderError(f"{path}:1: header is {got!r}, expected "
                             f"{','.join(CONFUSION_HEADER)!r}")
    body = [r for r in rows[1:] if r]
    if len(body) != len(CLASSES):
        raise RunFolderError(f"{path}: expected {len(CLASSES)} rows after the header, "
                             f"found {len(body)}")
    counts = np.zeros((len(CLASSES), len(CLASSES)), dtype=np.int64)
    for i, (cls, row) in enumerate(zip(CLASSES, body, strict=True)):
        lineno = i + 2
        if len(row) != len(CONFUSION_HEADER):
            raise RunFolderError(f"{path}:{lineno}: expected {len(CONFUSION_HEADER)} fields, "
                                 f"found {len(row)}")
        if row[0].strip() != cls:
            raise RunFolderError(f"{path}:{lineno}: row label {row[0]!r}, expected {cls!r} "
                                 "(classes in order " + ", ".join(CLASSES) + ")")
        for j, value in enumerate(row[1:]):
            try:
                n = int(value)
            except ValueError:
                raise RunFolderError(f"{path}:{lineno}: column '{CLASSES[j]}': {value!r} is "
                                     "not a whole number") from None
            if n < 0:
                raise RunFolderError(f"{path}:{lineno}: column '{CLASSES[j]}': negative count")
            counts[i, j] = n
    return counts


def load_run(path: str | Path) -> Run:
    """Read and validate one run folder.

    Raises
    ------
    RunFolderError
        Missing ``run.json``, invalid JSON or fields, malformed CSV (naming file and line),
        a rank file whose ``rank`` column disagrees with its name.
    """
    path = Path(path)
    meta_path = path / "run.json"
    if not meta_path.is_file():
        raise RunFolderError(f"{meta_path}: missing (not a run folder)")
    run = Run(path=path, meta=read_meta(meta_path))
    for f in sorted(path.glob("rank-*.csv")):
        m = _RANK_FILE.search(f.name)
        if not m:
            continue
        rank = int(m.group(1))
        df = read_table(f, STEP_COLUMNS, _INT_STEP_COLUMNS)
        wrong = np.flatnonzero(df["rank"].to_numpy() != rank)
        if wrong.size:
            i = int(wrong[0])
            raise RunFolderError(f"{f}:{i + 2}: column 'rank' is {int(df['rank'].iloc[i])}, "
                                 f"but the file is for rank {rank}")
        if not np.isfinite(df["time"].to_numpy()).all():
            i = int(np.flatnonzero(~np.isfinite(df["time"].to_numpy()))[0])
            raise RunFolderError(f"{f}:{i + 2}: column 'time' is not finite")
        run.steps[rank] = df
    if run.steps and len(run.steps) != run.world_size:
        log.warning("%s: %d rank files for world_size %d", path, len(run.steps), run.world_size)
    if max(run.steps, default=0) >= run.world_size:
        raise RunFolderError(f"{path}: rank-{max(run.steps):03d}.csv but world_size is "
                             f"{run.world_size} in run.json")
    if (path / "eval.csv").is_file():
        run.evals = read_table(path / "eval.csv", EVAL_COLUMNS, ("epoch", "n_events"))
    if (path / "confusion.csv").is_file():
        run.confusion = read_confusion(path / "confusion.csv")
    return run


def load_runs(paths: list[str | Path]) -> list[Run]:
    """All runs under ``paths`` (see :func:`find_run_dirs`), ordered by model then world size."""
    runs = [load_run(p) for p in find_run_dirs(paths)]
    runs.sort(key=lambda r: (r.model, r.world_size, r.name))
    log.info("read %d run folders", len(runs))
    return runs
