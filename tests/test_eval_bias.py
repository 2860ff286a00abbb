"""jobs/local/eval_bias.py's summary (issue 37's BENCHMARKS numbers): medians and the
wall/train ratios of each cadence, recomputed from the committed raw runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lartpc.jobs.local.eval_bias import summarise

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "issue37-eval-bias.json"


def _run(rate_train, rate_wall, ttl_train, ttl_wall, **kw):
    return {"evaluations": 6, "wall_s": 50.0, "train_time_s": 36.0, "eval_time_s": 4.0,
            "checkpoint_time_s": 1.0, "epoch_rate_per_min_train": rate_train,
            "epoch_rate_per_min_wall": rate_wall, "ttl_s_train": ttl_train,
            "ttl_s_wall": ttl_wall, **kw}


def test_ratios_are_medians_of_each_runs_own():
    s = summarise([_run(10, 9, 30, 33), _run(12, 10.8, 20, 21), _run(8, 8, 40, 48)])
    assert s["epoch_rate_wall_over_train"] == pytest.approx(0.9)
    assert s["ttl_wall_over_train"] == pytest.approx(1.1)
    assert s["epoch_rate_per_min_train"] == 10 and s["ttl_s_wall"] == 33
    assert s["eval_checkpoint_share_of_wall"] == pytest.approx(0.1)


def test_a_censored_ttl_leaves_the_ttl_medians_unknown():
    s = summarise([_run(10, 9, 30, 33), _run(12, 10.8, None, None)])
    assert s["ttl_s_train"] is None and s["ttl_wall_over_train"] is None
    assert s["epoch_rate_wall_over_train"] == pytest.approx(0.9)


def test_committed_summary_follows_from_its_runs():
    d = json.loads(RESULTS.read_text())
    assert set(d["summary_median"]) == {"epoch", "images"} and d["setup"]["repeats"] >= 3
    for name, want in d["summary_median"].items():
        mine = [x for x in d["runs"] if x["cadence"] == name]
        assert len(mine) == d["setup"]["repeats"]
        assert summarise(mine) == pytest.approx(want)
    # the bias is measured: evaluation in the window slows the wall-clock epoch rate
    assert d["summary_median"]["epoch"]["epoch_rate_wall_over_train"] < 1
