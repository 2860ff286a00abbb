"""``lartpc watch RUN...``: a live table of training runs, refreshed from their CSV tails.

A RUN is a run folder or a folder holding some (a sweep's output folder: every point
of its ``manifest.json`` is shown, ``pending`` until its job writes ``run.json``). The
table lists the runs by model and world size and fits the terminal: when it is narrow,
headers are abbreviated and the least needed columns dropped; the run and its status
always stay. It exits when no run is running any more (``run.json`` status), or after
one table with ``--once``. A RUN that does not exist yet or holds no run is waited for
(``--wait``, 60 s; none with ``--once``): a training launched a moment before makes its
folder and lock only once its imports are done. Reading the folders is
:mod:`lartpc.analysis.live` (no torch).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from lartpc.errors import LartpcError


class NotStarted(LartpcError):
    """A RUN that does not exist or holds no run yet: a training may be about to start
    there (``--wait``)."""

#: (key, header, short header); the order of the table
COLUMNS = (("run", "run", "run"), ("status", "status", "status"), ("step", "step", "step"),
           ("epoch", "epoch", "ep"), ("loss", "loss", "loss"), ("acc", "acc", "acc"),
           ("images/s", "images/s", "img/s"), ("data wait", "data wait", "wait"),
           ("ETA", "ETA", "ETA"), ("eval", "last eval (loss / acc)", "eval"))
#: dropped first to last as the terminal narrows; run and status are never dropped
DROP_ORDER = ("eval", "acc", "epoch", "data wait", "ETA", "images/s", "loss", "step")
STATUS_WIDTH = len("time_limit")  #: the longest status


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN",
                   help="run folders, or folders holding them (a sweep's --out-dir)")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes (default 2)")
    p.add_argument("--wait", type=float, default=None, metavar="S",
                   help="wait up to S seconds for a RUN that does not exist yet or holds "
                        "no run to be started by a training (default 60, 0 with --once)")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(s), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}"


def row(s) -> dict[str, str]:
    """The cells of an :class:`lartpc.analysis.live.Snapshot` by column key (epochs counted
    from 1, as in "epoch 3/3"; the CSVs count from 0)."""
    epoch = "-" if s.epoch is None else f"{s.epoch + 1}/{s.epochs or '?'}"
    ev = "-" if s.eval_epoch is None else \
        f"epoch {s.eval_epoch + 1}: {s.eval_loss:.4f} / {s.eval_acc:.3f}"
    step = "-" if s.status == "pending" and not s.step else str(s.step)
    return {"run": s.name, "status": s.status, "step": step, "epoch": epoch,
            "loss": _num(s.loss, ".4f"), "acc": _num(s.acc, ".3f"),
            "images/s": _num(s.images_s, ".1f"), "data wait": _num(s.data_wait, ".0%"),
            "ETA": _duration(s.eta_s), "eval": ev}


def _title(snaps: list) -> str:
    counts = Counter(s.status for s in snaps)
    return f"lartpc watch  {time.strftime('%H:%M:%S')}  " + \
        ", ".join(f"{n} {status}" for status, n in counts.most_common())


def _table(snaps: list, keys: list[str], short: bool):
    from rich.table import Table

    t = Table(title=_title(snaps), title_justify="left")
    for key, header, abbrev in COLUMNS:
        if key not in keys:
            continue
        if key == "run":  # a name too long for the terminal wraps: never "…"
            t.add_column(header, overflow="fold")
        else:
            t.add_column(abbrev if short else header, no_wrap=True,
                         justify="left" if key == "status" else "right",
                         min_width=STATUS_WIDTH if key == "status" else None)
    for s in snaps:
        cells = row(s)
        t.add_row(*(cells[k] for k in keys), style="bold" if s.status == "running" else "dim")
    return t


def table(snaps: list, width: int):
    """The widest table of ``snaps`` that fits ``width`` columns: all columns, then
    short headers, then fewer columns (:data:`DROP_ORDER`)."""
    from rich.console import Console
    from rich.measure import Measurement

    measure = Console(width=10_000)
    keys = [k for k, _, _ in COLUMNS]
    candidates = [(keys, False)] + [([k for k in keys if k not in DROP_ORDER[:i]], True)
                                    for i in range(len(DROP_ORDER) + 1)]
    for keys, short in candidates:
        t = _table(snaps, keys, short)
        if Measurement.get(measure, measure.options, t).maximum <= width:
            return t
    return t  # even run and status are too wide: rich folds the names


def _sort_key(s) -> tuple:
    return (s.model is None, s.model or "", s.world_size or 0, s.name)


def _starting(folder: Path) -> list[Path]:
    """Run folders at or below ``folder`` that a training has taken but not yet written
    ``run.json`` into: it holds the folder's lock first (``run.lock``), then writes it."""
    from lartpc.runfolder.schema import LOCK

    if (folder / LOCK).is_file():
        return [folder.resolve()]
    return sorted(q.parent.resolve() for q in folder.rglob(LOCK) if q.is_file())


def _empty(folder: Path) -> bool:
    return folder.is_dir() and next(folder.iterdir(), None) is None


def find_runs(paths: list[Path]) -> list:
    """A :class:`lartpc.analysis.live.LiveRun` for every run under ``paths``: started
    (``run.json``), starting (a training holds its lock, no ``run.json`` yet) or pending
    (a sweep's point whose job has not started). Each ``run.json`` is read once here.

    Raises
    ------
    NotStarted
        A path that does not exist, or an empty folder.
    LartpcError
        A file or folder that holds no run (an event store), an unreadable manifest, a
        ``run.json`` that cannot be shown (not JSON, not an object, a wrong field:
        named).
    """
    from lartpc.analysis.live import LiveRun
    from lartpc.analysis.runs import RunFolderError, find_run_dirs, sweep_points

    missing = next((p for p in paths if not p.exists()), None)
    if missing is not None:
        raise NotStarted(f"{missing}: no such file or directory")
    pending: list[Path] = []
    try:
        found = find_run_dirs(paths, pending=pending)
        hints = {k: v for p in paths if p.is_dir() for k, v in sweep_points(p).items()}
        waiting = []
        for p in pending:  # a sweep's point is pending as it is; a folder given only when
            if p in hints:  # a training has started in or below it
                waiting.append(p)
                continue
            starting = _starting(p)
            if not starting:  # an empty folder may be a run about to start; else not one
                raise (NotStarted if _empty(p) else RunFolderError)(
                    f"{p}: not a run folder: no run.json in or below it, and no training "
                    "has started in it (no run.lock); give a run folder, a folder holding "
                    "some, or a sweep's --out-dir")
            waiting.extend(q for q in starting if q not in found and q not in waiting)
        runs = [LiveRun(p, hints.get(p)) for p in found + waiting]
        for r in runs:
            r.check()
    except RunFolderError as e:
        raise LartpcError(str(e)) from None
    return runs


def found_or_started(paths: list[Path], wait: float, interval: float, say) -> list:
    """:func:`find_runs` of ``paths``; where one does not exist yet or holds no run (a
    training just launched makes its folder and lock a few seconds later), asked again
    every ``interval`` seconds for up to ``wait`` seconds, saying once what it waits
    for (``say``), before the error is raised."""
    deadline, said = time.monotonic() + wait, False
    while True:
        try:
            return find_runs(paths)
        except NotStarted as e:
            if time.monotonic() + interval > deadline:
                raise LartpcError(f"{e}" + (f" (waited {wait:g} s for a training to start "
                                            "there)" if wait > 0 else "")) from None
            if not said:
                say(f"waiting up to {wait:g} s for a training to start: {e}")
                said = True
            time.sleep(interval)


def snapshot(runs: list) -> list:
    """Refresh every run; their snapshots by model, world size and name."""
    return sorted((r.snapshot() for r in runs), key=_sort_key)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    if args.interval <= 0:
        raise LartpcError(f"--interval must be positive, got {args.interval}")
    wait = args.wait if args.wait is not None else (0.0 if args.once else 60.0)
    if wait < 0:
        raise LartpcError(f"--wait must be >= 0 seconds, got {args.wait}")
    console = Console()
    runs = found_or_started(args.runs, wait, min(args.interval, 1.0),
                            lambda text: Console(stderr=True).print(text, markup=False,
                                                                    highlight=False))
    snaps = snapshot(runs)
    if args.once:
        console.print(table(snaps, console.width))
        return 0
    with Live(table(snaps, console.width), console=console, auto_refresh=False) as live:
        while any(s.active for s in snaps):  # pending sweep points alone do not hold it
            time.sleep(args.interval)
            snaps = snapshot(runs)
            live.update(table(snaps, console.width), refresh=True)
    if not console.is_terminal:
        console.line()  # rich ends a live display with a newline on terminals only
    waiting = sum(s.status == "pending" for s in snaps)
    if waiting:
        console.print(f"no run is training; {waiting} pending (watch again once their "
                      "jobs start)")
    return 0
