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
from lartpc.analysis.plots import clock_name, fit_label, gpu_axis, log_y, save_figure  # noqa: E402


def speedup_efficiency(scaling: list[dict], model: str, out: Path, unit: str = "GPU") -> Path:
    """Two panels from :func:`lartpc.analysis.fit.scaling_table` rows: speedup (epoch rate, and
    time-to-loss where reached) against N (counted in ``unit``) with the ideal N/N0, and efficiency
    with 1."""
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(11, 4.5))
    gpus = [r["gpus"] for r in scaling] or [1]
    n0 = gpus[0]
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
    fig.suptitle(f"{model}: speedup and efficiency")
    return save_figure(fig, out)


def ttl_vs_n(rows: list[RunMetrics], fit: PowerLawFit, dropped: PowerLawFit | None,
             model: str, threshold: float, out: Path, unit: str = "GPU") -> Path:
    """Time-to-loss per run against N; censored runs drawn at their lower bound (a run
    that stopped above the threshold); the fitted law with its 95 % band, and the fit
    without the censored runs where it differs."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    done = [m for m in rows if not m.ttl_censored and m.ttl_s]
    cens = [m for m in rows if m.ttl_censored and m.ttl_lower_bound_s]
    gpus = sorted({m.world_size for m in done + cens}) or [1]
    ax.plot([m.world_size for m in done], [m.ttl_s for m in done], "o", color="k",
            label="runs that reached the threshold")
    if cens:
        ax.plot([m.world_size for m in cens], [m.ttl_lower_bound_s for m in cens], "^",
                color="tab:red", mfc="none", label="censored: TTL > its run time")
    xs = np.geomspace(gpus[0], gpus[-1], 50)
    if fit.exponent is not None:
        ax.plot(xs, fit.predict(xs), "-", color="tab:blue", label=fit_label(fit, "TTL"))
        band = fit.band(xs)
        if band is not None:
            ax.fill_between(xs, *band, color="tab:blue", alpha=0.15, label="95 % band")
    if dropped is not None and dropped.exponent is not None and cens:
        ax.plot(xs, dropped.predict(xs), "--", color="tab:orange",
                label=fit_label(dropped, "TTL") + " (censored dropped)")
    if done or cens:
        log_y(ax)
    gpu_axis(ax, gpus)
    ax.set_xlabel(f"{unit}s (N)")
    ax.set_ylabel(f"time to loss {threshold:g} (s, {clock_name(rows)})")
    ax.set_title(f"{model}: time to loss against {unit} count")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, out)
