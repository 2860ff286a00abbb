"""Issue 37 in the analysis: TTL and the epoch rate on the training clock (the steps'
own time) by default, the wall clock on request, and censoring at the study budget."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from lartpc.analysis.metrics import primary_steps, run_metrics
from lartpc.analysis.runs import load_runs
from lartpc.analysis.tables import analyse, to_text
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
    assert m.ttl_lower_bound_s == pytest.approx(m.dlt_s + np.cumsum(d)[last] - d[0])
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
