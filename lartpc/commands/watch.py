"""``lartpc watch RUN...``: a live table of training runs, refreshed from their CSV tails.

It exits when no run is running any more (``run.json`` status), or after one table
with ``--once``. Reading the folders is :mod:`analysis.live` (no torch).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lartpc.errors import LartpcError

COLUMNS = ("run", "status", "step", "epoch", "loss", "acc", "images/s", "ETA",
           "last eval (loss / acc)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes (default 2)")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(s), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}"


def row(s) -> list[str]:
    """One table row of an :class:`analysis.live.Snapshot` (epochs counted from 1, as
    in "epoch 3/3"; the CSVs count from 0)."""
    epoch = "-" if s.epoch is None else f"{s.epoch + 1}/{s.epochs or '?'}"
    ev = "-" if s.eval_epoch is None else \
        f"epoch {s.eval_epoch + 1}: {s.eval_loss:.4f} / {s.eval_acc:.3f}"
    return [s.name, s.status, str(s.step), epoch, _num(s.loss, ".4f"), _num(s.acc, ".3f"),
            _num(s.images_s, ".1f"), _duration(s.eta_s), ev]


def table(snaps: list):
    from rich.table import Table

    t = Table(title=f"lartpc watch  {time.strftime('%H:%M:%S')}", title_justify="left")
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("run", "status") else "right", no_wrap=True)
    for s in snaps:
        t.add_row(*row(s), style="bold" if s.status == "running" else "dim")
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from analysis.live import LiveRun

    if args.interval <= 0:
        raise LartpcError(f"--interval must be positive, got {args.interval}")
    for p in args.runs:
        if not p.is_dir():
            raise LartpcError(f"{p}: not a folder (expected a run folder from lartpc train)")
    runs = [LiveRun(p) for p in args.runs]
    snaps = [r.snapshot() for r in runs]
    console = Console()
    if args.once:
        console.print(table(snaps))
        return 0
    with Live(table(snaps), console=console, auto_refresh=False) as live:
        while any(s.status in ("running", "starting") for s in snaps):
            time.sleep(args.interval)
            snaps = [r.snapshot() for r in runs]
            live.update(table(snaps), refresh=True)
    return 0
