"""The report at the edges of what runs can show: no epoch rate at the smallest N or at
all, CPU ranks, a diverged run, a requeued run, runs longer than their TTL; the figures
and the text say what the numbers are relative to, in the runs' own units."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from lartpc.analysis import plots, scaling_plots
from lartpc.analysis.fit import PowerLawFit
from lartpc.analysis.glance import shared_host
from lartpc.analysis.metrics import run_metrics
from lartpc.analysis.report import write_curves, write_report
from lartpc.analysis.runs import load_runs
from lartpc.analysis.tables import analyse, to_text
from synthetic_runs import requeue, write_synthetic_run, write_synthetic_study


def _run(folder: Path, n: int, rate: float, ttl: float, limit: float, *, steps: int | None = None,
         dlt: float = 30.0, **meta) -> Path:
    """A synthetic scnet run at ``n`` ranks, cut to its first ``steps`` steps, with
    run.json ``meta``."""
    write_synthetic_run(folder, model="scnet", world_size=n, epoch_rate_per_min=rate,
                        ttl_s=ttl, dlt_s=dlt, time_limit_s=limit, train_events=700)
    if steps is not None:
        for csv in folder.glob("rank-*.csv"):
            csv.write_text("".join(csv.read_text().splitlines(True)[:steps + 1]))
    info = json.loads((folder / "run.json").read_text())
    info.update(meta)
    (folder / "run.json").write_text(json.dumps(info))
    return folder


@pytest.fixture
def figures(monkeypatch):
    """The figures the plotting functions make, by file name, instead of PNGs."""
    made: dict[str, plt.Figure] = {}

    def keep(fig, out):
        made[Path(out).name] = fig
        return out

    monkeypatch.setattr(plots, "save_figure", keep)
    monkeypatch.setattr(scaling_plots, "save_figure", keep)
    yield made
    for fig in made.values():
        plt.close(fig)


def _labels(ax: plt.Axes) -> list[str]:
    return [h.get_label() for h in ax.get_lines() + ax.collections
            if not h.get_label().startswith("_")]


def _texts(ax: plt.Axes) -> str:
    return " ".join(t.get_text() for t in ax.texts)


@pytest.fixture(scope="module")
def no_rate_at_one(tmp_path_factory) -> Path:
    """scnet on CPU ranks sharing a 2-core host: N = 1 logged one step (no epoch rate),
    N = 2 and 4 ran normally, so speedups start at N = 2."""
    root = tmp_path_factory.mktemp("no-rate-at-one")
    for n, rate, ttl in ((1, 1.0, 1500.0), (2, 1.9, 900.0), (4, 3.6, 500.0)):
        _run(root / f"scnet-n{n}", n, rate, ttl, 1000.0, steps=1 if n == 1 else None,
             device="cpu", local_size=n, host_cpus=2)
    return root


def test_speedup_figure_is_relative_to_the_smallest_n_with_an_epoch_rate(no_rate_at_one,
                                                                         tmp_path, figures):
    a = analyse([no_rate_at_one])
    assert a.models["scnet"]["baseline_gpus"] == 2
    write_curves(a, tmp_path)
    ax_s = figures["speedup_scnet.png"].axes[0]
    assert ax_s.get_ylabel() == "speedup over N = 2"
    (ideal,) = [line for line in ax_s.get_lines() if line.get_label().startswith("ideal")]
    assert ideal.get_label() == "ideal (N / 2)"
    assert np.interp(2.0, ideal.get_xdata(), ideal.get_ydata()) == pytest.approx(1.0)
    # the TTL speedups start at N = 2 too: nothing to say about their baseline
    assert _labels(ax_s)[1:] == ["epoch rate", "time to loss"]


def test_glance_quotes_no_ratio_to_one_rank_where_speedups_start_later(no_rate_at_one):
    (line,) = shared_host(analyse([no_rate_at_one]))
    assert line.startswith("scnet: the 2-rank runs ran on one host with 2 cores")
    assert "1-rank" not in line and "x the" not in line


def test_glance_ratio_keeps_three_significant_figures(tmp_path):
    _run(tmp_path / "scnet-n1", 1, 1.0, 500.0, 600.0)
    _run(tmp_path / "scnet-n2", 2, 0.0016, 3000.0, 4000.0, local_size=2, host_cpus=2)
    a = analyse([tmp_path])
    row = a.models["scnet"]["scaling"][1]
    assert row["speedup"] == pytest.approx(0.0016, rel=2e-3)
    (line,) = shared_host(a)
    assert f"(its 2-rank epoch rate is {row['speedup']:.3g}x the 1-rank one)" in line
    assert "0.0016x" in line


def test_text_counts_ranks_on_cpu_and_says_where_speedups_start(no_rate_at_one):
    text = to_text(analyse([no_rate_at_one]))
    assert "img/s/rank" in text and "img/s/GPU" not in text
    assert "== scnet: 3 runs, N = [1, 2, 4]" in text
    assert "scaling relative to N0 = 2 ranks:" in text


def test_one_run_is_one_run(tmp_path):
    folder = _run(tmp_path / "runs" / "scnet-n1", 1, 1.0, 500.0, 600.0)
    a = analyse([folder])
    assert "== scnet: 1 run, N = [1]" in to_text(a)
    assert "scaling relative to N0 = 1 GPU:" in to_text(a)
    html = write_report(a, tmp_path / "rep").read_text()
    assert "<h1>LArTPC scaling study: 1 run</h1>" in html


@pytest.fixture(scope="module")
def no_rate(tmp_path_factory) -> Path:
    """Two runs that logged one step each: no epoch rate anywhere."""
    root = tmp_path_factory.mktemp("no-rate")
    for n in (1, 2):
        _run(root / f"scnet-n{n}", n, 1.0, 1500.0, 2000.0, steps=1)
    return root


def test_no_epoch_rate_is_said_not_drawn(no_rate, tmp_path, figures):
    a = analyse([no_rate])
    assert a.models["scnet"]["baseline_gpus"] is None
    text = to_text(a)
    assert "None" not in text
    assert ("scaling: no run has an epoch rate (each logged fewer than 2 steps), so no "
            "speedups:") in text
    write_curves(a, tmp_path)
    (ax,) = figures["epoch_rate_scnet.png"].axes
    assert ax.get_lines() == [] and ax.get_legend() is None
    assert "no epoch rate in these runs" in _texts(ax)
    assert ax.get_yscale() == "linear" and list(ax.get_yticks()) == []
    for ax in figures["speedup_scnet.png"].axes:
        assert ax.get_lines() == [] and "no speedups" in _texts(ax)


def test_report_without_an_epoch_rate_says_so(no_rate, tmp_path):
    html = write_report(analyse([no_rate]), tmp_path).read_text()
    assert "N0 = None" not in html
    assert "<h3>Scaling: no run has an epoch rate" in html


def test_runs_without_a_time_to_loss_or_bound_are_said(tmp_path, figures):
    """Runs that logged no step and recorded no end: nothing for the TTL figures."""
    for n in (1, 2):
        folder = _run(tmp_path / "runs" / f"scnet-n{n}", n, 1.0, 1500.0, 2000.0, steps=0)
        info = json.loads((folder / "run.json").read_text())
        del info["end_time"]
        (folder / "run.json").write_text(json.dumps(info))
    a = analyse([tmp_path / "runs"])
    assert all(m.ttl_s is None and m.ttl_lower_bound_s is None for m in a.rows)
    write_curves(a, tmp_path / "fig")
    (ax,) = figures["ttl_scnet.png"].axes
    assert ax.get_lines() == [] and "no run has a time to loss" in _texts(ax)
    (inset,) = figures["loss_scnet.png"].axes[0].child_axes
    assert inset.get_lines() == [] and "no run has a time to loss" in _texts(inset)


@pytest.fixture(scope="module")
def with_diverged(tmp_path_factory) -> Path:
    """Runs at N = 1, 2, 4 that reached the threshold and one at N = 1 that diverged
    (stopped early above it): its stop is no lower bound, so no censored fit."""
    root = tmp_path_factory.mktemp("diverged")
    for n, rate, ttl in ((1, 1.0, 1500.0), (2, 1.9, 900.0), (4, 3.6, 500.0), (4, 3.6, 520.0)):
        _run(root / f"scnet-n{n}-{ttl:.0f}", n, rate, ttl, 1700.0)
    _run(root / "scnet-n1-diverged", 1, 1.0, 1500.0, 400.0, status="diverged")
    return root


def test_a_diverged_run_is_drawn_as_diverged_not_as_a_bound(with_diverged, tmp_path,
                                                             figures):
    a = analyse([with_diverged])
    s = a.models["scnet"]
    assert s["n_censored"] == 1 and s["ttl_fit_method"] == "least squares"
    write_curves(a, tmp_path)
    (ax,) = figures["ttl_scnet.png"].axes
    (inset,) = figures["loss_scnet.png"].axes[0].child_axes
    for axes in (ax, inset):
        labels = _labels(axes)
        assert "diverged: stopped here (no bound)" in labels
        assert not any("censored" in label for label in labels), labels
    (point,) = [line for line in ax.get_lines() if line.get_label().startswith("diverged")]
    diverged = next(m for m in a.rows if m.status == "diverged")
    assert list(point.get_xdata()) == [1]
    assert list(point.get_ydata()) == [pytest.approx(diverged.ttl_lower_bound_s)]


def test_the_fit_without_censored_runs_is_drawn_where_the_censored_fit_made_the_law(
        tmp_path, figures):
    write_synthetic_study(tmp_path / "runs", model="jishnet", gpus=[1, 2, 4], seeds=2,
                          rate_c=0.5, rate_b=0.9, ttl_a=1500.0, ttl_b=-0.7, dlt_a=10.0,
                          time_limit_s=1400.0, noise=0.3, seed=1, train_events=700)
    a = analyse([tmp_path / "runs"], 1.2, 5)
    assert a.models["jishnet"]["ttl_fit_method"] == "censored"
    write_curves(a, tmp_path / "fig")
    labels = _labels(figures["ttl_jishnet.png"].axes[0])
    assert "censored: TTL > its run time" in labels
    assert sum(label.endswith("(censored dropped)") for label in labels) == 1


def test_loss_axis_unit_comes_from_the_time_drawn(tmp_path, figures):
    """A 5 h run that reached the threshold after 1000 s: the curves run for 5 h, so the
    axis reads hours; the inset's TTL its own minutes."""
    run = load_runs([_run(tmp_path / "run", 1, 0.1, 1000.0, 5 * 3600.0)])[0]
    m = run_metrics(run)
    assert m.ttl_s < 1200
    plots.loss_curves([run], [m], PowerLawFit("TTL", 1, [1]), "scnet", 1.2,
                      tmp_path / "loss.png")
    main = figures["loss.png"].axes[0]
    assert main.get_xlabel().startswith("wall time since job start (h;")
    x_end = max(np.nanmax(line.get_xdata()) for line in main.get_lines()
                if len(line.get_xdata()) > 2)
    assert x_end == pytest.approx(5.0, abs=0.01)
    (inset,) = main.child_axes
    assert inset.get_ylabel().startswith("TTL(1.2) (min,")


def test_loss_curve_breaks_across_a_requeue(tmp_path, figures):
    folder = _run(tmp_path / "run", 1, 0.5, 200.0, 300.0, dlt=20.0)
    after, shift = requeue(folder, after=40, wait_s=5000.0, restart_s=3.0, skew_s=0.0)
    run = load_runs([folder])[0]
    plots.loss_curves([run], [run_metrics(run)], PowerLawFit("TTL", 1, [1]), "scnet", 1.2,
                      tmp_path / "loss.png")
    curves = [line for line in figures["loss.png"].axes[0].get_lines()
              if len(line.get_xdata()) > 2]
    assert len(curves) == 2  # raw and smoothed
    for line in curves:
        x = np.asarray(line.get_xdata(), dtype=float)
        (gap,) = np.flatnonzero(np.isnan(x))
        assert gap == after  # between the first job's last step and the second's first
        assert (x[gap + 1] - x[gap - 1]) * 60 == pytest.approx(shift + 60 / (0.5 * 100),
                                                                abs=0.01)
        assert not math.isnan(x[0]) and not math.isnan(x[-1])
