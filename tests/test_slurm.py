"""A real SLURM on this machine runs the job scripts `lartpc sweep` writes.

Needs root (start.sh installs slurm-wlm and starts slurmctld/slurmd). Where SLURM
cannot be started the tests skip with the reason, unless LARTPC_REQUIRE_SLURM=1 (CI),
where that is a failure.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_harness as sh
from train_helpers import HEAVY_TIMEOUT_S

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm_env():
    env = sh.start_or_skip()
    yield env
    sh.stop()


def _sweep(tmp: Path, data: Path, launcher: str, *extra: str, model: str = "jishnet") -> dict:
    """`lartpc sweep` for one 2-rank CPU point of a tiny model; the manifest."""
    out = tmp / "runs"
    cmd = [sys.executable, "-m", "lartpc", "sweep", "--models", model, "--gpus", "2",
           "--seeds", "0", "--scheduler", "slurm", "--launcher", launcher, "--cpu",
           "--gpus-per-node", "2", "--config-prefix", "tiny", "--time", "00:15:00",
           "--data", str(data), "--out-dir", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "manifest.json").read_text())


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _log(tmp: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((tmp / "runs" / "logs").glob("*.out")))


def test_two_task_srun(slurm_env, tmp_path):
    """The harness itself: two tasks on the one node, each with its own rank."""
    script = tmp_path / "hello.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=2 --nodes=1 --time=00:02:00\n"
                      f"#SBATCH --output={tmp_path}/hello-%j.out\n"
                      "srun bash -c 'echo task $SLURM_PROCID of $SLURM_NTASKS on $(hostname -s)'\n")
    job = sh.sbatch(script, slurm_env)
    info = sh.wait(job, slurm_env, timeout_s=120)
    out = (tmp_path / f"hello-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert sorted(ln.split(" on ")[0] for ln in out.splitlines()) == \
        ["task 0 of 2", "task 1 of 2"]


@pytest.mark.parametrize("launcher,model", [("torchrun", "jishnet"), ("horovod-gloo", "scnet")])
def test_sweep_job_trains(slurm_env, tmp_path, events_dir, launcher, model):
    """A generated script runs a 2-rank tiny training to completion."""
    man = _sweep(tmp_path, events_dir, launcher, "--set", "train.epochs=1", model=model)
    (point,) = man["points"]
    job = sh.sbatch(point["script"], slurm_env)
    info = sh.wait(job, slurm_env)
    run = Path(point["run"])
    assert info["JobState"] == "COMPLETED", _log(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "completed"
    assert meta["world_size"] == 2
    for rank in (0, 1):
        rows = _rows(run / f"rank-{rank:03d}.csv")
        assert rows and {int(r["rank"]) for r in rows} == {rank}
    assert _rows(run / "eval.csv")
    assert len(_rows(run / "confusion.csv")) == 5  # one row per true class
    assert (run / "checkpoint.pt").stat().st_size > 0


def test_time_limit_requeues_and_resumes(slurm_env, tmp_path, events_dir):
    """A run stopped by its time limit is requeued by its script and resumes.

    train.time_limit_s=1 makes every segment stop after its first step (the limit is
    checked after each step); --max-requeues 1 allows one requeue, so the job runs
    exactly two segments of one step each and ends, still at its time limit: FAILED
    (exit 3), so that an ``afterok`` dependent does not start on an unfinished run.
    """
    man = _sweep(tmp_path, events_dir, "torchrun", "--set", "train.epochs=5",
                 "--max-requeues", "1")  # written into the script: an environment's loses
    (point,) = man["points"]
    env = {**slurm_env, "LARTPC_TIME_LIMIT_S": "1"}
    job = sh.sbatch(point["script"], env)
    info = sh.wait(job, slurm_env)
    run = Path(point["run"])
    log = _log(tmp_path)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", (info, log)
    assert info["Restarts"] == "1", log
    assert "requeued 1 times already (LARTPC_MAX_REQUEUES=1); giving up" in log
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "time_limit"
    assert len(meta["segments"]) == 2
    assert "status before: time_limit" in log  # the second segment saw the first's end
    for rank in (0, 1):
        rows = _rows(run / f"rank-{rank:03d}.csv")
        assert [(int(r["epoch"]), int(r["batchno"])) for r in rows] == [(0, 0), (0, 1)]


@pytest.mark.timeout(HEAVY_TIMEOUT_S)  # four horovodrun starts and SLURM's fixed holds
def test_horovod_requeue_resumes_exactly(slurm_env, tmp_path, events_dir):
    """A Horovod job requeued twice (three one-step segments of a three-step epoch) ends
    with the losses, parameters and Adam state of an uninterrupted job of the same point:
    a resume that dropped the optimizer state changes the third step."""
    ref_dir, split_dir = tmp_path / "ref", tmp_path / "split"
    ref_dir.mkdir()
    split_dir.mkdir()
    sets = ("--set", "train.epochs=1")
    (ref,) = _sweep(ref_dir, events_dir, "horovod-gloo", *sets)["points"]
    (split,) = _sweep(split_dir, events_dir, "horovod-gloo", *sets, "--max-requeues",
                      "5")["points"]
    ref_job = sh.sbatch(ref["script"], slurm_env)
    assert sh.wait(ref_job, slurm_env)["JobState"] == "COMPLETED", _log(ref_dir)
    env = {**slurm_env, "LARTPC_TIME_LIMIT_S": "1"}
    info = sh.wait(sh.sbatch(split["script"], env), slurm_env)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", _log(split_dir)
    run, ref_run = Path(split["run"]), Path(ref["run"])
    meta = json.loads((run / "run.json").read_text())
    assert meta["steps_per_epoch"] == 3, "the test needs three one-step segments"
    assert [s["status"] for s in meta["segments"]] == ["time_limit", "time_limit", "completed"]
    for rank in (0, 1):
        got, want = _rows(run / f"rank-{rank:03d}.csv"), _rows(ref_run / f"rank-{rank:03d}.csv")
        assert [r["global_loss"] for r in got] == [r["global_loss"] for r in want]
    import torch

    a = torch.load(ref_run / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert {float(s["step"]) for s in b["optimizer"]["state"].values()} == {3.0}


def _rows_when(path: Path, at_least: int, job: str, env: dict, timeout_s: float = 300) -> int:
    """Wait until ``path`` (a rank's CSV) holds ``at_least`` rows; how many it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = len(_rows(path)) if path.exists() else 0
        if n >= at_least:
            return n
        assert sh.job_info(job, env).get("JobState") not in sh.FINAL_STATES, \
            f"job {job} ended before {path.name} had {at_least} rows"
        time.sleep(1)
    raise AssertionError(f"{path} had fewer than {at_least} rows after {timeout_s:.0f} s")


@pytest.mark.timeout(HEAVY_TIMEOUT_S)  # two jobs and a requeue's fixed holds
@pytest.mark.parametrize("launcher", ["torchrun", "horovod-gloo"])
def test_the_wall_time_signal_checkpoints_every_rank_and_requeues(slurm_env, tmp_path,
                                                                  events_dir, launcher):
    """SLURM's warning before the time limit (``--signal=B:USR1@120``: USR1 to the
    batch shell) reaches the ranks, which checkpoint at the step they are on and end
    "preempted"; the script requeues and the next segment goes on from that step.

    The script must not pass the warning to ``srun`` as SIGTERM: srun answers TERM by
    SIGKILLing its tasks, so no rank would save and up to ``checkpoint_every_s`` of
    training would be lost (here, with no periodic checkpoint, the whole segment). The
    signal is sent the way SLURM sends it, ``scancel --signal=USR1 --batch``, twice:
    once per segment, the second past ``--max-requeues 1``, which ends the job FAILED
    (exit 3: the run is unfinished and nothing will resume it)."""
    man = _sweep(tmp_path, events_dir, launcher, "--set", "train.epochs=1000",
                 "--set", "train.checkpoint_every_s=3600",
                 "--max-requeues", "1")
    (point,) = man["points"]
    run = Path(point["run"])
    job = sh.sbatch(point["script"], slurm_env)
    csv0, first = run / "rank-000.csv", 0
    for segment in (1, 2):
        _rows_when(csv0, 3 if segment == 1 else first + 3, job, slurm_env)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm_env,
                       check=True, timeout=60)
        if segment == 1:  # the next segment starts after the checkpoint
            deadline = time.monotonic() + 300
            while sh.job_info(job, slurm_env).get("Restarts") != "1":
                assert time.monotonic() < deadline, _log(tmp_path)
                time.sleep(1)
            # the first segment's record (the next may have begun and be "running")
            meta = json.loads((run / "run.json").read_text())
            assert meta["segments"][0]["status"] == "preempted", _log(tmp_path)
            first = len(_rows(csv0))
    info = sh.wait(job, slurm_env)
    log = _log(tmp_path)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", (info, log)
    assert info["Restarts"] == "1", log
    assert "requeued 1 times already (LARTPC_MAX_REQUEUES=1); giving up" in log
    assert "wall-time signal while training still runs" in log
    # horovodrun runs in the batch step, its ranks its children: it would SIGKILL them 5 s
    # after passing TERM on, before a slow step could save (torchrun runs under srun)
    told = log.count("TERM to the ranks themselves (pids ")
    assert told == (2 if launcher == "horovod-gloo" else 0), log
    meta = json.loads((run / "run.json").read_text())
    assert [s["status"] for s in meta["segments"]] == ["preempted", "preempted"], log
    import torch

    saved = torch.load(run / "checkpoint.pt", weights_only=True)
    for rank in (0, 1):
        rows = _rows(run / f"rank-{rank:03d}.csv")
        steps = [(int(r["epoch"]), int(r["batchno"])) for r in rows]
        assert len(steps) > first and len(set(steps)) == len(steps), \
            "the second segment went on from the first's last step: none lost or repeated"
        assert len(steps) == int(saved["global_step"]), (len(steps), sorted(saved))
