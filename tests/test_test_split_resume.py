"""A run with a test split (``data.test_fraction``, issue 39) resumes exactly, and
refuses to resume under another test share (the training events would change)."""

from __future__ import annotations

import json

from train_helpers import rows, run, train_cmd

SPLIT = "data.test_fraction=0.2"


def test_resumed_run_with_a_test_split_equals_an_uninterrupted_one(train_events_dir, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = run(train_cmd(train_events_dir, whole, SPLIT))
    assert r.returncode == 0, r.stderr
    r = run(train_cmd(train_events_dir, cut, SPLIT, "train.epochs=1"))
    assert r.returncode == 0, r.stderr
    other = run(train_cmd(train_events_dir, cut, "data.test_fraction=0.1"))
    assert other.returncode == 2, other.stderr
    assert "checkpoint has data.test_fraction=0.2, config says 0.1" in other.stderr
    r = run(train_cmd(train_events_dir, cut, SPLIT))
    assert r.returncode == 0, r.stderr
    assert "resuming at epoch" in r.stderr
    keys = ("epoch", "batchno", "local_loss", "local_acc")
    a, b = rows(whole / "rank-000.csv"), rows(cut / "rank-000.csv")
    assert len(a) == len(b) > 0
    assert [{k: x[k] for k in keys} for x in a] == [{k: x[k] for k in keys} for x in b]
    record = json.loads((cut / "run.json").read_text())
    # 70 events, 14 per class: 3 per class for validation, 3 for test, 8 trained on
    assert (record["train_events"], record["eval_events"], record["test_events"]) == (40, 15, 15)
