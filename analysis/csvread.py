"""Reading the numeric CSV tables of a run folder (rank-NNN.csv, eval.csv, confusion.csv).

Every problem raises :class:`~lartpc.analysis.runcheck.RunFolderError` naming the file and line.
A final line without its newline is *torn* (the trainer writes whole lines; a kill or a
read racing a write leaves a partial one, and the trainer drops it on resume): it is
dropped here too, with a note, so a run that is still being written can be analysed.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd
from lartpc.analysis.runcheck import RunFolderError

from lartpc.fsutil import UnsafePathError, read_nofollow


def read_text(path: Path, notes: list[str] | None = None) -> str:
    """The text of a CSV without a torn final line; binary or unreadable files are errors."""
    try:
        data = read_nofollow(path)  # a run file replaced by a link is not read
    except UnsafePathError as e:
        raise RunFolderError(str(e)) from None
    except OSError as e:
        raise RunFolderError(f"{path}: cannot read: {e.strerror or e}") from e
    nul = data.find(b"\x00")
    if nul >= 0:
        raise RunFolderError(f"{path}: binary data (NUL byte at offset {nul}), not a CSV")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunFolderError(f"{path}: not UTF-8 text (byte {e.start}), not a CSV") from None
    if text and not text.endswith("\n") and "\n" in text:
        keep = text.rindex("\n") + 1
        if notes is not None:
            notes.append(f"{path}:{text.count(chr(10)) + 1}: ignored a torn final line "
                         "(no newline: the run is being written or was killed mid-write)")
        text = text[:keep]
    return text


def csv_rows(path: Path, text: str):
    """``(line number, fields)`` of each CSV record of ``text``; a record the csv module
    cannot parse (a field over its 128 KiB limit, a NUL) raises
    :class:`RunFolderError` naming ``path`` and the line."""
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise RunFolderError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
        yield reader.line_num, row


def _scan_for_error(path: Path, text: str, columns: tuple[str, ...]) -> None:
    """Find the first bad line the fast reader choked on; raise naming it."""
    for lineno, row in csv_rows(path, text):
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


def read_table(path: Path, columns: tuple[str, ...], int_columns: tuple[str, ...] = (),
               notes: list[str] | None = None,
               older: tuple[tuple[str, ...], ...] = ()) -> pd.DataFrame:
    """Read a numeric CSV whose header must be exactly ``columns``, or one of the
    ``older`` headers (the file of an older lartpc: the columns it lacks read as nan).

    ``nan``/``inf`` are accepted (a diverged loss is a real outcome); empty cells, text and
    wrong field counts are errors naming the line. ``int_columns`` must hold whole numbers
    below 2**53 (exact in a float). Notes (a dropped torn line) go to ``notes``.
    """
    text = read_text(path, notes)
    header = next((row for _, row in csv_rows(path, text)), None)
    if header is None:
        raise RunFolderError(f"{path}:1: empty file, expected header {','.join(columns)}")
    found = tuple(h.strip() for h in header)
    if found != columns and found not in older:
        raise RunFolderError(f"{path}:1: header is {','.join(header)!r}, expected "
                             f"{','.join(columns)!r}")
    try:
        df = pd.read_csv(io.StringIO(text), dtype=np.float64, keep_default_na=False,
                         na_values=["nan", "NaN"], index_col=False, on_bad_lines="error")
    except (ValueError, pd.errors.ParserError, csv.Error) as e:
        _scan_for_error(path, text, found)
        raise RunFolderError(f"{path}: malformed CSV: {e}") from e
    df.columns = list(found)
    for name in int_columns:
        v = df[name].to_numpy()
        bad = ~np.isfinite(v) | (v != np.round(v)) | (np.abs(v) >= 2.0 ** 53)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RunFolderError(f"{path}:{i + 2}: column '{name}': {v[i]!r} is not a whole "
                                 "number below 2**53")
    return df if found == columns else df.reindex(columns=list(columns), fill_value=np.nan)


def confusion_classes(path: Path) -> tuple[str, ...]:
    """The class names of ``confusion.csv``'s header ``true,<classes>`` (the run's store's
    classes: the study's five, or those a converted store brought)."""
    rows = [row for _, row in csv_rows(path, read_text(path))]
    head = tuple(c.strip() for c in rows[0]) if rows else ()
    if len(head) < 3 or head[0] != "true" or any(not c for c in head[1:]) \
            or len(set(head[1:])) != len(head) - 1:
        raise RunFolderError(f"{path}:1: header is {','.join(head)!r}, expected "
                             "'true,<two or more distinct class names>'")
    return head[1:]


def read_confusion(path: Path, classes: tuple[str, ...]) -> np.ndarray:
    """Read ``confusion.csv``: header ``true,<classes>``, then one row per true class."""
    header = ("true", *classes)
    rows = [row for _, row in csv_rows(path, read_text(path))]
    if not rows or tuple(c.strip() for c in rows[0]) != header:
        got = ",".join(rows[0]) if rows else ""
        raise RunFolderError(f"{path}:1: header is {got!r}, expected {','.join(header)!r}")
    body = [r for r in rows[1:] if r]
    if len(body) != len(classes):
        raise RunFolderError(f"{path}: expected {len(classes)} rows after the header, "
                             f"found {len(body)}")
    counts = np.zeros((len(classes), len(classes)), dtype=np.int64)
    for i, (cls, row) in enumerate(zip(classes, body, strict=True)):
        lineno = i + 2
        if len(row) != len(header):
            raise RunFolderError(f"{path}:{lineno}: expected {len(header)} fields, "
                                 f"found {len(row)}")
        if row[0].strip() != cls:
            raise RunFolderError(f"{path}:{lineno}: row label {row[0]!r}, expected {cls!r} "
                                 "(classes in order " + ", ".join(classes) + ")")
        for j, value in enumerate(row[1:]):
            try:
                n = int(value)
            except ValueError:
                raise RunFolderError(f"{path}:{lineno}: column '{classes[j]}': {value!r} is "
                                     "not a whole number") from None
            if not 0 <= n < 2 ** 62:
                raise RunFolderError(f"{path}:{lineno}: column '{classes[j]}': count {n} "
                                     "out of range (negative or above 2**62)")
            counts[i, j] = n
    return counts
