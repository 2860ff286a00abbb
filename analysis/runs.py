"""Reading and validating run folders (run.json, rank-NNN.csv, eval.csv, confusion.csv).

The folder layout is the contract with the training side (docs/run-folder.md). Everything a
user can get wrong raises :class:`RunFolderError` naming the file and, for tables, the line.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from lartpc.analysis.csvread import confusion_classes, read_confusion, read_table
from lartpc.analysis.runcheck import (
    STATUSES,
    RunFolderError,
    check_evals,
    check_meta,
    check_steps,
    drop_duplicate_steps,
)

from lartpc import CLASSES
from lartpc.fsutil import UnsafePathError, read_nofollow
from lartpc.runfolder.record import read_json
from lartpc.runfolder.schema import (  # noqa: F401 (re-exported)
    CONFUSION_CSV,
    CONFUSION_HEADER,
    EVAL_COLUMNS,
    EVAL_COLUMNS_V1,
    EVAL_CSV,
    RUN_JSON,
    STEP_COLUMNS,
    eval_columns,
    rank_csv_name,
)

__all__ = ["CLASSES", "STATUSES", "Run", "RunFolderError", "find_run_dirs", "load_run",
           "load_runs", "read_meta", "sweep_points"]

log = logging.getLogger(__name__)


_INT_STEP_COLUMNS = ("epoch", "rank", "batchno", "data_size")
_RANK_FILE = re.compile(r"rank-(\d{3,})\.csv$")
#: What ``lartpc sweep`` writes into its output folder: the points and their run folders.
MANIFEST = "manifest.json"


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
    notes : list[str]
        What was tolerated while reading (a torn final line, duplicated steps).
    classes : tuple[str, ...]
        The class names of ``confusion.csv`` (the store's; the study's five by default).
    """

    path: Path
    meta: dict[str, Any]
    steps: dict[int, pd.DataFrame] = field(default_factory=dict)
    evals: pd.DataFrame | None = None
    confusion: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    classes: tuple[str, ...] = CLASSES

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


def sweep_points(folder: str | Path) -> dict[Path, dict]:
    """The points of the sweep whose output folder is ``folder``, by run folder.

    A point's run folder is ``folder/<name>``, the layout ``lartpc sweep`` makes (so a
    moved sweep folder still finds its runs); the dict holds the manifest's entry
    (``model``, ``gpus``, ``seed``, ``name``, ``job_id``...). Empty when ``folder``
    holds no ``manifest.json``.

    Raises
    ------
    RunFolderError
        The manifest is not JSON or lists no points.
    """
    path = Path(folder) / MANIFEST
    try:
        doc = json.loads(read_nofollow(path))  # a manifest planted as a link is refused
        points = {(Path(folder) / Path(p["name"]).name).resolve(): p for p in doc["points"]}
    except FileNotFoundError:
        return {}
    except (OSError, UnsafePathError, UnicodeDecodeError, json.JSONDecodeError, KeyError,
            TypeError) as e:
        raise RunFolderError(f"{path}: not a sweep manifest ({e})") from None
    for i, p in enumerate(doc["points"]):  # what is shown before a point's run.json exists
        gpus, model = p.get("gpus"), p.get("model")
        if gpus is not None and not (isinstance(gpus, int) and not isinstance(gpus, bool)
                                     and gpus >= 1):
            raise RunFolderError(f"{path}: points[{i}].gpus must be a positive integer, "
                                 f"got {gpus!r:.80}")
        if model is not None and not isinstance(model, str):
            raise RunFolderError(f"{path}: points[{i}].model must be a model name, "
                                 f"got {model!r:.80}")
    return points


def find_run_dirs(paths: list[str | Path], pending: list[Path] | None = None) -> list[Path]:
    """Run folders named by ``paths``: each is a run folder or a folder holding some below it.

    Parameters
    ----------
    paths : list of str or Path
        Run folders, or folders with run folders below them (a sweep's output folder).
    pending : list of Path, optional
        When given, folders that are to hold a run but have no ``run.json`` yet are
        appended here (resolved) instead of raising: every point of a sweep's
        ``manifest.json`` (:func:`sweep_points`) whose folder has no ``run.json``, and a
        folder in ``paths`` with no ``run.json`` in or below it.

    Raises
    ------
    RunFolderError
        A path does not exist, or no ``run.json`` is found under it (and ``pending``
        is None, or the path is a file).
    """
    found: list[Path] = []
    waiting: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RunFolderError(f"{p}: no such file or directory")
        if p.is_file():
            p = p.parent if p.name == RUN_JSON else p
        if (p / RUN_JSON).is_file():
            found.append(p)
            continue
        below = sorted(q.parent for q in p.rglob(RUN_JSON))
        if pending is not None and p.is_dir():
            points = [q for q in sweep_points(p) if not (q / RUN_JSON).is_file()]
            waiting.extend(points or ([] if below else [p]))
        elif not below:
            raise RunFolderError(f"{p}: not a run folder (missing {p / RUN_JSON}) "
                                 f"and no {RUN_JSON} found below it")
        found.extend(below)
    unique = list(dict.fromkeys(q.resolve() for q in found))
    if pending is not None:
        pending.extend(q for q in dict.fromkeys(q.resolve() for q in waiting)
                       if q not in unique and q not in pending)
    return unique


def read_meta(path: Path) -> dict[str, Any]:
    """Parse (:func:`lartpc.runfolder.record.read_json`) and validate
    (:func:`lartpc.analysis.runcheck.check_meta`) one ``run.json``."""
    return check_meta(path, read_json(path))


def _read_rank(run: Run, f: Path, rank: int) -> pd.DataFrame:
    df = read_table(f, STEP_COLUMNS, _INT_STEP_COLUMNS, run.notes)
    wrong = np.flatnonzero(df["rank"].to_numpy() != rank)
    if wrong.size:
        i = int(wrong[0])
        raise RunFolderError(f"{f}:{i + 2}: column 'rank' is {int(df['rank'].iloc[i])}, "
                             f"but the file is for rank {rank}")
    check_steps(f, df, run.meta)
    return drop_duplicate_steps(f, df, run.notes)


def load_run(path: str | Path) -> Run:
    """Read and validate one run folder.

    Raises
    ------
    RunFolderError
        Missing ``run.json``, invalid JSON or fields, malformed CSV (naming file and line),
        a rank file whose ``rank`` column disagrees with its name.
    """
    path = Path(path)
    meta_path = path / RUN_JSON
    if not meta_path.is_file():
        raise RunFolderError(f"{meta_path}: missing (not a run folder)")
    run = Run(path=path, meta=read_meta(meta_path))
    for f in sorted(path.glob("rank-*.csv")):
        m = _RANK_FILE.search(f.name)
        if m:
            run.steps[int(m.group(1))] = _read_rank(run, f, int(m.group(1)))
    if run.steps and len(run.steps) != run.world_size:
        run.notes.append(f"{path}: {len(run.steps)} rank file(s) for world_size "
                         f"{run.world_size}")
    if max(run.steps, default=0) >= run.world_size:
        raise RunFolderError(f"{path}: {rank_csv_name(max(run.steps))} but world_size is "
                             f"{run.world_size} in {RUN_JSON}")
    if (path / CONFUSION_CSV).is_file():  # the store's classes, before eval.csv's columns
        run.classes = confusion_classes(path / CONFUSION_CSV)
    if (path / EVAL_CSV).is_file():
        five = run.classes == CLASSES
        run.evals = read_table(path / EVAL_CSV, EVAL_COLUMNS if five
                               else eval_columns(run.classes), ("epoch", "n_events"),
                               run.notes, older=(EVAL_COLUMNS_V1,) if five else ())
        check_evals(path / EVAL_CSV, run.evals, run.meta)
    if (path / CONFUSION_CSV).is_file():
        run.confusion = read_confusion(path / CONFUSION_CSV, run.classes)
    for note in run.notes:
        log.warning("%s", note)
    return run


def load_runs(paths: list[str | Path], skipped: list[str] | None = None) -> list[Run]:
    """All runs under ``paths`` (see :func:`find_run_dirs`), ordered by model then world size.

    Parameters
    ----------
    paths : list of str or Path
        Run folders, or folders with run folders below them.
    skipped : list of str, optional
        When given, a run folder that cannot be used (a job that failed during set-up, a
        corrupt file) is left out and its error appended here, so one dead job does not
        stop a study; when None the first such error is raised.

    Raises
    ------
    RunFolderError
        A bad run folder when ``skipped`` is None, or no usable run at all.
    """
    runs: list[Run] = []
    errors: list[str] = []
    for p in find_run_dirs(paths):
        try:
            runs.append(load_run(p))
        except RunFolderError as e:
            if skipped is None:
                raise
            errors.append(str(e))
            log.warning("skipped run folder %s: %s", p, e)
    if not runs:
        raise RunFolderError("no usable run folder:\n  " + "\n  ".join(errors))
    if skipped is not None:
        skipped.extend(errors)
    runs.sort(key=lambda r: (r.model, r.world_size, r.name))
    log.info("read %d run folders, skipped %d", len(runs), len(errors))
    return runs
