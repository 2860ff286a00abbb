"""Issue 37 in the analysis: TTL and the epoch rate on the training clock (the steps'
own time) by default, the wall clock on request, and censoring at the study budget."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from lartpc.analysis.metrics import primary_steps, run_metrics
from lartpc.analysis.runs import load_runs
from lartpc.analysis.tables import analyse, gpus_text, to_text
from synthetic_runs import write_synthetic_run


def _run(tmp_path, eval_share: float = 0.0, **meta):
    """A synthetic run (TTL 2000 s, DLT 30 s) whose steps spend ``eval_share`` of each
    interval outside themselves (evaluation, checkpoints), with run.json ``meta``."""
    folder = write_synthetic_run(tmp_path / "run", model="jishnet", world_size=2,
                                 epoch_rate_per_min=1.0, ttl_s=2000, dlt_s=30,
                                 time_limit_s=4000)
    for f in folder.glob("rank-*.csv"):
        df = pd.read_csv(f)
        for c in ("data_s", "compute_s", "comm_s"):
            df[c] = df[c] * (1 - eval_share)
        df.to_csv(f, index=False)
    info = json.loads((folder / "run.json").read_text())
    info.update(meta)
    (folder / "run.json").write_text(json.dumps(info))
    return load_runs([folder])[0]


def test_training_clock_leaves_evaluation_out(tmp_path):
    run = _run(tmp_path, eval_share=0.25)
    train, wall = run_metrics(run), run_metrics(run, clock="wall")
    assert train.clock == "train" and wall.clock == "wall"
    assert wall.ttl_s == pytest.approx(2000, rel=0.1)
    assert train.ttl_wall_s == pytest.approx(wall.ttl_s)
    # a quarter of every step interval was spent outside the steps
    assert train.ttl_s - train.dlt_s == pytest.approx(0.75 * (wall.ttl_s - wall.dlt_s),
                                                      rel=1e-3)
    assert train.epoch_rate_per_min == pytest.approx(wall.epoch_rate_per_min / 0.75,
                                                     rel=1e-3)


def test_budget_censors_a_run_that_gets_there_later(tmp_path):
    run = _run(tmp_path, budget_s=1000.0, budget_spent=True, train_time_s=1000.0,
               eval_time_s=12.0, checkpoint_time_s=3.0)
    m = run_metrics(run)
    assert m.ttl_s is None and m.ttl_censored
    steps = primary_steps(run)
    d = steps[["data_s", "compute_s", "comm_s"]].to_numpy().sum(axis=1)
    last = np.flatnonzero(np.cumsum(d) <= 1000.0)[-1]
    # the last step within the budget with a centred mean of steps within it
    seen = last - (m.smooth_window - 1) // 2
    assert m.smooth_window > 2 and seen < last
    assert m.ttl_lower_bound_s == pytest.approx(m.dlt_s + np.cumsum(d)[seen] - d[0])
    assert any("only after its budget" in n for n in m.notes)
    # a budget past the crossing changes nothing
    m2 = run_metrics(_run(tmp_path / "b", budget_s=3000.0))
    assert m2.ttl_s == pytest.approx(2000, rel=0.1) and not m2.ttl_censored
    # the report shows both clocks and the time spent apart
    text = to_text(analyse([run.path]))
    assert "training clock" in text and "TTL wall" in text and "12+3" in text


def test_run_folder_without_durations_uses_the_wall_clock(tmp_path):
    run = _run(tmp_path)
    for f in run.path.glob("rank-*.csv"):
        df = pd.read_csv(f)
        df["comm_s"] = np.nan  # not measured
        df.to_csv(f, index=False, na_rep="nan")
    run = load_runs([run.path])[0]
    m = run_metrics(run)
    assert m.clock == "wall" and m.ttl_s == pytest.approx(2000, rel=0.1)
    assert m.budget_s is None and m.eval_time_s is None
    assert any("step durations missing" in n for n in m.notes)


def test_a_budget_shorter_than_the_first_step_bounds_the_ttl_by_itself(tmp_path):
    """No step fits the budget: the run is censored where the budget ran out, inside
    its first step, not at its last step (far past the budget, as before)."""
    run = _run(tmp_path, budget_s=0.01)
    d = primary_steps(run)[["data_s", "compute_s", "comm_s"]].to_numpy().sum(axis=1)
    assert d[0] > 0.01
    m = run_metrics(run)
    assert m.ttl_censored and m.ttl_lower_bound_s == pytest.approx(m.dlt_s - d[0] + 0.01)


def test_the_loss_plots_ttl_marker_sits_where_its_curve_crosses(tmp_path, monkeypatch):
    """The curves are drawn on the time since the job's start; the TTL marker with them,
    not at ttl_s (the training clock, here 25 % shorter)."""
    from lartpc.analysis import plots
    from lartpc.analysis.fit import PowerLawFit

    run = _run(tmp_path, eval_share=0.25)
    m = run_metrics(run)
    assert m.ttl_s < 0.85 * m.ttl_wall_s
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: figures.append(fig) or out)
    plots.loss_curves([run], [m], PowerLawFit("TTL", 1, [2]), "jishnet", 1.2,
                      tmp_path / "loss.png")
    (fig,) = figures
    markers = [line for ax in fig.axes for line in ax.get_lines()
               if line.get_marker() == "o" and len(line.get_xdata()) == 1]
    assert len(markers) == 1
    x_min = markers[0].get_xdata()[0]
    steps = primary_steps(run)
    step_min = np.diff(steps["time"].to_numpy()).mean() / 60
    # no requeue: the crossing on the job's time is the wall-clock TTL
    assert x_min == pytest.approx(m.ttl_wall_s / 60, abs=step_min)
    assert abs(x_min - m.ttl_s / 60) > 100 * step_min


def test_the_loss_plot_counts_ranks_in_its_legend_and_inset(tmp_path, monkeypatch):
    """On CPU ranks the legend and the inset's axis count ranks; the time unit (min or
    h) stays the time axis's own (both once shared one name: the legend read "1 min")."""
    from lartpc.analysis import plots
    from lartpc.analysis.fit import PowerLawFit

    run = _run(tmp_path)
    m = run_metrics(run)
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: figures.append(fig) or out)
    plots.loss_curves([run], [m], PowerLawFit("TTL", 1, [2]), "jishnet", 1.2,
                      tmp_path / "loss.png", "rank")
    (fig,) = figures
    (main,) = fig.axes
    (inset,) = main.child_axes
    n = run.world_size
    assert [t.get_text() for t in main.get_legend().get_texts()][0] == \
        gpus_text(n, "rank") == f"{n} rank" + ("" if n == 1 else "s")
    assert inset.get_xlabel() == "ranks"
    assert main.get_xlabel().startswith("wall time since job start (min;")


def _with_loss(run, loss) -> object:
    """``run`` again with every rank's ``global_loss`` set by ``loss(step_index)``."""
    for f in run.path.glob("rank-*.csv"):
        df = pd.read_csv(f)
        df["global_loss"] = [loss(i) for i in range(len(df))]
        df.to_csv(f, index=False)
    return load_runs([run.path])[0]


def test_a_censored_runs_bound_and_its_budget_read_no_step_it_did_not_take(tmp_path):
    """The smoothed loss is a centred mean over 10 steps, so its last value is 4 steps
    before a run's last step. A run above the threshold throughout is known to need
    longer than the clock at that value, not at its last step. With a budget, a
    loss that falls just after the budget must not pull the mean at the budget's last
    steps below the threshold: the run is censored, as one stopped at the budget."""
    run = _with_loss(_run(tmp_path / "flat"), lambda i: 1.5)
    m = run_metrics(run, smooth=10)
    steps = primary_steps(run)
    d = steps[["data_s", "compute_s", "comm_s"]].to_numpy().sum(axis=1)
    clock = m.dlt_s + np.cumsum(d) - d[0]
    assert m.ttl_censored and m.ttl_lower_bound_s == pytest.approx(clock[len(d) - 1 - 4])

    k = len(d) // 2  # the budget's last step
    budget = float(np.cumsum(d)[k])
    run = _with_loss(_run(tmp_path / "late", budget_s=budget), lambda i: 1.5 if i <= k else 0.05)
    m = run_metrics(run, smooth=10)
    assert m.ttl_s is None and m.ttl_censored, m.ttl_s
    assert m.ttl_lower_bound_s == pytest.approx(clock[k - 4])
    assert any("only after its budget" in n for n in m.notes)
