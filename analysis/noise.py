"""The gradient noise scale of a run, read from its ``noise.csv``.

Training writes one row per measured step with unbiased single-step estimates of
|G|^2 (``g2_est``) and tr(Sigma) (``trace_est``) (McCandlish et al. 2018, appendix A).
Both are noisy and either can be negative on one step, so they are averaged separately
before the ratio is taken: a bias-corrected exponential moving average for the curve over
training, and a ratio of means over the rows nearest the threshold loss (with a
delta-method standard error) for the B_noise the prediction uses. |G|^2 counts as
resolved only where the mean of those rows is at least :data:`RESOLVED_SE` (2) standard
errors above 0; otherwise the ratio is dominated by |G|^2's noise and only a lower bound,
mean tr(Sigma) / (mean |G|^2 + 2 SE), is given. As the
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
#: |G|^2 is resolved where its mean is at least this many standard errors above 0
RESOLVED_SE = 2.0
#: normal quantile of the 95 % intervals given for B_noise (log space)
Z95 = 1.959964


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
    b_noise_se: float  #: delta-method standard error of the ratio of means (nan: a bound)
    loss: float  #: mean smoothed loss of the rows used
    rows: int  #: rows used (those nearest the threshold in smoothed loss)
    reached: bool  #: False: the run never got there; the rows are its lowest-loss ones
    lower_bound: bool = False  #: mean |G|^2 < 2 SE: b_noise is a 2-sigma lower bound


def ratio_of_means(g2: np.ndarray, trace: np.ndarray) -> tuple[float, float]:
    """mean(trace) / mean(g2) and its delta-method standard error (nan if mean g2 <= 0)."""
    mg, mt = float(np.mean(g2)), float(np.mean(trace))
    if mg <= 0 or mt <= 0 or len(g2) < 2:
        return math.nan, math.nan
    r = mt / mg
    cov = np.cov(trace, g2)
    var = (cov[0, 0] / mt**2 + cov[1, 1] / mg**2 - 2 * cov[0, 1] / (mt * mg)) / len(g2)
    return r, r * math.sqrt(max(var, 0.0))


def mean_and_se(x: np.ndarray) -> tuple[float, float]:
    """Mean of ``x`` and its standard error (nan below 2 values)."""
    se = float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan
    return float(np.mean(x)), se


def resolved_ratio(g2: np.ndarray, trace: np.ndarray) -> tuple[float, float, bool]:
    """(B_noise, its standard error, lower bound?) from single-step estimates.

    Where mean |G|^2 >= :data:`RESOLVED_SE` standard errors, the ratio of means and its
    delta-method SE; otherwise (|G|^2 not resolved from 0) the lower bound
    mean tr(Sigma) / (mean |G|^2 + 2 SE), with SE nan (nan, nan when that is not positive
    either).
    """
    mg, se_g = mean_and_se(g2)
    if mg >= RESOLVED_SE * se_g:  # False where se_g is nan
        b, se = ratio_of_means(g2, trace)
        if math.isfinite(b):
            return b, se, False
    g2_hi, mt = mg + RESOLVED_SE * se_g, float(np.mean(trace))
    if mt > 0 and g2_hi > 0:
        return mt / g2_hi, math.nan, True
    return math.nan, math.nan, True


def b_noise_at_loss(name: str, df: pd.DataFrame, threshold: float,
                    span: int = DEFAULT_SPAN, rows: int | None = None) -> NoiseAtLoss:
    """B_noise from the ``rows`` rows (default max(20, n/5)) whose smoothed loss
    (:func:`centred`) is nearest ``threshold``: the ratio of their mean tr(Sigma) and
    mean |G|^2 estimates (:func:`resolved_ratio`).

    Single-step |G|^2 estimates are often negative when the gradient is small against its
    noise, so a ratio of means over many rows is used, not a running ratio. Where their
    mean is under 2 standard errors, B_noise is only a 2-sigma lower bound
    (``lower_bound``, ``b_noise_se`` nan), with a warning.

    Raises
    ------
    RunFolderError
        Not even a lower bound: mean tr(Sigma) or mean |G|^2 + 2 SE of those rows is not
        positive, or no row is finite (a run that diverged at once).
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
    b, se, bound = resolved_ratio(g2, tr)
    if not math.isfinite(b):
        raise RunFolderError(f"{name}: noise.csv: no positive noise-scale estimate in "
                             f"the {k} rows nearest loss {threshold:g}")
    if bound:
        log.warning("%s: |G|^2 not resolved from its noise near loss %.3g (mean under "
                    "%g standard errors): B_noise > %.3g (2-sigma lower bound)", name,
                    threshold, RESOLVED_SE, b)
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


@dataclass
class PooledNoise:
    """One B_noise from several runs, with its uncertainty."""

    b_noise: float  #: geometric mean of the runs' values
    log_se: float  #: standard error of ln b_noise (nan for a lower bound)
    lower_bound: bool  #: a run's |G|^2 was not resolved: b_noise is a lower bound

    def interval(self) -> tuple[float, float]:
        """95 % interval exp(ln B +- 1.96 SE); (B, inf) for a lower bound."""
        if self.lower_bound:
            return self.b_noise, math.inf
        half = Z95 * self.log_se
        return self.b_noise * math.exp(-half), self.b_noise * math.exp(half)


def pooled_b_noise(values: list[NoiseAtLoss]) -> PooledNoise:
    """One B_noise from several runs: the geometric mean (a scale, so averaged in logs).

    Its log-space standard error is the larger of the runs' own (delta-method SE / B,
    combined as for a mean) and, with 2 or more runs, that of their scatter. A lower
    bound among the values makes the result a lower bound (no SE)."""
    if not values:
        raise RunFolderError("no run has a noise.csv: train on 2 or more ranks (measured by "
                             "default) or with --set train.noise_scale=halves")
    logs = np.log([v.b_noise for v in values])
    bound = any(v.lower_bound for v in values)
    own = math.sqrt(sum((v.b_noise_se / v.b_noise) ** 2 for v in values)) / len(values)
    scatter = mean_and_se(logs)[1] if len(values) > 1 else 0.0
    return PooledNoise(b_noise=float(math.exp(logs.mean())),
                       log_se=math.nan if bound else max(own, scatter), lower_bound=bound)
