"""Issue 37: the study's budget per point (train.budget_s, training time over every
segment) and training time kept apart from evaluation and checkpoints."""

from __future__ import annotations

import json
import math

import pytest
from train_helpers import rows, run, torchrun_train_cmd, train_cmd

pytestmark = pytest.mark.slow


def _info(out) -> dict:
    return json.loads((out / "run.json").read_text())


def test_training_time_excludes_evaluation_and_checkpoints(train_events_dir, tmp_path):
    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out))
    assert r.returncode == 0, r.stderr
    info = _info(out)
    steps = rows(out / "rank-000.csv")
    # training time is exactly the steps' own time, as the rank log splits it
    step_sum = sum(float(x["data_s"]) + float(x["compute_s"]) + float(x["comm_s"])
                   for x in steps)
    assert info["train_time_s"] == pytest.approx(step_sum, rel=1e-9)
    # two evaluations and checkpoints were made, and counted apart from it
    assert len((out / "eval.csv").read_text().splitlines()) == 3
    assert info["eval_time_s"] > 0 and info["checkpoint_time_s"] > 0
    wall = info["end_time"] - info["start_time"]
    assert info["train_time_s"] + info["eval_time_s"] + info["checkpoint_time_s"] <= wall
    assert info["budget_s"] == 14400.0 and info["budget_spent"] is False


def test_budget_ends_the_run_and_a_resume_does_nothing(train_events_dir, tmp_path):
    out = tmp_path / "run"
    cmd = train_cmd(train_events_dir, out, "train.epochs=5", "train.budget_s=1e-9")
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    info = _info(out)
    assert info["status"] == "time_limit" and info["budget_spent"] is True
    # the first step reaches the budget: the run stops after it
    assert len(rows(out / "rank-000.csv")) == 1 and info["train_time_s"] >= 1e-9
    assert info["segments"][-1]["settings"]["train.budget_s"] == 1e-9
    before = (out / "rank-000.csv").read_bytes()
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    assert "has spent its budget" in r.stderr
    assert (out / "rank-000.csv").read_bytes() == before
    # a larger budget on resume trains on
    r = run([*cmd, "--set", "train.budget_s=inf", "--set", "train.epochs=1"])
    assert r.returncode == 0, r.stderr
    info = _info(out)
    assert info["budget_spent"] is False and math.isinf(info["budget_s"])


def _steps_s(log: list[dict]) -> list[float]:
    return [float(x["data_s"]) + float(x["compute_s"]) + float(x["comm_s"]) for x in log]


def test_two_ranks_stop_together_at_rank_0s_first_step_past_the_budget(train_events_dir,
                                                                        tmp_path):
    """Two torchrun ranks: the budget is judged on rank 0's clock (the training time
    its checkpoint holds) and both ranks stop after the same step, the first whose
    time takes rank 0's total to the budget."""
    out, budget = tmp_path / "run", 1.0
    cmd = torchrun_train_cmd(train_events_dir, out, "train.epochs=1000",
                             f"train.budget_s={budget}")
    r = run(cmd, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = _info(out)
    assert info["status"] == "time_limit" and info["budget_spent"] is True
    log0, log1 = rows(out / "rank-000.csv"), rows(out / "rank-001.csv")
    assert len(log0) == len(log1) >= 1
    own = _steps_s(log0)
    assert info["train_time_s"] == pytest.approx(sum(own), rel=1e-9)
    # rank 0 judges a step before the vote's allreduce, which its comm_s then counts:
    # the step before the last was short of the budget without that exchange
    before = sum(own[:-1]) - (float(log0[-2]["comm_s"]) if len(log0) >= 2 else 0.0)
    assert sum(own) >= budget > before
    assert "study budget reached" in r.stderr
