"""``python -m lartpc.analysis`` on real ``lartpc train`` output: an uninterrupted run, the
same run killed and requeued (two job segments with a queue wait), and a job that died
in set-up, side by side in one study tree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from lartpc.analysis.runcheck import CLOCK_TOL_S
from train_helpers import kill_after_steps, rows, run, train_cmd

SETS = ("train.checkpoint_every_steps=2", "train.epochs=3")
QUEUE_WAIT_S = 2.0  # the requeued job waits this long before it starts again


def _analysis(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc.analysis", *args], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def study(train_events_dir, tmp_path_factory):
    """<root>/ref (uninterrupted), <root>/requeued (killed after a checkpoint, restarted
    QUEUE_WAIT_S later), <root>/setup-failed; and `curves` run on the killed folder."""
    root = tmp_path_factory.mktemp("study")
    ref, cut = root / "ref", root / "requeued"
    r = run(train_cmd(train_events_dir, ref, *SETS))
    assert r.returncode == 0, r.stderr
    kill_after_steps(train_cmd(train_events_dir, cut, *SETS), cut, 11)  # mid-epoch 1,
    # after a checkpoint
    assert json.loads((cut / "run.json").read_text())["status"] == "running"
    # what any reader sees of a run still being written (status running, no end)
    running = _analysis("curves", str(cut), "--out", str(root.parent / "curves-running"))
    time.sleep(QUEUE_WAIT_S)
    r = run(train_cmd(train_events_dir, cut, *SETS))
    assert r.returncode == 0, r.stderr
    # a job that died in set-up leaves run.json without steps_per_epoch and no steps
    dead = root / "setup-failed"
    dead.mkdir()
    meta = json.loads((ref / "run.json").read_text())
    for key in ("steps_per_epoch", "train_events", "eval_events", "loader"):
        meta.pop(key, None)
    meta.update(status="failed", segments=[dict(meta["segments"][0])])
    (dead / "run.json").write_text(json.dumps(meta))
    return root, running


@pytest.mark.slow
def test_running_folder_draws_curves(study):
    root, running = study
    assert running.returncode == 0, running.stderr
    made = sorted(Path(p).name for p in running.stdout.split())
    assert made == ["epoch_rate_jishnet.png", "loss_jishnet.png", "speedup_jishnet.png",
                    "ttl_jishnet.png"]


@pytest.mark.slow
def test_requeued_and_failed_runs_in_one_study(study):
    root, _ = study
    # the wall clock: evaluation, checkpoints and restarts between the steps handled below
    res = _analysis("fit", str(root), "--json", "--threshold", "0", "--clock", "wall")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["skipped"]) == 1 and doc["clock"] == "wall"
    assert doc["skipped"][0].startswith(str(root / "setup-failed" / "run.json"))
    assert "never started training" in doc["skipped"][0]
    by_name = {r["name"]: r for r in doc["runs"]}
    assert sorted(by_name) == ["ref", "requeued"]
    spe = json.loads((root / "ref" / "run.json").read_text())["steps_per_epoch"]
    meta = json.loads((root / "requeued" / "run.json").read_text())
    assert len(meta["segments"]) == 2 and meta["status"] == "completed"
    t = {n: np.array([float(x["time"]) for x in rows(root / n / "rank-000.csv")])
         for n in by_name}
    for name, m in by_name.items():
        assert m["n_steps"] == len(t[name]) == 3 * spe, name  # no step counted twice
    assert by_name["ref"]["notes"] == []
    # uninterrupted: every interval is a step
    ref, tr = by_name["ref"], t["ref"]
    assert ref["queue_wait_s"] == 0.0
    assert ref["epoch_rate_per_min"] == pytest.approx(
        (len(tr) - 1) / spe / ((tr[-1] - tr[0]) / 60), rel=1e-9)
    # requeued: the interval holding the restart (the longest; it holds a whole process
    # start-up and the wait) is neither a step nor training time
    req, tq = by_name["requeued"], t["requeued"]
    gaps = np.diff(tq)
    assert gaps.max() > QUEUE_WAIT_S
    assert req["epoch_rate_per_min"] == pytest.approx(
        (len(tq) - 2) / spe / ((tq[-1] - tq[0] - gaps.max()) / 60), rel=1e-9)
    # the wait lies inside that interval, at least the sleep less the start-time skew
    assert QUEUE_WAIT_S - CLOCK_TOL_S <= req["queue_wait_s"] < gaps.max()
    # TTL (censored at threshold 0) counts the run's own wall time, not the wait
    start = meta["start_time"]
    assert req["ttl_censored"]
    assert req["ttl_lower_bound_s"] == pytest.approx(tq[-1] - start - req["queue_wait_s"],
                                                     abs=1e-6)
    assert req["notes"] == [f"requeued: 1 restart(s); {req['queue_wait_s']:.0f} s waiting "
                            "between job segments excluded from TTL"]
    # the training clock (the default): the steps' own durations, whichever job ran them
    res = _analysis("fit", str(root), "--json", "--threshold", "0")
    train = {r["name"]: r for r in json.loads(res.stdout)["runs"]}
    for name in ("ref", "requeued"):
        d = [float(x["data_s"]) + float(x["compute_s"]) + float(x["comm_s"])
             for x in rows(root / name / "rank-000.csv")]
        assert train[name]["clock"] == "train"
        assert train[name]["epoch_rate_per_min"] == pytest.approx(
            (len(d) - 1) / spe / (sum(d[1:]) / 60), rel=1e-9)
        if name == "ref":
            assert train[name]["epoch_rate_per_min"] > by_name[name]["epoch_rate_per_min"]
        else:
            # each step lies inside the interval before its row; the wall clock leaves
            # out the restart's interval, which holds the first step after it: the other
            # steps' time fits in the wall time it counts (the two rates' order is the
            # machine's: that first step, a warm-up, may be long or short)
            i_r = int(np.argmax(gaps)) + 1
            assert sum(d[1:]) - d[i_r] <= tq[-1] - tq[0] - gaps.max() + 1e-3


@pytest.mark.slow
def test_report_on_real_runs_names_the_dead_job(study, tmp_path):
    root, _ = study
    out = tmp_path / "rep"
    res = _analysis("report", str(root), "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = (out / "report.html").read_text()
    assert "setup-failed" in html and "never started training" in html
    assert html.count('src="data:image/png;base64,') == 4 + 2  # curves + 2 confusion
    # trained on this machine's CPU: the report says its "GPUs" are ranks, and its
    # figures (here the confusion matrices' titles) count ranks
    assert ("runs trained on CPU ranks: their figures count ranks, and where this "
            "report's tables say GPUs, read ranks") in html
    assert re.search(r'alt="\w+, 1 rank, seed', html)
    assert not re.search(r'alt="[^"]*GPU', html)
    assert re.search(r'<td class="">[0-9.]+ at 1 rank</td>', html)
