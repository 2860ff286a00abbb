"""The gradient noise scale of a run, read from its ``noise.csv``.

Training writes one row per measured step with unbiased single-step estimates of
|G|^2 (``g2_est``) and tr(Sigma) (``trace_est``) (McCandlish et al. 2018, appendix A).
Both are noisy and either can be negative on one step, so each is smoothed on its own
with a bias-corrected exponential moving average, and B_noise is their ratio. As the
paper does, B_simple = tr(Sigma)/|G|^2 stands for the critical batch B_noise (equal for
a well-conditioned Hessian; an assumption here). B_noise grows as the loss falls, so it
is taken where the smoothed loss first reaches the study's threshold.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.runs import RunFolderError, read_table

log = logging.getLogger(__name__)

NOISE_COLUMNS = ("step", "epoch", "loss", "batch_small", "batch_big", "g2_small", "g2_big",
                 "g2_est", "trace_est", "b_simple")
#: EMA span, in measured rows: alpha = 2 / (span + 1)
DEFAULT_SPAN = 20


def read_noise(run_path: str | Path) -> pd.DataFrame | None:
    """``noise.csv`` of a run folder (None when the run did not measure the noise scale)."""
    path = Path(run_path) / "noise.csv"
    if not path.is_file():
        return None
    df = read_table(path, NOISE_COLUMNS, ("step", "epoch"))
    if df.empty:
        return None
    return df


def ema(x: np.ndarray, span: int) -> np.ndarray:
    """Bias-corrected exponential moving average (the first value is not pulled to 0)."""
    alpha = 2.0 / (span + 1.0)
    out, acc, weight = np.empty(len(x)), 0.0, 0.0
    for i, v in enumerate(x):
        acc = (1 - alpha) * acc + alpha * v
        weight = (1 - alpha) * weight + alpha
        out[i] = acc / weight
    return out


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
    """B_noise of one run where its smoothed loss first reaches ``threshold``."""

    run: str
    b_noise: float
    loss: float
    step: int
    reached: bool  #: False: the run never got there; the value is at its lowest loss
    rows: int


def b_noise_at_loss(name: str, df: pd.DataFrame, threshold: float,
                    span: int = DEFAULT_SPAN) -> NoiseAtLoss:
    """Smoothed B_noise at the first row whose smoothed loss is at or below ``threshold``.

    Raises
    ------
    RunFolderError
        No row has a positive smoothed |G|^2 and tr(Sigma) (no usable estimate).
    """
    s = smoothed(df, span)
    ok = np.isfinite(s["b_noise"].to_numpy()) & (s["trace"].to_numpy() > 0)
    if not ok.any():
        raise RunFolderError(f"{name}: noise.csv has no row with positive smoothed |G|^2 and "
                             "tr(Sigma); too few measured steps?")
    below = np.flatnonzero((s["loss"].to_numpy() <= threshold) & ok)
    reached = below.size > 0
    i = int(below[0]) if reached else int(np.flatnonzero(ok)[np.argmin(s["loss"][ok])])
    if not reached:
        log.warning("%s: smoothed loss never reaches %.3g (lowest %.3g): B_noise taken there",
                    name, threshold, s["loss"][i])
    return NoiseAtLoss(run=name, b_noise=float(s["b_noise"][i]), loss=float(s["loss"][i]),
                       step=int(s["step"][i]), reached=reached, rows=len(df))


def pooled_b_noise(values: list[NoiseAtLoss]) -> float:
    """One B_noise from several runs: the geometric mean (a scale, so averaged in logs)."""
    if not values:
        raise RunFolderError("no run has a noise.csv: train with --set train.noise_scale=auto")
    return math.exp(sum(math.log(v.b_noise) for v in values) / len(values))
