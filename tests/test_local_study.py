"""`python -m lartpc.jobs.local.study` (`make demo`) at tiny settings: what it reuses
when run again, what it moves aside, and the downsample it trains at."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lartpc.jobs.local.study import main
from train_helpers import HEAVY_TIMEOUT_S, clean_env

ROOT = Path(__file__).resolve().parents[1]


def _study(out: Path, *argv: str) -> subprocess.CompletedProcess:
    """The study on one rank, one model, 0.2-minute trainings (``argv`` overrides)."""
    r = subprocess.run([sys.executable, "-m", "lartpc.jobs.local.study", "--out", str(out),
                        "--events", "40", "--minutes-per-run", "0.2", "--ranks", "1",
                        "--models", "scnet", *argv],
                       capture_output=True, text=True, timeout=600, env=clean_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


@pytest.mark.slow
@pytest.mark.sparse
@pytest.mark.horovod
@pytest.mark.timeout(HEAVY_TIMEOUT_S)  # five study calls, four of them training
def test_a_finished_run_of_other_events_or_settings_is_moved_aside_and_trained_again(
        tmp_path):
    """The second call reused a run trained on the first call's 40 events after making
    60 new ones: the report and fit were built from it."""
    out = tmp_path / "st"
    run, aside = out / "runs" / "scnet-n1-s0", out / "stale-runs"
    _study(out)
    first = _record(run)
    assert first["store"]["events"] == 40
    r = _study(out)  # the same options: the same run
    assert f"reusing finished run {run}" in r.stderr and not aside.exists()
    r = _study(out, "--events", "60")
    assert f"{run} was made from other events (40, hash" in r.stderr
    (moved,) = aside.iterdir()
    assert f"moved to {moved}" in r.stderr and _record(moved) == first  # kept whole
    assert (moved / "rank-000.csv").exists()
    assert _record(run)["store"]["events"] == 60
    r = _study(out, "--events", "60", "--minutes-per-run", "0.25")
    assert (f"{run} was made with other settings: train.time_limit_s=12.0 (now 15.0)"
            in r.stderr)
    assert len(list(aside.iterdir())) == 2
    now = _record(run)
    assert now["store"]["events"] == 60 and now["config"]["train"]["time_limit_s"] == 15.0
    # a run interrupted before it finished (here killed: still 'running') is kept too
    (run / "run.json").write_text(json.dumps({**now, "status": "running"}))
    r = _study(out, "--events", "60", "--minutes-per-run", "0.25")
    assert f"{run} was left running (interrupted): moved to" in r.stderr
    assert len(list(aside.iterdir())) == 3 and _record(run)["status"] != "running"


@pytest.mark.slow
@pytest.mark.horovod
def test_trains_at_the_downsample_asked_for(tmp_path):
    """--downsample 12 made 300x300 events, then every training failed: the study's
    trainings took the preset's data.downsample=4."""
    out = tmp_path / "st"
    _study(out, "--downsample", "12", "--models", "jishnet")
    meta = _record(out / "runs" / "jishnet-n1-s0")
    assert meta["geometry"]["downsample"] == 12 == meta["config"]["data"]["downsample"]
    assert meta["status"] in ("completed", "time_limit")
    assert (out / "report" / "report.html").exists()


@pytest.mark.parametrize("argv,message", [
    (["--downsample", "7"], "--downsample=7: must be a positive divisor of 3600"),
    # 300x300: SCNet's four poolings leave nothing (JishNet's padding keeps 1x1)
    (["--downsample", "12"], "--downsample 12: image_size=(300, 300): too small for SCNet"),
    (["--models", "jishnet,resnet"], "--models: unknown model 'resnet'"),
])
def test_options_no_training_can_use_are_refused_before_simulating(tmp_path, capsys, argv,
                                                                   message):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "st"), "--events", "40", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "st").exists()


def test_events_too_few_to_split_are_refused_before_any_training(tmp_path, capsys):
    """20 events leave no evaluation event (4 a class, a tenth each): the first training
    failed inside horovodrun with its traceback. Refused after simulating (the split
    is per class, known once the events are), before any training, in one line."""
    out = tmp_path / "st"
    with pytest.raises(SystemExit) as e:
        main(["--out", str(out), "--events", "20", "--models", "scnet", "--ranks", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "leave no evaluation event" in err, err
    assert f"{out / 'events'}: 20 events" in err and "Traceback" not in err
    assert not (out / "runs").exists()


def test_a_run_of_an_older_lartpc_is_not_taken_for_other_settings(events_dir):
    """A finished run's record from before a config key existed (here data.test_fraction
    and data.table_cache) is the same setting as the key's default: reused, not moved
    aside and trained again; a recorded value that differs is named."""
    import argparse

    from lartpc.jobs.local.study import _differs, _sets

    from lartpc.config import load_config
    from lartpc.data.store import EventStore
    from lartpc.train.segments import store_identity

    args = argparse.Namespace(downsample=4, minutes_per_run=0.2, seed=0)
    cfg = load_config("tiny-scnet", _sets(args, 1))
    config = cfg.to_dict()
    config["data"] = {k: v for k, v in config["data"].items()
                      if k not in ("test_fraction", "table_cache")}
    store = EventStore(events_dir)
    info = {"store": store_identity(store, cfg.data.max_events),
            "world_size": 1, "config": config}
    assert _differs(info, events_dir, store, cfg, 1) == ""
    config["train"] = {**config["train"], "seed": 5}
    assert _differs(info, events_dir, store, cfg, 1) == \
        "made with other settings: train.seed=5 (now 0)"
