"""Figures of the scaling numbers ``analysis fit`` prints: speedup and efficiency
against N with the ideal lines, and time-to-loss against N with the fitted law, its 95 %
band and the censored runs as lower bounds."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from lartpc.analysis.fit import PowerLawFit  # noqa: E402
from lartpc.analysis.metrics import RunMetrics  # noqa: E402
from lartpc.analysis.plots import (  # noqa: E402
    clock_name,
    fit_label,
    gpu_axis,
    log_y,
    save_figure,
    say_empty,
    ttl_points,
)


def speedup_efficiency(scaling: list[dict], model: str, out: Path, unit: str = "GPU", *,
                       baseline_gpus: int | None) -> Path:
    """Two panels from :func:`lartpc.analysis.fit.scaling_table` rows: speedup (epoch rate, and
    time-to-loss where reached) against N (counted in ``unit``) with the ideal N/N0, and efficiency
    with 1. N0 is ``baseline_gpus`` (the summary's: the smallest N with an epoch rate); without
    one, the smallest N that reached the threshold (the TTL speedups')."""
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(11, 4.5))
    fig.suptitle(f"{model}: speedup and efficiency")
    n0 = baseline_gpus or next((r["ttl_baseline_gpus"] for r in scaling
                                if r["ttl_baseline_gpus"] is not None), None)
    if n0 is None:
        for ax in (ax_s, ax_e):
            say_empty(ax, "no epoch rate and no time to loss in these runs: no speedups")
        return save_figure(fig, out)
    gpus = [r["gpus"] for r in scaling]
    xs = np.geomspace(gpus[0], gpus[-1], 50)
    ax_s.plot(xs, xs / n0, "--", color="grey", label=f"ideal (N / {n0})")
    ax_e.axhline(1.0, ls="--", color="grey", label="ideal")
    for key, eff, label, style in (("speedup", "efficiency", "epoch rate", "o-"),
                                   ("ttl_speedup", "ttl_efficiency", "time to loss", "s:")):
        pts = [r for r in scaling if r[key] is not None]
        if pts and key == "ttl_speedup" and pts[0]["ttl_baseline_gpus"] != n0:
            label += f" (from N = {pts[0]['ttl_baseline_gpus']}, the first that reached it)"
        if pts:
            ax_s.plot([r["gpus"] for r in pts], [r[key] for r in pts], style, label=label)
            ax_e.plot([r["gpus"] for r in pts], [r[eff] for r in pts], style, label=label)
    for ax in (ax_s, ax_e):
        gpu_axis(ax, gpus)
        ax.set_xlabel(f"{unit}s (N)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    log_y(ax_s)
    ax_s.set_ylabel(f"speedup over N = {n0}")
    ax_e.set_ylabel("parallel efficiency (speedup / (N / N0))")
    ax_e.set_ylim(bottom=0)
    return save_figure(fig, out)


def ttl_vs_n(rows: list[RunMetrics], fit: PowerLawFit, dropped: PowerLawFit | None,
             model: str, threshold: float, out: Path, unit: str = "GPU") -> Path:
    """Time-to-loss per run against N (:func:`lartpc.analysis.plots.ttl_points`: censored
    runs at their lower bound, diverged ones where they stopped); the fitted law with its
    95 % band, and ``dropped`` (the fit without the censored runs, given where the censored
    fit replaced it) dashed."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    ax.set_title(f"{model}: time to loss against {unit} count")
    if not ttl_points(ax, rows):
        say_empty(ax, "no run has a time to loss or a bound on it")
        return save_figure(fig, out)
    gpus = sorted({m.world_size for m in rows if m.ttl_s or m.ttl_lower_bound_s})
    xs = np.geomspace(gpus[0], gpus[-1], 50)
    if fit.exponent is not None:
        ax.plot(xs, fit.predict(xs), "-", color="tab:blue", label=fit_label(fit, "TTL"))
        band = fit.band(xs)
        if band is not None:
            ax.fill_between(xs, *band, color="tab:blue", alpha=0.15, label="95 % band")
    if dropped is not None and dropped.exponent is not None:
        ax.plot(xs, dropped.predict(xs), "--", color="tab:orange",
                label=fit_label(dropped, "TTL") + " (censored dropped)")
    log_y(ax)
    gpu_axis(ax, gpus)
    ax.set_xlabel(f"{unit}s (N)")
    ax.set_ylabel(f"time to loss {threshold:g} (s, {clock_name(rows)})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, out)
