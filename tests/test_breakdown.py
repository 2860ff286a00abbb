"""`python -m lartpc.jobs.local.breakdown`: a run's held-out predictions rebuilt from its
checkpoint and split by the generator's truth."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from train_helpers import clean_env, run, train_cmd

from lartpc.data import EventStore
from lartpc.sim.limits import event_masks, truth_limits

ROOT = Path(__file__).resolve().parents[1]


def _breakdown(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc.jobs.local.breakdown", *map(str, argv)],
                          capture_output=True, text=True, timeout=300, env=clean_env(), cwd=ROOT)


@pytest.fixture(scope="module")
def trained(train_events_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bd") / "run"
    r = run(train_cmd(train_events_dir, out, config="tiny-scnet"))
    assert r.returncode == 0, r.stderr
    return out


def test_event_masks_are_the_truth_limits_event_by_event(train_events_dir):
    store = EventStore(train_events_dir)
    masks, lim = event_masks(store), truth_limits(store)
    labels = np.asarray(store.labels)
    for i, c in enumerate(lim["classes"].values()):
        m = labels == i
        assert c["indistinguishable"] == pytest.approx(masks["indistinguishable"][m].mean())
        assert c["exit_without_interaction"] == pytest.approx(masks["exit"][m].mean())
    assert masks["indistinguishable"].any() and masks["exit"].any()  # real events, both kinds


@pytest.mark.slow
def test_predictions_reproduce_the_runs_evaluation_and_split_by_truth(trained,
                                                                      train_events_dir,
                                                                      tmp_path):
    out = tmp_path / "bd.json"
    r = _breakdown(trained, train_events_dir, "--json", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert "classifiable" in r.stdout and "MIP stubs" in r.stdout
    # the checkpoint's predictions are the run's last evaluation, event for event
    assert res["matches_run_confusion"] is True
    assert res["events"] == json.loads((trained / "run.json").read_text())["eval_events"]
    cm = np.array(res["confusion"])
    assert res["accuracy"] == pytest.approx(np.trace(cm) / cm.sum())
    for i, c in enumerate(res["per_class"].values()):
        parts = (c["classifiable"], c["indistinguishable"])
        assert c["events"] == cm[i].sum() == sum(p["events"] for p in parts)
        right = sum(p["events"] * (p["accuracy"] or 0) for p in parts)
        assert right == pytest.approx(cm[i, i])
        for part in parts:  # what each part was called: its row of the matrix, split
            if part["events"]:
                assert sum(part["called"].values()) == pytest.approx(1)
        assert sum(p["events"] * np.array(list(p["called"].values()))
                   for p in parts if p["events"]) == pytest.approx(cm[i])
    assert sum(r["events"] for r in res["electron_gamma_by_dy"]) == cm[:2].sum()


@pytest.mark.slow
def test_refuses_another_store_and_a_run_without_checkpoint(trained, events_dir, tmp_path):
    r = _breakdown(trained, events_dir)
    assert r.returncode == 2 and str(events_dir) in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "empty-run"
    shutil.copytree(trained, empty, ignore=shutil.ignore_patterns("checkpoint.pt"))
    r = _breakdown(empty, events_dir)
    assert r.returncode == 2 and "no weights.pt or checkpoint.pt" in r.stderr
