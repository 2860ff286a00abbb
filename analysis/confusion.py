"""Confusion-matrix reports per run: PNG, CSV (percent and counts) and Markdown.

Accuracy is computed from the matrix itself (trace / total) so it matches what is shown;
its uncertainty is given two ways: the binomial standard error sqrt(p(1-p)/n) (1 sigma)
and the 95 % Wilson score interval.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from lartpc.analysis import plots
from lartpc.analysis.metrics import binomial_se, wilson_interval
from lartpc.analysis.runcheck import safe_name
from lartpc.analysis.runs import CLASSES, Run
from lartpc.analysis.tables import count_unit, gpus_text

from lartpc.fsutil import atomic_write

log = logging.getLogger(__name__)


def row_percent(counts: np.ndarray) -> np.ndarray:
    """Each row as percent of its total (rows with no events stay 0)."""
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(100.0 * counts, totals, out=np.zeros(counts.shape), where=totals > 0)


def accuracy(counts: np.ndarray) -> dict:
    """Accuracy of a confusion matrix with binomial SE and 95 % Wilson interval."""
    n = int(counts.sum())
    k = int(np.trace(counts))
    p = k / n if n else float("nan")
    return {"accuracy": p, "n_events": n, "correct": k, "binomial_se": binomial_se(p, n),
            "wilson95": wilson_interval(k, n)}


def markdown_table(counts: np.ndarray, title: str, classes: tuple[str, ...] = CLASSES) -> str:
    """Markdown table of row percent with counts in brackets, then the accuracy line."""
    pct = row_percent(counts)
    acc = accuracy(counts)
    lines = [f"### {title}", "", "Rows: the true class; columns: the predicted class; each "
             "row in percent of its true class's events (counts in brackets).", "",
             "| true \\ predicted | " + " | ".join(classes) + " | n |",
             "|---" * (len(classes) + 2) + "|"]
    for i, cls in enumerate(classes):
        cells = [f"{pct[i, j]:.1f}% ({counts[i, j]})" for j in range(len(classes))]
        lines.append(f"| {cls} | " + " | ".join(cells) + f" | {int(counts[i].sum())} |")
    lo, hi = acc["wilson95"]
    lines += ["", f"Accuracy {100 * acc['accuracy']:.1f} % ± {100 * acc['binomial_se']:.1f} % "
              f"(binomial SE, n = {acc['n_events']}); 95 % Wilson interval "
              f"[{100 * lo:.1f}, {100 * hi:.1f}] %", ""]
    return "\n".join(lines)


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, text)


def _csv(matrix: np.ndarray, fmt: str, classes: tuple[str, ...] = CLASSES) -> str:
    rows = ["true," + ",".join(classes)]
    rows += [cls + "," + ",".join(fmt.format(v) for v in matrix[i])
             for i, cls in enumerate(classes)]
    return "\n".join(rows) + "\n"


def run_title(run: Run) -> str:
    seed = f", seed {run.seed}" if run.seed is not None else ""
    unit = count_unit([run.meta.get("device")])
    return f"{run.model}, {gpus_text(run.world_size, unit)}{seed} ({run.name})"


#: File names made from a label are cut to 120 characters (:func:`safe_name`), so
#: labels must differ within their first characters, not just somewhere.
_KEY_CHARS = 100


def _key(label: str) -> str:
    return safe_name(label)[:_KEY_CHARS]


def unique_names(runs: list[Run]) -> dict[Path, str]:
    """A file-name label per run: its folder name, or where two runs share one (a/run-1
    and b/run-1), its path below the runs' common folder (``a_run-1``, ``b_run-1``).

    Names are compared as the files get them (:func:`safe_name`: 'a b' and 'a_b' are
    both ``a_b``), and a label still taken (a run named like another's path) is
    numbered (``a_run-1-2``): no run's files replace another's.
    """
    counts: dict[str, int] = {}
    for r in runs:
        counts[_key(r.name)] = counts.get(_key(r.name), 0) + 1
    paths = [Path(r.path).resolve() for r in runs]
    root = Path(os.path.commonpath(paths)) if paths else Path()
    labels: dict[Path, str] = {}
    taken: set[str] = set()
    for r, p in zip(runs, paths, strict=True):
        label = r.name if counts[_key(r.name)] == 1 \
            else "_".join(p.relative_to(root.parent if p == root else root).parts)
        candidate, n = label, 1
        while _key(candidate) in taken:
            n += 1
            candidate = f"{label[:_KEY_CHARS - 10]}-{n}"  # the number survives the cut
        taken.add(_key(candidate))
        labels[Path(r.path)] = candidate
    return labels


def write_run_confusion(run: Run, out: Path, label: str | None = None) -> dict | None:
    """Write ``<label>_confusion.{png,md}``, ``_percent.csv`` and ``_counts.csv`` under
    ``out``; ``label`` defaults to the run's folder name (see :func:`unique_names` when
    several runs are written together).

    Returns a summary dict (paths, accuracy) or None when the run has no confusion.csv.
    """
    if run.confusion is None:
        log.warning("%s: no confusion.csv, skipped", run.path)
        return None
    out.mkdir(parents=True, exist_ok=True)
    stem = safe_name(f"{label or run.name}_confusion")  # the folder name is input too
    title = run_title(run)
    md = markdown_table(run.confusion, title, run.classes)
    _write_text(out / f"{stem}_percent.csv",
                _csv(row_percent(run.confusion), "{:.2f}", run.classes))
    _write_text(out / f"{stem}_counts.csv", _csv(run.confusion, "{:d}", run.classes))
    _write_text(out / f"{stem}.md", md)
    acc = accuracy(run.confusion)
    png = plots.confusion(run.confusion, f"{title}\naccuracy {100 * acc['accuracy']:.1f} ± "
                          f"{100 * acc['binomial_se']:.1f} % (binomial SE)",
                          out / f"{stem}.png", run.classes)
    return {"run": run.name, "model": run.model, "gpus": run.world_size, "title": title,
            "png": str(png), "markdown": md, "classes": run.classes, **acc}
