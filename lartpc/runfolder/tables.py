"""The run folder's tables as training writes them: the rank logs, ``eval.csv`` and
``confusion.csv`` (the contract with ``analysis``; see docs/run-folder.md); ``run.json``
is :mod:`lartpc.runfolder.record`'s.

``eval.csv`` and ``confusion.csv`` are rewritten whole through a
temporary file and a rename. ``rank-NNN.csv`` grows by whole lines written in one
call each flush; on resume it is cut back to the checkpointed step, so no step is
ever logged twice or lost. A rank log is read without following a link at its name: a
log replaced by a link to someone's file must not be copied into the run folder.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

from lartpc import CLASSES
from lartpc.fsutil import open_nofollow, read_nofollow
from lartpc.runfolder.record import write_text
from lartpc.runfolder.schema import (  # noqa: F401 (re-exported)
    CONFUSION_CSV,
    CONFUSION_HEADER,
    EVAL_COLUMNS,
    EVAL_CSV,
    STEP_COLUMNS,
    RunFolderError,
    eval_columns,
    rank_csv_name,
)


def rank_csv_path(run: Path, rank: int) -> Path:
    return Path(run) / rank_csv_name(rank)


def _fmt(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


class StepLog:
    """Buffered per-rank step log (one row per optimiser step)."""

    def __init__(self, run: Path, rank: int, keep_steps: int = 0, flush_every: int = 20):
        """Open ``rank-NNN.csv``, keeping its first ``keep_steps`` rows (resume) or
        starting afresh when ``keep_steps`` is 0."""
        self.path = rank_csv_path(run, rank)
        self.flush_every = flush_every
        self._rows: list[str] = []
        header = ",".join(STEP_COLUMNS) + "\n"
        kept = kept_rows(self.path, keep_steps) if keep_steps else ""
        write_text(self.path, header + kept)

    def log(self, **row) -> None:
        self._rows.append(",".join(_fmt(row[c]) for c in STEP_COLUMNS) + "\n")
        if len(self._rows) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        data = "".join(self._rows).encode()
        try:
            fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise RunFolderError(f"{self.path}: cannot write ({e.strerror or e})") from None
        self._rows = []


def _read(path: Path) -> bytes | None:
    """A rank log's bytes (None when missing); a link there is refused, not read."""
    try:
        return read_nofollow(path)
    except FileNotFoundError:
        return None


def kept_rows(path: Path, steps: int) -> str:
    """The first ``steps`` rows of a rank log, which a resume at step ``steps`` keeps.

    Every rank checks every rank's log with this before a resume (so all refuse alike),
    and each rank keeps its own log's rows with it.

    Raises
    ------
    RunFolderError
        When the log is missing, has fewer complete rows, or they are not UTF-8 text
        (naming the file, and what the user can do).
    UnsafePathError
        When the log is a symbolic link (never read through).
    """
    data = _read(path)
    if data is None:
        raise RunFolderError(short_log_message(path, None, steps))
    # The piece after the last newline was torn by a kill: never kept. Nor the header.
    rows = data.split(b"\n")[1:-1]
    if len(rows) < steps:
        raise RunFolderError(short_log_message(path, len(rows), steps))
    kept = b"".join(row + b"\n" for row in rows[:steps])
    try:
        return kept.decode()
    except UnicodeDecodeError as e:
        line = kept[:e.start].count(b"\n") + 2
        raise RunFolderError(f"{path}:{line}: not UTF-8 text (byte {kept[e.start]:#04x}); "
                             "restore the file from a backup to resume, or move "
                             "checkpoint.pt away to restart the run from step 0") from None


def short_log_message(path: Path, rows: int | None, step: int) -> str:
    """What to tell the user when a rank log cannot continue the checkpoint's step."""
    has = "is missing" if rows is None else f"has {rows} complete rows"
    return (f"{path}: {has} but checkpoint.pt is at step {step}; restore the file from "
            "a backup to resume, or move checkpoint.pt away to restart the run from step 0")


def write_eval(run: Path, rows: list[dict], classes: tuple[str, ...] = CLASSES) -> None:
    """Rewrite ``eval.csv`` with all evaluation rows so far (per-class accuracy columns
    of the store's ``classes``)."""
    columns = eval_columns(classes)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:  # rows of a checkpoint from before issue 37 have no step, images
        w.writerow([_fmt(r.get(c, math.nan)) for c in columns])
    write_text(Path(run) / EVAL_CSV, buf.getvalue())


def write_confusion(run: Path, counts, classes: tuple[str, ...] = CLASSES) -> None:
    """``confusion.csv``: rows true class, columns predicted, in the store's class order."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("true", *classes))
    for name, row in zip(classes, counts, strict=True):
        w.writerow([name, *(int(c) for c in row)])
    write_text(Path(run) / CONFUSION_CSV, buf.getvalue())
