"""Figures: loss vs wall time with a TTL-vs-N inset (paper Fig. 3a/4a), epoch rate vs N
(Fig. 3b/4b), confusion matrices. Matplotlib's Agg backend; every function writes a PNG."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lartpc.analysis.fit import PowerLawFit, bounds_ttl  # noqa: E402
from lartpc.analysis.metrics import RunMetrics, primary_steps, smoothed_loss  # noqa: E402
from lartpc.analysis.runs import CLASSES, Run  # noqa: E402
from lartpc.analysis.segments import find_restarts  # noqa: E402
from lartpc.analysis.tables import gpus_text  # noqa: E402
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator  # noqa: E402

from lartpc.fsutil import atomic_write  # noqa: E402

log = logging.getLogger(__name__)
DPI = 120
#: for text that holds input (run folder and model names from run.json): a '$' in it
#: must not start mathtext ('x$\frac{$' raised a parse error). Per text, not through
#: rcParams: a global switch changed figures drawn later in the same process.
PLAIN = {"parse_math": False}
#: the classes' symbols on the small confusion matrices
SYMBOLS = dict(zip(CLASSES, ("γ", "e", "μ", "π", "K"), strict=True))


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Write atomically so a failed plot never leaves a torn PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, lambda f: fig.savefig(f, dpi=DPI, bbox_inches="tight",
                                                 format="png"))
    finally:
        plt.close(fig)
    log.info("wrote %s", path)
    return path


def clock_name(rows) -> str:
    """What the runs' TTLs are read on (metrics.CLOCKS): 'training clock' (the steps'
    own time), 'wall clock' (evaluation and checkpoints included), or both."""
    names = {"train": "training clock", "wall": "wall clock"}
    return " / ".join(names.get(c, c) for c in sorted({m.clock for m in rows})) or "clock"


def gpu_axis(ax: plt.Axes, gpus: list[int]) -> None:
    """Log x axis labelled with the GPU counts actually used."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(gpus))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([str(g) for g in gpus]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    lo, hi = min(gpus), max(gpus)
    ax.set_xlim(lo / 1.3, hi * 1.3)


def fit_label(fit: PowerLawFit, what: str) -> str:
    err = f" ± {fit.exponent_err:.2f}" if fit.exponent_err is not None else ""
    return f"fit: {what} ∝ N^({fit.exponent:.2f}{err})"


def say_empty(ax: plt.Axes, text: str) -> None:
    """``text`` in plain words where a panel has nothing to draw (no made-up axis)."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes,
            fontsize=9, color="0.3", wrap=True, **PLAIN)


def ttl_points(ax: plt.Axes, rows: list[RunMetrics], scale: float = 1.0,
               ms: float = 6) -> bool:
    """Each run's TTL (divided by ``scale``) at its N: the runs that reached the threshold,
    the censored ones at their lower bound, and diverged ones where they stopped (that
    is no bound: :func:`lartpc.analysis.fit.bounds_ttl`). False when there is none."""
    stopped = [m for m in rows if m.ttl_censored and m.ttl_lower_bound_s]
    groups = (([m for m in rows if not m.ttl_censored and m.ttl_s], "reached the threshold",
               {"marker": "o", "color": "k"}),
              ([m for m in stopped if bounds_ttl(m)], "censored: TTL > its run time",
               {"marker": "^", "color": "tab:red", "mfc": "none"}),
              ([m for m in stopped if not bounds_ttl(m)], "diverged: stopped here (no bound)",
               {"marker": "x", "color": "tab:purple"}))
    for group, label, style in groups:
        if group:  # a censored run's ttl_s is None: its point is where it stopped
            ax.plot([m.world_size for m in group],
                    [(m.ttl_s or m.ttl_lower_bound_s) / scale for m in group], ls="none",
                    ms=ms, label=label, **style)
    return any(group for group, _, _ in groups)


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit a time axis reaching ``seconds`` reads in, and its length in seconds."""
    return ("h", 3600.0) if seconds > 2 * 3600 else ("min", 60.0)


def _broken(t: np.ndarray, intervals: list[int], *ys: np.ndarray) -> list[np.ndarray]:
    """``t`` and ``ys`` with a NaN inside each step interval that holds a restart, so a
    line breaks across the queue wait instead of joining the segments."""
    at = [i + 1 for i in intervals]
    return [np.insert(np.asarray(a, dtype=float), at, np.nan) for a in (t, *ys)]


def log_y(ax: plt.Axes) -> None:
    """Log y axis with plain numbers (12, 30) instead of 1.2x10^1."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if hi / lo > 100 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _colours(gpus: list[int]) -> dict[int, tuple]:
    cmap = plt.get_cmap("viridis")
    return {g: cmap(0.85 * i / max(1, len(gpus) - 1)) for i, g in enumerate(gpus)}


def loss_curves(runs: list[Run], rows: list[RunMetrics], ttl_fit: PowerLawFit, model: str,
                threshold: float, out: Path, unit: str = "GPU") -> Path:
    """Smoothed global training loss vs wall time since start, one colour per GPU count,
    with the threshold line and an inset of TTL vs N (:func:`ttl_points`); a line breaks
    across the queue wait of a run resumed by a later job (run.json segments).
    N is counted in ``unit`` (:func:`lartpc.analysis.tables.count_unit`)."""
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    gpus = sorted({r.world_size for r in runs})
    colour = _colours(gpus)
    curves = [(run, m, steps) for run, m in zip(runs, rows, strict=True)
              if (steps := primary_steps(run)) is not None]
    # each axis in the unit of what it draws: the curves' span (queue waits included)
    t_unit, scale = time_unit(max((float(st["time"].iloc[-1]) - r.meta["start_time"]
                                   for r, _, st in curves), default=0))
    labelled: set[int] = set()
    for run, m, steps in curves:
        times = steps["time"].to_numpy()
        t = (times - run.meta["start_time"]) / scale
        c = colour[run.world_size]
        smooth = smoothed_loss(steps, m.smooth_window or 1).to_numpy()
        gaps = find_restarts(times, run.meta.get("segments") or []).intervals
        t_b, raw_b, smooth_b = _broken(t, gaps, steps["global_loss"].to_numpy(), smooth)
        ax.plot(t_b, raw_b, color=c, alpha=0.12, lw=0.5)
        label = None if run.world_size in labelled else gpus_text(run.world_size, unit)
        labelled.add(run.world_size)
        ax.plot(t_b, smooth_b, color=c, lw=1.8, label=label)
        crossed = np.flatnonzero(smooth < threshold)
        if m.ttl_s is not None and crossed.size:
            # where the curve crosses, on this plot's clock (time since the job's start,
            # queue waits included), not ttl_s's (the training clock by default)
            ax.plot(t[crossed[0]], threshold, "o", color=c, ms=6, mec="k", mew=0.6)
    ax.axhline(threshold, color="crimson", ls="--", lw=1,
               label=f"threshold {threshold:g}")
    ax.set_xlabel(f"wall time since job start ({t_unit}; data loading included)")
    ax.set_ylabel("global training loss (smoothed; raw faint)")
    ax.set_title(f"{model}: training loss vs wall time", **PLAIN)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=9, framealpha=0.9)
    ins = ax.inset_axes([0.60, 0.56, 0.37, 0.38])
    ins.tick_params(labelsize=7, which="both")
    # and the TTLs or their bounds
    i_unit, i_scale = time_unit(max((m.ttl_lower_bound_s or m.ttl_s or 0 for m in rows),
                                    default=0))
    if not ttl_points(ins, rows, i_scale, ms=4):
        say_empty(ins, "no run has a time to loss or a bound")
        return save_figure(fig, out)
    if ttl_fit.exponent is not None:
        xs = np.geomspace(min(ttl_fit.gpu_counts), max(ttl_fit.gpu_counts), 50)
        ins.plot(xs, ttl_fit.predict(xs) / i_scale, "-", color="tab:blue",
                 label=fit_label(ttl_fit, "TTL"))
    log_y(ins)
    gpu_axis(ins, gpus)
    ins.set_xlabel(f"{unit}s", fontsize=8)
    ins.set_ylabel(f"TTL({threshold:g}) ({i_unit}, {clock_name(rows)})", fontsize=8)
    ins.grid(alpha=0.3, which="both")
    ins.legend(fontsize=7, loc="lower left")
    return save_figure(fig, out)


def epoch_rate(rows: list[RunMetrics], fit: PowerLawFit, model: str, out: Path,
               unit: str = "GPU") -> Path:
    """Epoch rate vs GPU count (``unit`` count) on log-log axes with the power-law fit
    and ideal scaling."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    ax.set_title(f"{model}: epoch rate vs {unit} count", **PLAIN)
    pts = [m for m in rows if m.epoch_rate_per_min is not None]
    if not pts:
        say_empty(ax, "no epoch rate in these runs (each logged fewer than 2 steps)")
        return save_figure(fig, out)
    gpus = sorted({m.world_size for m in pts})
    ax.plot([m.world_size for m in pts], [m.epoch_rate_per_min for m in pts], "o",
            color="k", label="runs")
    n0 = gpus[0]
    r0 = np.mean([m.epoch_rate_per_min for m in pts if m.world_size == n0])
    xs = np.geomspace(gpus[0], gpus[-1], 50)
    ax.plot(xs, r0 * xs / n0, "--", color="grey", label=f"ideal (∝ N, from N={n0})")
    if fit.exponent is not None:
        ax.plot(xs, fit.predict(xs), "-", color="tab:blue", label=fit_label(fit, "rate"))
    log_y(ax)
    gpu_axis(ax, gpus)
    ax.set_xlabel(f"{unit}s (N)")
    ax.set_ylabel("epoch rate (epochs/min, data loading excluded)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=9)
    return save_figure(fig, out)


def confusion(counts: np.ndarray, title: str, out: Path,
              classes: tuple[str, ...] = CLASSES) -> Path:
    """Row-normalised confusion matrix in percent, counts in brackets (rows = true class,
    in the order of ``classes``: the run's store's)."""
    totals = counts.sum(axis=1, keepdims=True)
    pct = np.divide(100.0 * counts, totals, out=np.zeros(counts.shape), where=totals > 0)
    fig, ax = plt.subplots(figsize=(6.2, 5.2))
    im = ax.imshow(pct, cmap="Blues", vmin=0, vmax=100)
    for i in range(len(classes)):
        for j in range(len(classes)):
            ax.text(j, i, f"{pct[i, j]:.1f}%\n({counts[i, j]})", ha="center", va="center",
                    fontsize=8, color="white" if pct[i, j] > 55 else "black")
    ax.set_xticks(range(len(classes)), classes)
    ax.set_yticks(range(len(classes)), [f"{c} (n={int(t)})" for c, t in
                                        zip(classes, totals[:, 0], strict=True)])
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=10, **PLAIN)
    fig.colorbar(im, ax=ax, label="% of true class", fraction=0.046, pad=0.04)
    return save_figure(fig, out)


def minibatch_scan(result: dict, runs: list[Run], out: Path) -> Path:
    """``lartpc bench minibatch``: images/s against the minibatch size; the smoothed
    training loss of every run against wall time, one colour per size; TTL against the
    size, censored runs as open triangles at their bound (the axis starts at zero, so a
    scan where no run reached the threshold reads as such)."""
    rows, points = result["rows"], result["points"]
    batches = [r["batch_per_rank"] for r in rows]
    threshold = result["threshold"]
    colour = _colours(batches)
    fig, (ax_rate, ax_loss, ax_ttl) = plt.subplots(1, 3, figsize=(15, 4.3))
    ax_rate.plot(batches, [r["images_per_s"] for r in rows], "o-", color="C0")
    ax_rate.set_ylabel("images / s (median step)")
    ax_rate.set_ylim(bottom=0)
    labelled: set[int] = set()
    for p, run in zip(points, runs, strict=True):
        steps = primary_steps(run)
        if steps is None:
            continue
        t = steps["time"].to_numpy() - run.meta["start_time"]
        b = p["batch_per_rank"]
        ax_loss.plot(t, smoothed_loss(steps, p["smooth_window"] or 1).to_numpy(),
                     color=colour[b], lw=1.2, label=None if b in labelled else f"B = {b}")
        labelled.add(b)
    ax_loss.axhline(threshold, color="crimson", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax_loss.set_xlabel("wall time since start (s; data loading included)")
    ax_loss.set_ylabel("training loss (smoothed)")
    ax_loss.legend(fontsize=8, ncol=2, loc="upper right")
    ax_loss.grid(alpha=0.3)
    reached = [p for p in points if not p["ttl_censored"]]
    cens = [p for p in points if p["ttl_censored"] and p["ttl_lower_bound_s"]]
    ax_ttl.plot([p["batch_per_rank"] for p in reached], [p["ttl_s"] for p in reached], "o",
                color="C1", alpha=0.7, label="reached")
    ax_ttl.plot([p["batch_per_rank"] for p in cens], [p["ttl_lower_bound_s"] for p in cens], "^",
                color="C3", mfc="none", label="not reached (lower bound)")
    done = [r for r in rows if r["ttl_s"] is not None]
    if done:
        ax_ttl.plot([r["batch_per_rank"] for r in done], [r["ttl_s"] for r in done], "-",
                    color="C1", label="median over seeds")
    ax_ttl.set_ylim(bottom=0)
    ax_ttl.set_ylabel(f"time to loss < {threshold:g} (s)")
    ax_ttl.legend(fontsize=8, loc="lower left")
    for ax in (ax_rate, ax_ttl):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("minibatch size")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result['model']} on {result['device']}, {result['image_size']}^2 images, "
                 f"lr scaling {result['lr_scaling']}, {result['seconds_per_run']:g} s per run",
                 fontsize=10)
    return save_figure(fig, out)


def _percent_matrix(ax: plt.Axes, pct: np.ndarray, title: str, ylabels: bool,
                    classes: tuple[str, ...] = CLASSES) -> None:
    """One row-normalised confusion matrix in percent (rows = true class, in the order
    of ``classes``), its axes labelled with their symbols."""
    k = len(classes)
    ax.imshow(pct, cmap="Blues", vmin=0, vmax=100)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, f"{pct[i, j]:.0f}", ha="center", va="center", fontsize=8,
                    color="white" if pct[i, j] > 55 else "black")
    short = [SYMBOLS.get(c, c) for c in classes]
    ax.set_xticks(range(k), short)
    ax.set_yticks(range(k), short if ylabels else [])
    ax.set_xlabel("predicted")
    if ylabels:
        ax.set_ylabel("true")
    ax.set_title(title, fontsize=9, **PLAIN)


def fidelity(results: list[tuple[str, dict]], paper: tuple[str, list[list[float]],
             float], out: Path) -> Path:
    """The fidelity runs beside the paper: each run's held-out confusion matrix, Table 1's,
    and per class the accuracy (Wilson 95 % bars), the recall of the reference rule on
    the events' truth (a black tick; :mod:`lartpc.sim.limits`: a reference, not a bound)
    and the paper's accuracy. ``results``: (label, fidelity results JSON);
    ``paper``: (label, confusion in percent, overall accuracy)."""
    from textwrap import fill

    from lartpc.analysis.truth_limits import recall

    n = len(results) + 1
    fig = plt.figure(figsize=(3.0 * n + 5.5, 3.6))
    grid = fig.add_gridspec(1, n + 2, width_ratios=[1] * n + [0.05, 1.9], wspace=0.25)
    for k, (label, res) in enumerate(results):
        ax = fig.add_subplot(grid[0, k])
        acc = res["overall"]["accuracy"]
        _percent_matrix(ax, np.asarray(res["confusion_percent"], dtype=float),
                        f"{fill(label, 30)}\n{100 * acc:.1f} % overall", ylabels=k == 0)
    label, pct, acc = paper
    _percent_matrix(fig.add_subplot(grid[0, n - 1]), np.asarray(pct, dtype=float),
                    f"{label}\n{100 * acc:.1f} % overall", ylabels=False)
    ax = fig.add_subplot(grid[0, n + 1])
    x = np.arange(len(CLASSES))
    width = 0.8 / n
    colours = plt.cm.tab10(np.arange(n))
    for k, (label, res) in enumerate(results):
        pos = x - 0.4 + width * (k + 0.5)
        cls = [res["per_class"][c] for c in CLASSES]
        a = np.array([100 * c["accuracy"] for c in cls])
        lo = np.array([100 * c["wilson95"][0] for c in cls])
        hi = np.array([100 * c["wilson95"][1] for c in cls])
        ax.bar(pos, a, width, color=colours[k], label=label,
               yerr=[a - lo, hi - a], capsize=2, error_kw={"lw": 0.8})
        rule = [100 * recall(res["truth_limits"]["classes"][c]) for c in CLASSES]
        ax.plot(pos, rule, "_", color="black", ms=12, mew=2,
                label="reference rule on truth (not a bound)" if k == 0 else None)
    pos = x - 0.4 + width * (n - 0.5)
    ax.bar(pos, np.diag(np.asarray(pct, dtype=float)), width, color=colours[n - 1],
           hatch="//", edgecolor="white", label=paper[0])
    ax.set_xticks(x, list(CLASSES))
    ax.set_ylim(0, 105)
    ax.set_ylabel("held-out accuracy (%)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2,
              frameon=False)
    ax.set_title("per class", fontsize=9)
    return save_figure(fig, out)
