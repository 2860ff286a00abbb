"""The censored (Tobit) time-to-loss fit recovers known exponents where dropping the
censored runs does not: synthetic laws with a known censoring fraction."""

from __future__ import annotations

import numpy as np
import pytest
from lartpc.analysis.censored import fit_censored_power_law
from lartpc.analysis.fit import fit_power_law, summarize
from lartpc.analysis.metrics import run_metrics
from lartpc.analysis.runs import load_runs
from synthetic_runs import write_synthetic_study

TRUE_B = -0.7


def _study(seed: int, limit: float):
    """6 runs at each of N = 1..32 with TTL = 3000 N^-0.7 (log-normal sd 0.4), each
    stopped at ``limit`` seconds: the slow, small-N runs are the censored ones."""
    rng = np.random.default_rng(seed)
    n = np.repeat([1.0, 2, 4, 8, 16, 32], 6)
    ttl = 3000 * n ** TRUE_B * np.exp(rng.normal(0, 0.4, n.size))
    cens = ttl > limit
    return n, np.where(cens, limit, ttl), cens, ttl


def test_no_censoring_gives_least_squares():
    n, y, cens, _ = _study(0, limit=1e9)
    assert not cens.any()
    c, ols = fit_censored_power_law(n, y, cens), fit_power_law(n, y, "TTL", n_boot=10)
    assert c.exponent == pytest.approx(ols.exponent, abs=1e-5)
    assert c.prefactor == pytest.approx(ols.prefactor, rel=1e-4)
    # and so are its errors: the t interval, s^2 = RSS / (n - 2), the band's t quantile
    assert c.dof == ols.dof == len(n) - 2
    assert c.exponent_err == pytest.approx(ols.exponent_err, rel=1e-3)
    assert c.exponent_ci95 == pytest.approx(ols.exponent_ci95, abs=1e-4)
    grid = np.array([1.0, 5.0, 64.0])
    for edge_c, edge_ols in zip(c.band(grid), ols.band(grid), strict=True):
        assert edge_c == pytest.approx(edge_ols, rel=1e-3)


def test_a_run_known_only_as_a_bound_never_narrows_the_interval():
    """The same 8 runs, then with the slower run at N = 8 only known to exceed its own
    TTL (less information, as a time limit would leave it): the exponent's interval and
    the band must not get narrower. The asymptotic errors (normal quantile, chi-square
    cutoff) made them ~15 % narrower."""
    rng = np.random.default_rng(5)
    n = np.repeat([1.0, 2, 4, 8], 2)
    for _ in range(20):
        y = 1000 * n ** -0.8 * np.exp(rng.normal(0, 0.3, n.size))
        ols = fit_power_law(n, y, "TTL", n_boot=0)
        cens = np.zeros(n.size, bool)
        eight = np.flatnonzero(n == 8)
        cens[eight[np.argmax(y[eight])]] = True  # the slower at N = 8: a time limit's
        c = fit_censored_power_law(n, y, cens)
        width = c.exponent_ci95[1] - c.exponent_ci95[0]
        assert width >= ols.exponent_ci95[1] - ols.exponent_ci95[0]
        lo_c, hi_c = c.band(np.array([8.0]))
        lo_o, hi_o = ols.band(np.array([8.0]))
        assert hi_c[0] / lo_c[0] >= hi_o[0] / lo_o[0]


def test_censored_fit_covers_the_truth_where_dropping_is_biased():
    """40 studies with 39 % of the runs censored: the censored fit's 95 % interval holds
    the true exponent in about 95 % of them and its mean is unbiased; the fit without
    the censored runs is pulled toward 0 (the fast runs at small N are the ones kept)."""
    kept, got, dropped = [], [], []
    fractions = []
    for seed in range(40):
        n, y, cens, ttl = _study(seed, limit=1200.0)
        fractions.append(cens.mean())
        f = fit_censored_power_law(n, y, cens)
        lo, hi = f.exponent_ci95
        kept.append(lo <= TRUE_B <= hi)
        got.append(f.exponent)
        dropped.append(np.polyfit(np.log(n[~cens]), np.log(ttl[~cens]), 1)[0])
    assert 0.3 < np.mean(fractions) < 0.5
    assert sum(kept) >= 34  # 95 % nominal; 34 of 40 is its binomial 1st percentile
    assert abs(np.mean(got) - TRUE_B) < 0.04
    assert np.mean(dropped) - TRUE_B > 0.1  # the bias the censored fit removes
    assert abs(np.mean(dropped) - TRUE_B) > 3 * abs(np.mean(got) - TRUE_B)


def test_the_note_names_the_interval_only_where_there_is_one(monkeypatch):
    """The fit's note says where its 95 % interval comes from, and that there is none
    where the profile likelihood did not bound the exponent."""
    from lartpc.analysis import censored

    n, y, cens, _ = _study(0, limit=1200.0)
    f = fit_censored_power_law(n, y, cens)
    assert f.exponent_ci95 is not None
    assert f.notes[-1].endswith("95 % interval from the profile likelihood")
    monkeypatch.setattr(censored, "_profile_ci", lambda *args: None)
    f = fit_censored_power_law(n, y, cens)
    assert f.exponent is not None and f.exponent_ci95 is None and f.ci_method is None
    assert f.notes[-1].endswith("no 95 % interval (the profile likelihood did not bound it)")
    assert "interval from the profile likelihood" not in " ".join(f.notes)


def test_all_runs_of_a_count_censored_is_still_bounded():
    n, y, cens, _ = _study(3, limit=1500.0)
    cens = cens | (n == 1)
    f = fit_censored_power_law(n, np.where(n == 1, 1500.0, y), cens)
    lo, hi = f.exponent_ci95
    assert np.isfinite([lo, hi, f.exponent_err]).all() and f.exponent_err > 0
    assert lo < TRUE_B < hi  # bounded, and around the truth (seed 3: -0.73 .. -0.50)


def test_too_few_uncensored_runs_are_said_plainly():
    f = fit_censored_power_law([1, 2, 4], [100.0, 60.0, 40.0], [True, True, False])
    assert f.exponent is None and "three runs that reached the threshold" in f.notes[0]


@pytest.mark.parametrize("n, y, cens", [
    # two runs reached it, at two counts: the line through them has sigma -> 0 (this
    # overflowed in the profile interval before)
    ([8, 16, 4], [100.0, 55.0, 120.0], [False, False, True]),
    # three, but all at one count: the exponent is not bounded (this gave -0.77 +/- 52753)
    ([64, 64, 64, 8, 16, 32], [30.0, 33.0, 31.0, 200.0, 150.0, 90.0],
     [False, False, False, True, True, True]),
])
def test_a_fit_the_runs_cannot_carry_gives_no_exponent(n, y, cens):
    f = fit_censored_power_law(n, y, cens)
    assert f.exponent is None and f.exponent_err is None and f.exponent_ci95 is None
    assert "needs three runs that reached the threshold, at two GPU counts" in f.notes[0]


def test_two_runs_on_one_line_fall_back_to_least_squares_with_a_warning(tmp_path):
    """Three GPU counts, one run each, the smallest censored: the summary says the
    censored fit was not possible and gives the two runs' line, without an error it
    does not have (it printed -0.607 +/- 0.000 [-0.607, -0.607] before)."""
    write_synthetic_study(tmp_path, model="scnet", gpus=[4, 8, 16], seeds=1, rate_c=0.5,
                          rate_b=0.9, ttl_a=20000.0, ttl_b=TRUE_B, dlt_a=10.0,
                          time_limit_s=6000.0, noise=0.0, seed=5, train_events=700)
    rows = [run_metrics(r, smooth=5) for r in load_runs([tmp_path])]
    s = summarize(rows)["scnet"]
    assert s["n_censored"] == 1 and s["ttl_fit_method"] == "least squares"
    assert s["ttl_exponent"] is not None and s["ttl_exponent_err"] is None
    assert s["ttl_exponent_ci95"] is None
    assert any("censored fit was not possible" in w for w in s["warnings"])
    assert any("none enters the TTL fit" in note for note in s["notes"])


def test_fit_on_synthetic_run_folders(tmp_path):
    """The whole path (run folders -> metrics -> summary) with a time limit that stops
    the slow small-N runs: the censored fit holds the true exponent in its interval."""
    write_synthetic_study(tmp_path, model="jishnet", gpus=[1, 2, 4, 8, 16], seeds=4,
                          rate_c=0.5, rate_b=0.9, ttl_a=2400.0, ttl_b=TRUE_B, dlt_a=10.0,
                          time_limit_s=1400.0, noise=0.3, seed=5, train_events=700)
    rows = [run_metrics(r, smooth=5) for r in load_runs([tmp_path])]
    s = summarize(rows)["jishnet"]
    assert s["n_censored"] >= 3 and s["ttl_fit_method"] == "censored"
    lo, hi = s["ttl_exponent_ci95"]
    assert lo <= TRUE_B <= hi
    assert s["ttl_fit_uncensored_only"]["n_points"] == s["n_runs"] - s["n_censored"]


def test_report_figures_show_fit_band_and_censored_runs(tmp_path):
    """`write_curves` draws speedup/efficiency and TTL-vs-N for each model (the report
    embeds them); the TTL figure's band comes from the censored fit's covariance."""
    from lartpc.analysis.report import write_curves
    from lartpc.analysis.tables import analyse

    write_synthetic_study(tmp_path / "runs", model="jishnet", gpus=[1, 2, 4], seeds=2,
                          rate_c=0.5, rate_b=0.9, ttl_a=1500.0, ttl_b=TRUE_B, dlt_a=10.0,
                          time_limit_s=1400.0, noise=0.3, seed=1, train_events=700)
    a = analyse([tmp_path / "runs"], 1.2, 5, False)
    s = a.models["jishnet"]
    assert s["ttl_fit"]["cov_log_a_b"] is not None
    made = write_curves(a, tmp_path / "fig")["jishnet"]
    assert [p.name for p in made] == ["loss_jishnet.png", "epoch_rate_jishnet.png",
                                      "speedup_jishnet.png", "ttl_jishnet.png"]
    assert all(p.stat().st_size > 10_000 for p in made)
