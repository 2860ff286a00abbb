"""Time-to-loss against N with right-censored runs: a Tobit (censored normal) fit.

A run that stopped above the loss threshold did not fail to have a time-to-loss; it
only shows that its TTL exceeds its own wall time ``c``. Dropping such runs keeps, at
each N, only the runs that happened to be fast, which flattens the fitted exponent when
small N (slow) runs are censored more often. The standard answer in survival analysis
is a censored regression on log TTL (an accelerated-failure-time model with log-normal
times; Tobin 1958, Kalbfleisch & Prentice 2002, ch. 3):

    log TTL_i = a + b log N_i + eps_i,   eps_i ~ Normal(0, sigma^2)

Uncensored runs contribute the normal density of their residual, censored ones the
probability that the residual exceeds ``log c_i - (a + b log N_i)``. The maximum of this
likelihood is found with scipy (BFGS on a, b, log sigma, started from least squares).

Its errors are asymptotic, and with a handful of runs the asymptotic ones are too
narrow (the normal 1.96 and chi-square cutoff covered 75-88 % in simulation, and a
censored run made the interval narrower than the same run observed). They are given
the small-sample form that least squares has, counted on the k runs that reached the
threshold (``dof`` = k - 2; a censored run tells less about the scatter than an
observed one):
- the exponent's standard error is the observed information's (a finite-difference
  Hessian of the exact gradient) scaled by sqrt(k / (k - 2));
- its 95 % interval is where twice the profile log-likelihood (a and sigma
  re-maximised) drops by k log(1 + t^2 / (k - 2)), t = t(0.975, k - 2): the profile
  copes with asymmetric censoring better than the standard error does;
- the fitted law's band uses the same t quantile.
With no censored run all three equal ordinary least squares' exactly (t interval, s^2 =
RSS / (n - 2)). Simulated (400 data sets each; 8 runs at N = 1, 2, 4, 8 or 5 at N = 1
to 16; censoring at a uniform random time, 10-40 % of runs): the interval covered
96-97 %, the band 96-98 % at N = 3 and 96-98 % at N = 64 (``tests/test_analysis_censored.py``
reruns a smaller such check).

The fit needs three runs that reached the threshold, at two GPU counts or more: with
fewer the spread sigma is not estimable (with two such runs the likelihood grows without
bound as the line passes through both and sigma goes to zero) or the exponent is not
bounded (one GPU count). It then gives no exponent, and the caller falls back to the
least-squares fit of the runs that reached it, saying so.
"""

from __future__ import annotations

import math

import numpy as np
from lartpc.analysis.fit import PowerLawFit, t_quantile
from scipy import optimize, special

# scipy.special, not scipy.stats: stats probes sys.modules for torch on import
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _negloglik_grad(theta: np.ndarray, x: np.ndarray, y: np.ndarray,
                    cens: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log-likelihood of (a, b, log sigma) and its gradient."""
    a, b, log_s = theta
    s = math.exp(log_s)
    z = (y - a - b * x) / s
    obs, cz = ~cens, z[cens]
    log_sf = special.log_ndtr(-cz)  # log P(residual > censoring point)
    nll = float(np.sum(0.5 * z[obs] ** 2 + log_s) - np.sum(log_sf))
    # d/dmu of -log sf(z) = -hazard(z)/s; d/dmu of z^2/2 = -z/s
    hazard = np.exp(-0.5 * cz ** 2 - LOG_SQRT_2PI - log_sf)
    dmu = np.zeros_like(z)
    dmu[obs] = -z[obs] / s
    dmu[cens] = -hazard / s
    dlog_s = float(np.sum(1.0 - z[obs] ** 2) - np.sum(hazard * cz))
    return nll, np.array([dmu.sum(), (dmu * x).sum(), dlog_s])


def _maximise(x, y, cens, start: np.ndarray, fixed_b: float | None = None):
    """The maximum-likelihood theta (optionally with b held at ``fixed_b``) and -loglik."""
    if fixed_b is None:
        res = optimize.minimize(_negloglik_grad, start, args=(x, y, cens), jac=True,
                                method="BFGS")
        return res.x, float(res.fun)

    def f(t):
        v, g = _negloglik_grad(np.array([t[0], fixed_b, t[1]]), x, y, cens)
        return v, g[[0, 2]]

    res = optimize.minimize(f, start[[0, 2]], jac=True, method="BFGS")
    return np.array([res.x[0], fixed_b, res.x[1]]), float(res.fun)


def _hessian(x, y, cens, theta: np.ndarray, h: float = 1e-5) -> np.ndarray:
    cols = []
    for i in range(3):
        e = np.zeros(3)
        e[i] = h
        cols.append((_negloglik_grad(theta + e, x, y, cens)[1]
                     - _negloglik_grad(theta - e, x, y, cens)[1]) / (2 * h))
    hess = np.array(cols)
    return 0.5 * (hess + hess.T)


def _profile_ci(x, y, cens, theta: np.ndarray, nll: float, se: float | None,
                cutoff: float):
    """Where twice the profile log-likelihood of b drops by ``cutoff`` on each side."""
    def drop(b):
        return _maximise(x, y, cens, theta, fixed_b=b)[1] - nll - cutoff / 2

    b0, step = theta[1], max(se or 0.0, 0.05)
    ends = []
    for sign in (-1.0, 1.0):
        far = b0 + sign * step
        for _ in range(40):
            if drop(far) > 0:
                break
            far = b0 + 2 * (far - b0)
        else:
            return None  # the likelihood never drops: the data do not bound b
        lo, hi = sorted((b0, far))
        ends.append(optimize.brentq(drop, lo, hi, xtol=1e-6))
    return float(ends[0]), float(ends[1])


def fit_censored_power_law(n, y, censored, quantity: str = "TTL") -> PowerLawFit:
    """Fit ``y = a * N^b`` with right-censored values (see the module docstring).

    Parameters
    ----------
    n : array-like
        GPU counts, one per run.
    y : array-like
        The run's TTL, or for a censored run the time it ran without reaching the
        threshold (a lower bound of its TTL).
    censored : array-like of bool
        True where ``y`` is only a lower bound.
    quantity : str
        Name used in notes.
    """
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    cens = np.asarray(censored, dtype=bool)
    ok = np.isfinite(n) & np.isfinite(y) & (n > 0) & (y > 0)
    n, y, cens = n[ok], y[ok], cens[ok]
    levels = np.unique(n)
    out = PowerLawFit(quantity=quantity, n_points=int(len(y)),
                      gpu_counts=[int(v) for v in levels])
    n_obs, obs_levels = int((~cens).sum()), len(np.unique(n[~cens]))
    if n_obs < 3 or obs_levels < 2:
        out.notes.append(f"{quantity} (censored fit): needs three runs that reached the "
                         f"threshold, at two GPU counts or more; have {n_obs} at "
                         f"{obs_levels}")
        return out
    x, ly = np.log(n), np.log(y)
    b0, a0 = np.polyfit(x, ly, 1)
    s0 = max(float(np.std(ly - a0 - b0 * x)), 1e-3)
    try:
        with np.errstate(over="raise", invalid="raise"):
            theta, nll = _maximise(x, ly, cens, np.array([a0, b0, math.log(s0)]))
    except (OverflowError, FloatingPointError) as e:
        out.notes.append(f"{quantity} (censored fit): the likelihood's maximum was not "
                         f"found ({type(e).__name__}: {e})")
        return out
    if not np.all(np.isfinite(theta)) or theta[2] < math.log(1e-6):
        out.notes.append(f"{quantity} (censored fit): the runs that reached the threshold "
                         "lie on one line and no censored run says otherwise (sigma -> 0): "
                         "no fit")
        return out
    out.prefactor, out.exponent = float(math.exp(theta[0])), float(theta[1])
    out.residuals = [float(r) for r in ly - theta[0] - theta[1] * x]
    out.dof = n_obs - 2  # the band's t quantile: counted on the runs that reached it
    t = t_quantile(out.dof)
    try:
        cov = np.linalg.inv(_hessian(x, ly, cens, theta)) * (n_obs / out.dof)
        se = math.sqrt(cov[1, 1]) if cov[1, 1] > 0 else None
    except np.linalg.LinAlgError:
        cov, se = None, None
    out.exponent_err = se
    if se is not None:
        out.cov_log_a_b = cov[:2, :2].tolist()
    cutoff = n_obs * math.log1p(t * t / out.dof)
    try:
        out.exponent_ci95 = _profile_ci(x, ly, cens, theta, nll, se, cutoff)
    except (OverflowError, FloatingPointError, ValueError):  # lost far out on one side
        out.exponent_ci95 = None
    out.ci_method = None if out.exponent_ci95 is None else "profile likelihood"
    n_cens = int(cens.sum())
    out.notes.append(f"{quantity}: censored (Tobit) fit of log {quantity} on log N over "
                     f"{len(y)} runs, {n_cens} censored; sigma = {math.exp(theta[2]):.3f}; "
                     + ("95 % interval from the profile likelihood" if out.exponent_ci95
                        else "no 95 % interval (the profile likelihood did not bound it)"))
    if out.exponent_ci95 is None:
        out.warnings.append(f"{quantity}: the censored runs leave the exponent unbounded "
                            "(the likelihood does not drop on one side): run longer")
    return out
