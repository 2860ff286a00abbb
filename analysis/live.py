"""Live state of run folders that may still be training (for ``lartpc watch``).

A :class:`LiveRun` remembers how far it has read ``rank-000.csv`` and reads only what
was appended since, keeping the last rows; a line without its newline (being written,
or torn by a kill) waits for the next refresh. A resumed run rewrites its CSV (a new
file, cut back to the checkpoint), which is noticed and read again from the start.
A folder without ``run.json`` (or without a step yet) is :data:`PENDING`; it need not
exist (a sweep point whose job has not started).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from lartpc.analysis.runcheck import check_live_meta

from lartpc.runfolder.lock import holder_gone
from lartpc.runfolder.record import read_record, record_path
from lartpc.runfolder.schema import EVAL_CSV, LOCK, RunFolderError, rank_csv_name

CHUNK = 1 << 20
SMOOTH_STEPS = 20  #: rows averaged for the smoothed loss/accuracy and for images/s


class CsvTail:
    """Rows appended to a CSV since the last :meth:`poll`, parsed to floats by name.

    Parameters
    ----------
    path : Path
        The CSV; it may not exist yet.
    keep : int
        How many of the last complete rows to hold in :attr:`rows`.
    """

    def __init__(self, path: Path, keep: int = 200, required: tuple[str, ...] = ()):
        self.path, self.keep, self.required = Path(path), keep, required
        self._reset(None)

    def _reset(self, inode: int | None) -> None:
        self.inode, self.offset, self.partial = inode, 0, b""
        self.header: list[str] | None = None
        self.n_rows = 0
        self.rows: deque[dict[str, float]] = deque(maxlen=self.keep)

    def poll(self) -> int:
        """Read what was appended; the number of new complete rows."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return 0
        if st.st_ino != self.inode or st.st_size < self.offset:  # rewritten (resume)
            self._reset(st.st_ino)
        before = self.n_rows
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while chunk := f.read(CHUNK):
                self.offset += len(chunk)
                lines = (self.partial + chunk).split(b"\n")
                self.partial = lines.pop()
                self._take(lines)
        return self.n_rows - before

    def _take(self, lines: list[bytes]) -> None:
        if self.header is None and lines:
            self.header = lines.pop(0).decode(errors="replace").strip().split(",")
            missing = [c for c in self.required if c not in self.header]
            if missing:  # written once: this file will never have it
                raise RunFolderError(f"{self.path}: missing column '{missing[0]}' "
                                     f"(header: {','.join(self.header)[:200]})")
        lines = [ln for ln in lines if ln.strip()]
        self.n_rows += len(lines)
        for ln in lines[-self.keep:]:  # parse only the rows that are kept
            cells = ln.decode(errors="replace").split(",")
            try:
                self.rows.append(dict(zip(self.header, map(float, cells), strict=True)))
            except ValueError:
                continue  # a malformed row is the analysis' business, not the view's


PENDING = "pending"  #: shown for a run that has not logged a step yet
#: shown for a run whose run.json says running but whose training process (named in
#: run.lock, on this host) is gone: killed before it could write its status
KILLED = "killed?"
#: Columns of rank-000.csv the view reads (the timing columns are optional: old logs).
VIEW_COLUMNS = ("time", "epoch", "data_size", "global_loss", "global_acc")
#: Columns of eval.csv the view reads.
EVAL_VIEW_COLUMNS = ("epoch", "loss", "accuracy")


def read_live_meta(run: Path) -> dict:
    """``run.json`` of ``run`` checked for the view (:func:`check_live_meta`); {} before
    it exists.

    Raises
    ------
    RunFolderError
        Naming the file: not readable, not a JSON object, or a field the view cannot show.
    """
    if not record_path(run).exists():
        return {}
    return check_live_meta(record_path(run), read_record(run))


@dataclass
class Snapshot:
    """What ``lartpc watch`` shows for one run; None where not known yet.

    ``status`` is ``run.json``'s, or :data:`PENDING` before the folder has a
    ``run.json`` or while a running run has no step yet, or :data:`KILLED` where
    ``run.json`` says running but the training process ``run.lock`` names, on this
    host, is gone; ``active`` is True while ``run.json`` says running and the run is
    not known killed (a pending run that has started its segment included).
    """

    name: str
    status: str
    step: int
    epoch: int | None
    epochs: int | None
    loss: float | None
    acc: float | None
    images_s: float | None
    eta_s: float | None
    eval_epoch: int | None = None
    eval_loss: float | None = None
    eval_acc: float | None = None
    model: str | None = None
    world_size: int | None = None
    data_wait: float | None = None  #: share of the step time spent waiting for data
    active: bool = False


class LiveRun:
    """One run folder, refreshed incrementally by :meth:`snapshot`.

    Parameters
    ----------
    path : str or Path
        The run folder; it may not exist yet (a sweep point not started).
    hint : dict, optional
        What is known before ``run.json`` exists: ``model`` and ``gpus`` (a sweep
        manifest's point, see :func:`lartpc.analysis.runs.sweep_points`).
    """

    def __init__(self, path: str | Path, hint: dict | None = None):
        self.path = Path(path)
        self.hint = hint or {}
        self.steps = CsvTail(self.path / rank_csv_name(0), keep=SMOOTH_STEPS,
                             required=VIEW_COLUMNS)
        self._eval: tuple[float, dict | None] = (-1.0, None)
        self._meta: dict = {}

    def check(self) -> None:
        """Read ``run.json`` (when there is one) as :meth:`meta` will, but raise on a
        file that cannot be shown: the first look at a run, where there is no earlier
        whole one to keep.

        Raises
        ------
        RunFolderError
            Naming the file and, for a wrong value, the field.
        """
        self._meta = read_live_meta(self.path)

    def meta(self) -> dict:
        """``run.json``; {} before it exists. lartpc rewrites it atomically, but a copy
        in progress or a hand edit can leave it torn: then the last whole one read."""
        if not record_path(self.path).exists():
            self._meta = {}
        else:
            try:
                self._meta = read_live_meta(self.path)
            except RunFolderError:
                pass
        return self._meta

    def last_eval(self) -> dict | None:
        """The last row of ``eval.csv`` with its epoch, loss and accuracy as numbers,
        read again only when the file changed (a row that does not parse is skipped).

        Raises
        ------
        RunFolderError
            When its header lacks one of :data:`EVAL_VIEW_COLUMNS`.
        """
        p = self.path / EVAL_CSV
        try:
            mtime = p.stat().st_mtime
        except FileNotFoundError:
            return None
        if mtime != self._eval[0]:
            with open(p, newline="", errors="replace") as f:
                reader = csv.DictReader(f)
                rows = list(reader)
            missing = [c for c in EVAL_VIEW_COLUMNS if c not in (reader.fieldnames or ())]
            if rows and missing:
                raise RunFolderError(f"{p}: missing column '{missing[0]}'")
            self._eval = (mtime, next((e for r in reversed(rows) if (e := _eval_row(r))),
                                      None))
        return self._eval[1]

    def snapshot(self, now: float | None = None) -> Snapshot:
        """Poll the files and summarise the run at time ``now`` (default: the clock)."""
        now = time.time() if now is None else now
        meta = self.meta()
        self.steps.poll()
        rows = list(self.steps.rows)
        ev = self.last_eval()
        status = str(meta.get("status", PENDING))
        if status == "running" and holder_gone(self.path / LOCK):
            status = KILLED
        world = meta.get("world_size", self.hint.get("gpus"))
        snap = Snapshot(
            name=self.path.name,
            status=PENDING if status == "running" and not self.steps.n_rows else status,
            step=self.steps.n_rows, epoch=int(rows[-1]["epoch"]) if rows else None,
            epochs=setting(meta, "epochs"),
            loss=_mean(r["global_loss"] for r in rows), acc=_mean(r["global_acc"] for r in rows),
            images_s=images_per_s(rows, int(world or 1)),
            eta_s=eta_s(meta, self.steps.n_rows, rows, now),
            model=meta.get("model", self.hint.get("model")),
            world_size=None if world is None else int(world),
            data_wait=data_wait(rows), active=status == "running")
        if ev:
            snap.eval_epoch, snap.eval_loss, snap.eval_acc = \
                ev["epoch"], ev["loss"], ev["accuracy"]
        return snap


def _eval_row(row: dict) -> dict | None:
    """An eval.csv row's epoch (int), loss and accuracy (floats); None if they do not
    parse (the analysis names such a row; the view skips it)."""
    try:
        epoch = float(row["epoch"])
        out = {"epoch": int(epoch), "loss": float(row["loss"]),
               "accuracy": float(row["accuracy"])}
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return out if epoch >= 0 and epoch == int(epoch) else None


def _mean(values) -> float | None:
    v = list(values)
    return sum(v) / len(v) if v else None


def images_per_s(rows: list[dict], world_size: int) -> float | None:
    """Events per second over all ranks, across the kept rows (rank 0's batch sizes
    times the world size: shards differ by at most one event)."""
    if len(rows) < 2 or rows[-1]["time"] <= rows[0]["time"]:
        return None
    events = sum(r["data_size"] for r in rows[1:]) * world_size
    return events / (rows[-1]["time"] - rows[0]["time"])


def data_wait(rows: list[dict]) -> float | None:
    """Share of the step time spent waiting for data, over the kept rows (None for a
    log without the timing columns)."""
    try:
        data = sum(r["data_s"] for r in rows)
        total = data + sum(r["compute_s"] + r["comm_s"] for r in rows)
    except KeyError:
        return None
    return data / total if total > 0 else None


def setting(meta: dict, name: str):
    """``train.<name>`` as the current segment runs it (``time_limit_s`` and ``epochs``
    may change between segments; ``config`` keeps the first segment's), else the
    recorded config's, else None."""
    segments = meta.get("segments") or [{}]
    current = (segments[-1].get("settings") or {}).get(f"train.{name}")
    if current is not None:
        return current
    return ((meta.get("config") or {}).get("train") or {}).get(name)


def eta_s(meta: dict, step: int, rows: list[dict], now: float) -> float | None:
    """Seconds until the run ends: the time limit of its current segment (the limit
    counts from each process start), or sooner when the remaining epochs need less."""
    if meta.get("status") != "running" or not meta.get("segments"):
        return None
    limit = setting(meta, "time_limit_s")
    left = (math.inf if limit is None else limit) - (now - meta["segments"][-1]["start_time"])
    spe, epochs = meta.get("steps_per_epoch"), setting(meta, "epochs")
    if spe and epochs and len(rows) >= 2 and rows[-1]["time"] > rows[0]["time"]:
        step_s = (rows[-1]["time"] - rows[0]["time"]) / (len(rows) - 1)
        left = min(left, (epochs * spe - step) * step_s)
    return max(0.0, left) if math.isfinite(left) else None  # no limit, no step yet
