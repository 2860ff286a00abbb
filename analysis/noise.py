"""The gradient noise scale of a run, read from its ``noise.csv``.

Training writes one row per measured step with unbiased single-step estimates of
|G|^2 (``g2_est``) and tr(Sigma) (``trace_est``) (McCandlish et al. 2018, appendix A).
Both are noisy and either can be negative on one step, so they are averaged separately
before the ratio is taken: a bias-corrected exponential moving average for the curve over
training, and a ratio of means over the rows nearest the threshold loss (with a
delta-method standard error) for the B_noise the prediction uses. As the
paper does, B_simple = tr(Sigma)/|G|^2 stands for the critical batch B_noise (equal for
a well-conditioned Hessian; an assumption here). B_noise changes as the loss falls, so it
is taken where the smoothed loss is nearest the study's threshold.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from lartpc.analysis.runs import RunFolderError, read_table

from lartpc.runfolder.schema import NOISE_COLUMNS, NOISE_CSV

log = logging.getLogger(__name__)

#: EMA span, in measured rows: alpha = 2 / (span + 1)
DEFAULT_SPAN = 20


def read_noise(run_path: str | Path) -> pd.DataFrame | None:
    """``noise.csv`` of a run folder (None when the run did not measure the noise scale)."""
    path = Path(run_path) / NOISE_CSV
    if not path.is_file():
        return None
    df = read_table(path, NOISE_COLUMNS, ("step", "epoch"))
    if df.empty:
        return None
    return df


def noise_tables(runs: list, strict: bool = False,
                 skipped: list[tuple] | None = None) -> list[tuple]:
    """``(run, noise.csv table)`` of each run in ``runs`` that measured the noise scale.
    A ``noise.csv`` that cannot be read leaves its run out of the noise scale with a
    warning (``(run, reason)`` appended to ``skipped``), as an unusable run folder is
    left out of an analysis; ``strict``: it raises :class:`RunFolderError` instead."""
    tables = []
    for r in runs:
        try:
            df = read_noise(r.path)
        except RunFolderError as e:
            if strict:
                raise
            log.warning("%s: noise scale not used", e)
            if skipped is not None:
                skipped.append((r, str(e)))
            continue
        if df is not None:
            tables.append((r, df))
    return tables


def ema(x: np.ndarray, span: int) -> np.ndarray:
    """Bias-corrected exponential moving average (the first value is not pulled to 0)."""
    alpha = 2.0 / (span + 1.0)
    out, acc, weight = np.empty(len(x)), 0.0, 0.0
    for i, v in enumerate(x):
        acc = (1 - alpha) * acc + alpha * v
        weight = (1 - alpha) * weight + alpha
        out[i] = acc / weight
    return out


def centred(x: np.ndarray, span: int) -> np.ndarray:
    """Centred moving mean over ``span`` rows (fewer at the ends): a loss smoothed
    without the lag of :func:`ema`, which on a falling loss would pick rows some
    ``span / 2`` past the threshold (the TTL's smoothing is centred too)."""
    return pd.Series(x).rolling(span, center=True, min_periods=1).mean().to_numpy()


def smoothed(df: pd.DataFrame, span: int = DEFAULT_SPAN) -> pd.DataFrame:
    """Columns ``step, loss, g2, trace, b_noise``: EMA of each estimate, then the ratio."""
    g2 = ema(df["g2_est"].to_numpy(float), span)
    tr = ema(df["trace_est"].to_numpy(float), span)
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.where(g2 > 0, tr / g2, np.nan)
    return pd.DataFrame({"step": df["step"].to_numpy(), "loss": ema(df["loss"].to_numpy(float),
                                                                    span),
                         "g2": g2, "trace": tr, "b_noise": b})


@dataclass
class NoiseAtLoss:
    """B_noise of one run near the loss ``threshold``."""

    run: str
    b_noise: float
    b_noise_se: float  #: delta-method standard error of the ratio of means
    loss: float  #: mean smoothed loss of the rows used
    rows: int  #: rows used (those nearest the threshold in smoothed loss)
    reached: bool  #: False: the run never got there; the rows are its lowest-loss ones
    lower_bound: bool = False  #: |G|^2 not resolved: b_noise is a 2-sigma lower bound


def ratio_of_means(g2: np.ndarray, trace: np.ndarray) -> tuple[float, float]:
    """mean(trace) / mean(g2) and its delta-method standard error (nan if mean g2 <= 0)."""
    mg, mt = float(np.mean(g2)), float(np.mean(trace))
    if mg <= 0 or mt <= 0 or len(g2) < 2:
        return math.nan, math.nan
    r = mt / mg
    cov = np.cov(trace, g2)
    var = (cov[0, 0] / mt**2 + cov[1, 1] / mg**2 - 2 * cov[0, 1] / (mt * mg)) / len(g2)
    return r, r * math.sqrt(max(var, 0.0))


def b_noise_at_loss(name: str, df: pd.DataFrame, threshold: float,
                    span: int = DEFAULT_SPAN, rows: int | None = None) -> NoiseAtLoss:
    """B_noise from the ``rows`` rows (default max(20, n/5)) whose smoothed loss
    (:func:`centred`) is nearest ``threshold``: the ratio of their mean tr(Sigma) and
    mean |G|^2 estimates.

    Single-step |G|^2 estimates are often negative when the gradient is small against its
    noise, so a ratio of means over many rows is used, not a running ratio.

    Raises
    ------
    RunFolderError
        The mean |G|^2 or tr(Sigma) of those rows is not positive (not resolved), or no
        row is finite (a run that diverged at once).
    """
    finite = np.isfinite(df[["loss", "g2_est", "trace_est"]].to_numpy(float)).all(axis=1)
    df = df[finite]
    if df.empty:
        raise RunFolderError(f"{name}: noise.csv: no row with a finite loss and estimates")
    loss = centred(df["loss"].to_numpy(float), span)
    reached = bool((loss <= threshold).any())
    k = min(len(df), rows or max(20, len(df) // 5))
    near = np.argsort(np.abs(loss - threshold), kind="stable")[:k]
    g2, tr = df["g2_est"].to_numpy(float)[near], df["trace_est"].to_numpy(float)[near]
    b, se = ratio_of_means(g2, tr)
    bound = not math.isfinite(b)
    if bound:  # |G|^2 within its noise of 0: B_noise is only bounded from below
        g2_hi = g2.mean() + 2 * g2.std(ddof=1) / math.sqrt(k) if k > 1 else math.nan
        b, se = (tr.mean() / g2_hi, math.nan) if tr.mean() > 0 and g2_hi > 0 else (b, se)
        if not math.isfinite(b):
            raise RunFolderError(f"{name}: noise.csv: no positive noise-scale estimate in "
                                 f"the {k} rows nearest loss {threshold:g}")
        log.warning("%s: |G|^2 not resolved from its noise near loss %.3g: B_noise > %.3g "
                    "(2-sigma lower bound)", name, threshold, b)
    if not reached:
        log.warning("%s: smoothed loss never reaches %.3g (lowest %.3g): B_noise taken at "
                    "the lowest losses", name, threshold, loss.min())
    return NoiseAtLoss(run=name, b_noise=float(b), b_noise_se=float(se),
                       loss=float(loss[near].mean()), rows=k, reached=reached,
                       lower_bound=bound)


def binned(df: pd.DataFrame, bins: int = 6, span: int = DEFAULT_SPAN) -> pd.DataFrame:
    """B_noise against loss: ratio of means in ``bins`` equal-count bins of smoothed loss."""
    loss = centred(df["loss"].to_numpy(float), span)
    order = np.argsort(loss)
    out = []
    for idx in np.array_split(order, min(bins, max(1, len(df) // 10))):
        b, se = ratio_of_means(df["g2_est"].to_numpy(float)[idx],
                               df["trace_est"].to_numpy(float)[idx])
        out.append({"loss": float(loss[idx].mean()), "b_noise": b, "b_noise_se": se})
    return pd.DataFrame(out)


def pooled_b_noise(values: list[NoiseAtLoss]) -> float:
    """One B_noise from several runs: the geometric mean (a scale, so averaged in logs)."""
    if not values:
        raise RunFolderError("no run has a noise.csv: train on 2 or more ranks (measured by "
                             "default) or with --set train.noise_scale=halves")
    return math.exp(sum(math.log(v.b_noise) for v in values) / len(values))
