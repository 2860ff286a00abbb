"""Power-law fits y = a * N^b in log space, bootstrap intervals, scaling tables.

- The fit is ordinary least squares of log y on log N over every run (repeated runs per N
  included as separate points). Time-to-loss with censored runs (stopped above the
  threshold) is fitted by maximum likelihood with those runs as lower bounds
  (:mod:`lartpc.analysis.censored`); the least-squares fit over the uncensored runs alone is
  kept beside it for comparison. The exponent's standard error comes from the covariance
  s^2 (X'X)^-1 with s^2 = RSS / (n - 2); with only two points there is none. The
  exponent's 95 % interval is b +/- t(0.975, n - 2) se(b), and the fitted law's band
  uses the same t quantile (exact for normal scatter in log y; with 4 runs z = 1.96
  would give a band covering ~82 % instead of 95 %).
- With repeated runs at some N, a bootstrap also resamples runs *within each N* (so every N
  keeps its number of runs) and refits; its 2.5/97.5 percentiles are kept beside the t
  interval (``exponent_ci95_bootstrap``), not in its place: with 2-3 runs per N the
  percentile bootstrap covers only ~70-85 % (simulated), as it cannot see the spread that
  a few runs do not show.
- Breakdown check: a quadratic term c2 (log N)^2 is added; a warning is raised when it is
  significant at the 5 % level (|c2| > t(0.975, n - 3) se(c2), a t test with the
  quadratic fit's n - 3 degrees of freedom), i.e. the log-log residuals curve. It needs
  at least 3 GPU counts and 4 points (one degree of freedom left). A fixed 2 sigma, with
  1-4 degrees of freedom, raised it on 10-32 % of exact power laws (simulated); the t
  test on ~5 %.
- Speedup, efficiency and the Karp-Flatt serial fraction are relative to the smallest N in
  the data with an epoch rate (N0, ``baseline_gpus``): p = N / N0, speedup S = rate(N) /
  rate(N0) (or TTL(N0) / TTL(N)), efficiency S / p, Karp-Flatt e = (1/S - 1/p) / (1 - 1/p)
  (undefined at p = 1). The TTL speedup's baseline is the smallest N whose runs all
  reached the threshold (``ttl_baseline_gpus``); an N with a censored run has its mean
  TTL as a lower bound (its censored runs at their bounds) and no TTL speedup.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from lartpc.analysis.metrics import SETTING, RunMetrics
from scipy import special  # not scipy.stats: stats probes sys.modules for torch on import

from lartpc.runfolder.schema import Status

N_BOOT = 2000


@dataclass
class PowerLawFit:
    """Result of :func:`fit_power_law`; exponent fields are None when no fit was possible."""

    quantity: str
    n_points: int
    gpu_counts: list[int]
    prefactor: float | None = None
    exponent: float | None = None
    exponent_err: float | None = None
    exponent_ci95: tuple[float, float] | None = None
    curvature: float | None = None
    curvature_err: float | None = None
    residuals: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: covariance of (log a, b), for the fitted law's confidence band (None: no errors)
    cov_log_a_b: list[list[float]] | None = None
    #: how ``exponent_ci95`` was made: "t" (least squares), "profile likelihood" (the
    #: censored fit) or None (no interval)
    ci_method: str | None = None
    #: residual degrees of freedom, the band's t quantile: runs - 2 for least squares,
    #: runs that reached the threshold - 2 for the censored fit (None: no errors)
    dof: int | None = None
    #: the bootstrap's percentile interval, where some N has repeated runs (a check)
    exponent_ci95_bootstrap: tuple[float, float] | None = None

    def predict(self, n: np.ndarray) -> np.ndarray:
        """a * N^b for the fitted a, b."""
        return self.prefactor * np.asarray(n, dtype=float) ** self.exponent

    def band(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Lower and upper edge of the fitted law's 95 % confidence band (log a + b log N
        +/- q standard errors from :attr:`cov_log_a_b`, q = :meth:`quantile`), or None
        without a covariance."""
        if self.cov_log_a_b is None or self.exponent is None:
            return None
        z = self.quantile()
        x = np.log(np.asarray(n, dtype=float))
        c = np.asarray(self.cov_log_a_b)
        sd = np.sqrt(np.maximum(c[0, 0] + 2 * x * c[0, 1] + x * x * c[1, 1], 0.0))
        mid = self.predict(n)
        return mid * np.exp(-z * sd), mid * np.exp(z * sd)

    def quantile(self) -> float:
        """The two-sided 95 % quantile for this fit's standard errors: Student's t
        with :attr:`dof` degrees of freedom (the normal 1.96 where it has none)."""
        return t_quantile(self.dof)

    def to_dict(self) -> dict:
        return asdict(self)


def t_quantile(dof: int | None, p: float = 0.975) -> float:
    """Student's t quantile with ``dof`` degrees of freedom (None: the normal one)."""
    return float(special.ndtri(p) if dof is None else special.stdtrit(dof, p))


def _ols(x: np.ndarray, y: np.ndarray, degree: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """Coefficients (constant first) and their covariance (None when no dof is left)."""
    X = np.vander(x, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    dof = len(y) - (degree + 1)
    if dof <= 0:
        return coef, None
    rss = float(np.sum((y - X @ coef) ** 2))
    return coef, rss / dof * np.linalg.inv(X.T @ X)


def fit_power_law(n: list[float] | np.ndarray, y: list[float] | np.ndarray, quantity: str,
                  n_boot: int = N_BOOT, seed: int = 0) -> PowerLawFit:
    """Fit ``y = a * N^b`` in log space (see module docstring for errors and checks).

    Parameters
    ----------
    n, y : array-like
        GPU counts and the measured quantity, one entry per run (repeats allowed).
    quantity : str
        Name used in notes ("TTL", "epoch rate").
    n_boot : int
        Bootstrap resamples when some N has repeated runs (0: none).
    seed : int
        Seed of the bootstrap generator, so reports are reproducible.
    """
    n = np.asarray(n, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(n) & np.isfinite(y) & (n > 0) & (y > 0)
    n, y = n[ok], y[ok]
    levels = np.unique(n)
    out = PowerLawFit(quantity=quantity, n_points=int(len(y)),
                      gpu_counts=[int(v) for v in levels])
    if len(levels) == 0:
        out.notes.append(f"{quantity}: no usable runs: no fit possible")
        return out
    if len(levels) == 1:
        out.notes.append(f"{quantity}: only one GPU count (N={int(levels[0])}): "
                         "no fit possible")
        return out
    x, ly = np.log(n), np.log(y)
    coef, cov = _ols(x, ly)
    out.prefactor, out.exponent = float(math.exp(coef[0])), float(coef[1])
    out.residuals = [float(r) for r in ly - (coef[0] + coef[1] * x)]
    if cov is None:
        out.notes.append(f"{quantity}: only {len(y)} points for 2 parameters: exponent has "
                         "no standard error (needs another GPU count or repeated runs)")
    else:
        out.exponent_err = float(math.sqrt(max(cov[1, 1], 0.0)))
        out.cov_log_a_b = cov.tolist()
        out.dof = len(y) - 2
        half = out.quantile() * out.exponent_err
        out.exponent_ci95, out.ci_method = (out.exponent - half, out.exponent + half), "t"
    groups = [np.flatnonzero(n == v) for v in levels]
    if n_boot > 0 and any(len(g) > 1 for g in groups):
        rng = np.random.default_rng(seed)
        boots = np.empty(n_boot)
        for i in range(n_boot):
            idx = np.concatenate([rng.choice(g, size=len(g)) for g in groups])
            boots[i] = np.polyfit(x[idx], ly[idx], 1)[0]
        lo, hi = np.percentile(boots, [2.5, 97.5])
        out.exponent_ci95_bootstrap = (float(lo), float(hi))
        single = sum(len(g) == 1 for g in groups)
        if single:
            out.notes.append(f"{quantity}: bootstrap CI resamples runs within each N; "
                             f"{single} GPU count(s) with a single run add no spread")
    if len(levels) >= 3 and len(y) >= 4:
        xc = x - x.mean()
        qcoef, qcov = _ols(xc, ly, degree=2)
        out.curvature = float(qcoef[2])
        out.curvature_err = float(math.sqrt(max(qcov[2, 2], 0.0)))
        q = t_quantile(len(y) - 3)
        if out.curvature_err > 0 and abs(out.curvature) > q * out.curvature_err:
            out.warnings.append(
                f"{quantity}: log-log residuals curve (quadratic term "
                f"{out.curvature:+.3f} +/- {out.curvature_err:.3f}, "
                f"{abs(out.curvature) / out.curvature_err:.1f} sigma, past the 5 % "
                f"level's {q:.1f} with {len(y) - 3} degree(s) of freedom): the power law "
                "is breaking down over this range of N")
    else:
        out.notes.append(f"{quantity}: curvature (power-law breakdown) test needs >= 3 GPU "
                         f"counts and >= 4 points; have {len(levels)} and {len(y)}")
    return out


def _mean(values: list[float]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else None


def mean_ttl(rs: list[RunMetrics]) -> tuple[float | None, bool]:
    """The mean time-to-loss of one N's runs and whether it is only a lower bound: with
    a censored run the mean takes its bound (its TTL is later), and is itself a bound;
    None where a censored run has no bound (diverged, or no wall time). The mean of
    the runs that reached the threshold alone would keep only the fast ones."""
    if all(not r.ttl_censored for r in rs):
        return _mean([r.ttl_s for r in rs]), False
    if all(not r.ttl_censored or bounds_ttl(r) for r in rs):
        return _mean([r.ttl_lower_bound_s if r.ttl_censored else r.ttl_s for r in rs]), True
    return None, True


def scaling_table(rows: list[RunMetrics]) -> list[dict]:
    """Per-N means, speedup, efficiency and Karp-Flatt fraction relative to the smallest N
    with an epoch rate. An N with a censored run has its mean TTL as a lower bound
    (``ttl_mean_is_bound``) and no TTL speedup; the TTL speedups start at the smallest N
    whose runs all reached the threshold."""
    by_n: dict[int, list[RunMetrics]] = {}
    for r in rows:
        by_n.setdefault(r.world_size, []).append(r)
    table: list[dict] = []
    base_rate = base_ttl = None
    for n in sorted(by_n):
        rs = by_n[n]
        rate = _mean([r.epoch_rate_per_min for r in rs])
        ttl, ttl_bound = mean_ttl(rs)
        rates = [r.epoch_rate_per_min for r in rs if r.epoch_rate_per_min is not None]
        if base_rate is None and rate is not None:
            # speedups start at the smallest N with an epoch rate (its runs logged steps)
            n0, base_rate = n, rate
        if base_ttl is None and ttl is not None and not ttl_bound:
            # TTL speedup starts at the smallest N whose runs all reached the threshold
            n0_ttl, base_ttl = n, ttl
        p = n / n0 if base_rate is not None else None
        row = {"gpus": n, "n_runs": len(rs), "p": p,
               "epoch_rate_mean": rate,
               "epoch_rate_sd": float(np.std(rates, ddof=1)) if len(rates) > 1 else None,
               "dlt_mean_s": _mean([r.dlt_s for r in rs]),
               "ttl_mean_s": ttl, "ttl_mean_is_bound": ttl_bound,
               "n_ttl_censored": sum(r.ttl_censored for r in rs),
               "speedup": None, "efficiency": None, "karp_flatt": None,
               "ttl_baseline_gpus": None, "ttl_speedup": None, "ttl_efficiency": None}
        if rate and base_rate:
            s = rate / base_rate
            row.update(speedup=s, efficiency=s / p)
            if p > 1:
                row["karp_flatt"] = (1 / s - 1 / p) / (1 - 1 / p)
        if ttl and base_ttl and not ttl_bound:
            p_ttl = n / n0_ttl
            row.update(ttl_baseline_gpus=n0_ttl, ttl_speedup=base_ttl / ttl,
                       ttl_efficiency=base_ttl / ttl / p_ttl)
        table.append(row)
    return table


def ttl_mean_text(row: dict, fmt: str = "{:.0f}", none: str = "-") -> str:
    """A scaling row's mean TTL for a table: ``> 812`` where it is a lower bound."""
    v = row["ttl_mean_s"]
    if v is None or not math.isfinite(v):
        return none
    return ("> " if row.get("ttl_mean_is_bound") else "") + fmt.format(v)


def bounds_ttl(r: RunMetrics) -> bool:
    """True for a censored run whose stop is a lower bound of its TTL: it has a wall time
    and did not diverge (a diverged run would not have got there). Such runs enter the
    TTL fit as lower bounds and are drawn as such."""
    return bool(r.ttl_censored and r.ttl_lower_bound_s and r.status != Status.DIVERGED)


def summarize_model(rows: list[RunMetrics], seed: int = 0) -> dict:
    """Fits and scaling for the runs of one model (keys as in ``fit --json``)."""
    from lartpc.analysis.censored import fit_censored_power_law

    rows = sorted(rows, key=lambda r: (r.world_size, r.name))
    ok = [r for r in rows if not r.ttl_censored]
    dropped = fit_power_law([r.world_size for r in ok], [r.ttl_s for r in ok], "TTL",
                            seed=seed)
    # a diverged run's censoring is no lower bound: it would not have got there
    bounded = [r for r in rows if not r.ttl_censored or bounds_ttl(r)]
    ttl, fallback = dropped, None
    if len(bounded) > len(ok):  # censored runs with a lower bound: they enter the fit
        ttl = fit_censored_power_law([r.world_size for r in bounded],
                                     [r.ttl_lower_bound_s if r.ttl_censored else r.ttl_s
                                      for r in bounded],
                                     [r.ttl_censored for r in bounded], "TTL")
        if ttl.exponent is None and dropped.exponent is not None:
            fallback = (f"TTL: the censored fit was not possible ({ttl.notes[-1]}); the "
                        "exponent is the least-squares fit of the runs that reached the "
                        "threshold alone, biased toward the fast runs: run longer")
            dropped.notes[:0] = ttl.notes
            ttl = dropped
    rated = [r for r in rows if r.epoch_rate_per_min is not None]
    rate = fit_power_law([r.world_size for r in rated],
                         [r.epoch_rate_per_min for r in rated], "epoch rate", seed=seed)
    n_cens = len(rows) - len(ok)
    notes = []
    if n_cens:
        names = ", ".join(f"{r.name} (N={r.world_size}, > {r.ttl_lower_bound_s or 0:.0f} s)"
                          for r in rows if r.ttl_censored)
        # none enters a fit that was not made (one N) or fell back to the reached runs
        used = len(bounded) - len(ok) if fallback is None and ttl.exponent is not None else 0
        notes.append(f"{n_cens} censored run(s) never reached the threshold: {names}; "
                     + (f"{used} enter the TTL fit as lower bounds (censored fit)"
                        + (f", {n_cens - used} left out (diverged, or no wall time)"
                           if used < n_cens else "")
                        if used else "none enters the TTL fit")
                     + ("; with them dropped the exponent would be "
                        + _exp_text(dropped) if ttl is not dropped and dropped.exponent
                        is not None else ""))
    warnings = ([fallback] if fallback else []) + _mixed_settings(rows)
    if len(rated) < len(rows):
        notes.append(f"{len(rows) - len(rated)} run(s) logged fewer than 2 steps: no epoch "
                     "rate")
    notes += ttl.notes + rate.notes
    table = scaling_table(rows)
    return {
        "n_runs": len(rows), "n_censored": n_cens, "gpu_counts": sorted({r.world_size
                                                                         for r in rows}),
        "ttl_exponent": ttl.exponent, "ttl_exponent_err": ttl.exponent_err,
        "ttl_exponent_ci95": ttl.exponent_ci95, "ttl_ci_method": ttl.ci_method,
        "ttl_prefactor_s": ttl.prefactor,
        "epoch_rate_exponent": rate.exponent, "epoch_rate_exponent_err": rate.exponent_err,
        "epoch_rate_exponent_ci95": rate.exponent_ci95,
        "epoch_rate_ci_method": rate.ci_method,
        "epoch_rate_prefactor_per_min": rate.prefactor,
        "baseline_gpus": next((r["gpus"] for r in table if r["p"] is not None), None),
        "scaling": table, "notes": notes,
        "warnings": warnings + ttl.warnings + rate.warnings,
        "ttl_fit": ttl.to_dict(), "epoch_rate_fit": rate.to_dict(),
        "ttl_fit_method": "censored" if ttl is not dropped else "least squares",
        # the fit over the runs that reached the threshold only, for comparison
        "ttl_fit_uncensored_only": dropped.to_dict(),
    }


def _mixed_settings(rows: list[RunMetrics]) -> list[str]:
    """A warning where the runs of one fit differ in a setting they must share."""
    differ = {}
    for key in SETTING:
        # one process without a launcher (backend none) goes with any backend's runs
        values = {r.setting.get(key) for r in rows
                  if r.setting.get(key) not in (None, "none" if key == "backend" else None)}
        if len(values) > 1:
            differ[key] = ", ".join(str(v) for v in sorted(
                values, key=lambda v: (isinstance(v, str), v if isinstance(v, str) else
                                       float(v))))
    if not differ:
        return []
    return [f"the {rows[0].model} runs differ in "
            + "; ".join(f"{k} ({v})" for k, v in differ.items())
            + ": this fit pools them, so its exponents mix settings; fit the runs of one "
            "setting (give their folders)"]


def _exp_text(f: PowerLawFit) -> str:
    if f.exponent is None:
        return "not fitted"
    err = f" +/- {f.exponent_err:.2f}" if f.exponent_err is not None else ""
    return f"{f.exponent:+.2f}{err} ({f.n_points} runs)"


def summarize(rows: list[RunMetrics], seed: int = 0) -> dict[str, dict]:
    """:func:`summarize_model` for every model present, keyed by model name."""
    models = sorted({r.model for r in rows})
    return {m: summarize_model([r for r in rows if r.model == m], seed=seed) for m in models}
