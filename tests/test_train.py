"""`lartpc train`: run folder, determinism, resume, time limit, bad config."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch
from train_helpers import clean_env, final_params, kill_after_steps, rows, run, train_cmd

from lartpc.runfolder.tables import EVAL_COLUMNS, STEP_COLUMNS
from lartpc.train import checkpoint


def _assert_complete(out, world_size: int) -> dict:
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "completed"
    assert info["world_size"] == world_size
    assert info["end_time"] > info["start_time"]
    assert info["param_divergence"] == 0.0
    for key in ("model", "config", "geometry", "versions", "git_sha", "host", "steps_per_epoch",
                "model_options"):
        assert key in info, key
    if info["model"] == "jishnet":  # model.stem=auto on a CPU: the published layers
        assert info["model_options"]["stem"] == "library"
    for r in range(world_size):
        log = rows(out / f"rank-{r:03d}.csv")
        assert tuple(log[0]) == STEP_COLUMNS
        assert len(log) == info["config"]["train"]["epochs"] * info["steps_per_epoch"]
        steps = [(int(x["epoch"]), int(x["batchno"])) for x in log]
        assert len(set(steps)) == len(steps), "a step was logged twice"
    ev = rows(out / "eval.csv")
    assert tuple(ev[0]) == EVAL_COLUMNS and len(ev) == 2
    assert int(ev[-1]["n_events"]) == info["eval_events"]
    conf = rows(out / "confusion.csv")
    assert sum(int(v) for r in conf for k, v in r.items() if k != "true") == info["eval_events"]
    ck = checkpoint.load(out)  # the final state: every step of every epoch, these ranks
    assert (ck["global_step"], ck["world_size"]) == (len(log), world_size)
    return info


@pytest.mark.slow
def test_single_process_run_is_complete_and_deterministic(train_events_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        r = run(train_cmd(train_events_dir, out))
        assert r.returncode == 0, r.stderr
    info = _assert_complete(a, 1)
    assert info["network"]["library"] == "none" and info["network"]["nodes"] == 1
    la, lb = rows(a / "rank-000.csv"), rows(b / "rank-000.csv")
    assert [x["local_loss"] for x in la] == [x["local_loss"] for x in lb]
    assert [x["global_loss"] for x in la] == [x["local_loss"] for x in la]
    assert info["train_events"] + info["eval_events"] == 70
    # Each epoch sees every training event once: the data sizes add up.
    for epoch in ("0", "1"):
        assert sum(int(x["data_size"]) for x in la if x["epoch"] == epoch) == info["train_events"]
    pa, pb = final_params(a), final_params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("config", ["tiny-jishnet", "tiny-scnet"])
def test_two_rank_horovodrun_training(train_events_dir, tmp_path, config):
    out = tmp_path / "run"
    cmd = [str(train_cmd(train_events_dir, out)[0].rsplit("/", 1)[0] + "/horovodrun"),
           "-np", "2", "-H", "localhost:2", "--gloo",
           *train_cmd(train_events_dir, out, config=config)]
    r = run(cmd, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    info = _assert_complete(out, 2)
    assert info["backend"] == "horovod"
    assert info["network"]["library"] == "gloo" and info["network"]["transport"] == "TCP"
    assert info["cpu_binding"]["ranks_sharing_mask"] == 2  # horovodrun: one mask, split
    r0, r1 = rows(out / "rank-000.csv"), rows(out / "rank-001.csv")
    assert [x["global_loss"] for x in r0] == [x["global_loss"] for x in r1]
    assert [x["local_loss"] for x in r0] != [x["local_loss"] for x in r1]
    for a, b in zip(r0, r1, strict=True):
        mean = (float(a["local_loss"]) + float(b["local_loss"])) / 2
        assert float(a["global_loss"]) == pytest.approx(mean, rel=1e-6)
    # Together the two ranks see every training event once per epoch.
    seen = sum(int(x["data_size"]) for x in r0 + r1 if x["epoch"] == "0")
    assert seen == info["train_events"]


@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted(train_events_dir, tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    sets = ("train.checkpoint_every_steps=2", "train.epochs=3")
    r = run(train_cmd(train_events_dir, ref, *sets))
    assert r.returncode == 0, r.stderr
    kill_after_steps(train_cmd(train_events_dir, cut, *sets), cut, 11)  # mid-epoch 1,
    # after a checkpoint
    info = json.loads((cut / "run.json").read_text())
    assert info["status"] == "running", "the run finished before it could be killed"
    r = run(train_cmd(train_events_dir, cut, *sets))
    assert r.returncode == 0, r.stderr
    _ = info
    ref_rows, cut_rows = rows(ref / "rank-000.csv"), rows(cut / "rank-000.csv")
    assert [(x["epoch"], x["batchno"]) for x in cut_rows] == \
        [(x["epoch"], x["batchno"]) for x in ref_rows]
    assert [x["local_loss"] for x in cut_rows] == [x["local_loss"] for x in ref_rows]
    pa, pb = final_params(ref), final_params(cut)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert len(json.loads((cut / "run.json").read_text())["segments"]) == 2


@pytest.mark.slow
def test_time_limit_stops_cleanly(train_events_dir, tmp_path):
    out = tmp_path / "run"
    limit = 25.0
    r = run(train_cmd(train_events_dir, out, "train.epochs=1000", f"train.time_limit_s={limit}"))
    assert r.returncode == 0, r.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "time_limit"  # how long it took is the machine's: not checked
    log = rows(out / "rank-000.csv")
    assert 0 < len(log) < 1000 * info["steps_per_epoch"]
    assert rows(out / "eval.csv"), "no evaluation before stopping"
    # The checkpoint holds the last logged step; the confusion matrix the last evaluation.
    assert checkpoint.load(out)["global_step"] == len(log)
    conf = rows(out / "confusion.csv")
    n_conf = sum(int(v) for r in conf for k, v in r.items() if k != "true")
    assert n_conf == int(rows(out / "eval.csv")[-1]["n_events"]) == info["eval_events"]


@pytest.mark.parametrize("sets,message", [
    (["train.lrr=1"], "unknown key train.lrr"),
    (["train.lr=\"fast\""], "train.lr"),
    (["train.batch_per_rank=0"], "train.batch_per_rank"),
    (["data.downsample=4"], "data.downsample=4"),
    (["model.name=resnet"], "model.name"),
])
def test_bad_config_is_one_clear_error(train_events_dir, tmp_path, sets, message):
    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out, *sets), timeout=120)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_data_folder_without_events(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run(train_cmd(tmp_path / "empty", tmp_path / "run"), timeout=120)
    assert r.returncode == 2
    assert "empty" in r.stderr and "events-NNNNN.h5" in r.stderr
    assert not (tmp_path / "run").exists()


def _rank_process(launcher: subprocess.Popen, rank: int):
    """The `lartpc train` process of ``rank`` under a horovodrun launcher."""
    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            env = child.environ()
            if env.get("HOROVOD_RANK") == str(rank) and "train" in child.cmdline():
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@pytest.mark.slow
@pytest.mark.horovod
def test_dead_rank_fails_the_job_without_hanging(train_events_dir, tmp_path):
    """SIGKILL one rank mid-training: horovodrun exits non-zero, in bounded time."""
    out = tmp_path / "run"
    cmd = [train_cmd(train_events_dir, out)[0].rsplit("/", 1)[0] + "/horovodrun",
           "-np", "2", "-H", "localhost:2", "--gloo",
           *train_cmd(train_events_dir, out, "train.epochs=1000")]
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        victim = None
        while time.monotonic() < deadline:
            log = out / "rank-001.csv"
            if log.exists() and len(log.read_text().splitlines()) > 3:
                victim = _rank_process(proc, 1)
                if victim is not None:
                    break
            time.sleep(0.1)
        assert victim is not None, "rank 1 never started training"
        victim.kill()
        code = proc.wait(timeout=180)  # a hang fails here
        assert code != 0
        info = json.loads((out / "run.json").read_text())
        assert info["status"] != "completed"
    finally:
        if proc.poll() is None:
            proc.kill()
