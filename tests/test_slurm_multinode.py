"""Two SLURM nodes on this machine, each in its own network namespace with its own
address (jobs/slurm/local/start.sh with LARTPC_SLURM_NODES=2): the project's job
scripts, unmodified and submitted by ``lartpc sweep --submit``, train across both with
torchrun and with Horovod (srun-launched Gloo, no ssh), through the veths, and a
requeued 2-node job resumes exactly.

Needs root. Skips with the reason where SLURM or namespaces cannot be started, unless
LARTPC_REQUIRE_SLURM=1 (CI), where that is a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_harness as sh
import torch
from train_helpers import BIN, HEAVY_TIMEOUT_S, rows, run, train_cmd

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.horovod]
NODES = ["lartpc-n1", "lartpc-n2"]
SETS = ("--set", "train.threads=1")  # the same threads per rank as the one-node reference


@pytest.fixture(scope="module")
def cluster():
    env = sh.start_or_skip(nodes=2)
    yield env
    sh.stop()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "lartpc-" not in links and "lartpc-" not in spaces, "tear-down left links"


def _sweep(tmp: Path, data: Path, launcher: str, *extra: str,
           cluster: dict | None = None) -> dict:
    """One 2-rank point of ``lartpc sweep``; given the cluster's environment, submitted
    to it by ``lartpc sweep --submit`` (its job id in the manifest)."""
    out = tmp / "runs"
    cmd = [sys.executable, "-m", "lartpc", "sweep", "--models", "jishnet", "--gpus", "2",
           "--seeds", "0", "--scheduler", "slurm", "--launcher", launcher, "--cpu",
           "--gpus-per-node", "1", "--config-prefix", "tiny", "--time", "00:15:00",
           "--data", str(data), "--out-dir", str(out), *SETS, *extra,
           *(["--submit"] if cluster else [])]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cluster)
    assert res.returncode == 0, res.stderr
    (point,) = json.loads((out / "manifest.json").read_text())["points"]
    assert not cluster or point["job_id"], point
    return point


def _log(tmp: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((tmp / "runs" / "logs").glob("*.out")))


def _bytes_through(link: str) -> int:
    stats = Path("/sys/class/net") / link / "statistics"
    return sum(int((stats / k).read_text()) for k in ("rx_bytes", "tx_bytes"))


@pytest.fixture(scope="module")
def reference(train_events_dir, tmp_path_factory):
    """The same point as a 2-rank run on this one host (horovodrun, same seed)."""
    out = tmp_path_factory.mktemp("one-node") / "run"
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           *train_cmd(train_events_dir, out, "train.epochs=2", "train.seed=0",
                      "train.time_limit_s=900", config="tiny-jishnet")]
    r = run(cmd, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    return out


def _same_as(run_dir: Path, ref: Path) -> None:
    """Rank logs and final parameters equal the one-node run's, bit for bit (both reduce
    two ranks' gradients, and a sum of two floats does not depend on their order)."""
    for rank in (0, 1):
        a, b = rows(run_dir / f"rank-{rank:03d}.csv"), rows(ref / f"rank-{rank:03d}.csv")
        assert [x["global_loss"] for x in a] == [x["global_loss"] for x in b]
        assert [x["local_loss"] for x in a] == [x["local_loss"] for x in b]
    pa = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    pb = torch.load(ref / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


TRAIN = ("--set", "data.downsample=9", "--set", "data.eval_fraction=0.2", "--set",
         "train.epochs=2", "--set", "train.log_flush_steps=1")


@pytest.mark.timeout(HEAVY_TIMEOUT_S)  # the first one starts the cluster and the reference
@pytest.mark.parametrize("launcher", ["torchrun", "horovod-gloo"])
def test_two_node_job_trains_across_the_link(cluster, tmp_path, train_events_dir, reference,
                                             launcher):
    before = [_bytes_through(f"lartpc-v{i}") for i in (1, 2)]
    point = _sweep(tmp_path, train_events_dir, launcher, *TRAIN, cluster=cluster)
    info = sh.wait(point["job_id"], cluster)
    assert info["JobState"] == "COMPLETED", _log(tmp_path)
    run_dir = Path(point["run"])
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["nodes"] == NODES and meta["local_size"] == 1
    assert meta["backend"] == ("torch" if launcher == "torchrun" else "horovod")
    net = meta["network"]  # CPU ranks: Gloo over TCP, recorded as such, no warning
    assert (net["library"], net["transport"], net["nodes"]) == ("gloo", "TCP", 2)
    assert net["sockets_across_nodes"] is False
    # every step's gradients crossed the veths: at least one copy of the model per step
    grad_bytes = sum(t.numel() * 4 for t in torch.load(
        run_dir / "checkpoint.pt", weights_only=True)["model"].values())
    moved = min(_bytes_through(f"lartpc-v{i}") - b for i, b in zip((1, 2), before,
                                                                    strict=True))
    assert moved > len(rows(run_dir / "rank-000.csv")) * grad_bytes
    _same_as(run_dir, reference)
    _training_time_apart(run_dir, meta)
    # one rank per node: its srun task's CPUs, recorded with the threads it used
    assert meta["cpu_binding"]["ranks_sharing_mask"] == 1 and meta["threads_per_rank"] == 1


def _training_time_apart(run_dir: Path, meta: dict) -> None:
    """run.json's training time is the steps' own (rank 0's data+compute+comm columns),
    its evaluations and checkpoints counted apart (issue 37)."""
    steps = rows(run_dir / "rank-000.csv")
    own = sum(float(x["data_s"]) + float(x["compute_s"]) + float(x["comm_s"]) for x in steps)
    assert meta["train_time_s"] == pytest.approx(own, rel=1e-9)
    assert meta["eval_time_s"] > 0 and meta["checkpoint_time_s"] > 0


def test_budget_ends_a_two_node_requeue_chain(cluster, tmp_path, train_events_dir):
    """A segment whose time limit would requeue it (LARTPC_TIME_LIMIT_S=1, 5 requeues
    allowed) but whose first step reaches train.budget_s=1e-9: the run stops there,
    budget spent, and its script ends the chain with requeues left."""
    env = {**cluster, "LARTPC_TIME_LIMIT_S": "1"}
    point = _sweep(tmp_path, train_events_dir, "torchrun", *TRAIN, "--set",
                   "train.budget_s=1e-9", "--max-requeues", "5", cluster=env)
    info = sh.wait(point["job_id"], cluster)
    log = _log(tmp_path)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", log
    assert "study budget spent" in log and "not requeued" in log, log
    assert "study budget reached" in log, log
    run_dir = Path(point["run"])
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["budget_spent"] is True and meta["status"] == "time_limit"
    assert meta["budget_s"] == 1e-9
    assert [s["status"] for s in meta["segments"]] == ["time_limit"]
    assert meta["nodes"] == NODES and len(rows(run_dir / "rank-000.csv")) == 1
    assert meta["network"]["transport"] == "TCP"
    _training_time_apart(run_dir, meta)


def test_scontrol_requeue_of_a_two_node_job_resumes_exactly(cluster, tmp_path,
                                                            train_events_dir, reference):
    point = _sweep(tmp_path, train_events_dir, "torchrun", *TRAIN, cluster=cluster)
    job = point["job_id"]
    log0 = Path(point["run"]) / "rank-000.csv"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log0.exists() and len(rows(log0)) >= 2):
        time.sleep(0.2)
    assert log0.exists() and len(rows(log0)) >= 2, _log(tmp_path)
    r = subprocess.run(["scontrol", "requeue", job], env=cluster, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    info = sh.wait(job, cluster)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, _log(tmp_path)
    meta = json.loads((Path(point["run"]) / "run.json").read_text())
    assert meta["status"] == "completed" and len(meta["segments"]) >= 2
    assert meta["segments"][0]["status"] == "preempted"
    _same_as(Path(point["run"]), reference)


THROTTLE = sh.ROOT / "jobs" / "slurm" / "local" / "throttle.sh"
RATE_MBIT = 200  # known to give 185-191 Mbit/s on a 64 MiB allreduce through tbf


def test_allreduce_bench_measures_the_throttled_link(cluster, tmp_path, train_events_dir):
    """`lartpc sweep --measure-network`'s job (`lartpc bench allreduce` as a 2-node job
    step, torch.distributed from SLURM's variables) on links that tbf limits to
    RATE_MBIT: the fitted bandwidth is the configured rate within 20 %, and the profile
    it writes is one analysis takes."""
    from lartpc.analysis.profiles import load_profile_file

    _sweep(tmp_path, train_events_dir, "torchrun", *TRAIN, "--measure-network")
    profile = tmp_path / "runs" / "network.json"
    script = tmp_path / "runs" / "jobs" / "allreduce.sbatch"
    env = {**cluster, "LARTPC_ALLREDUCE_ARGS": "--max-bytes 4MiB --factor 4 --warmup 1 "
                                               "--repeats 6 --seconds-per-size 1"}
    r = subprocess.run(["bash", str(THROTTLE), f"{RATE_MBIT}mbit"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        qdiscs = [subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
                  for cmd in (["tc", "qdisc", "show", "dev", "lartpc-v1"],
                              ["tc", "-n", "lartpc-n2", "qdisc", "show", "dev", "eth0"])]
        assert all("tbf" in q and f"rate {RATE_MBIT}Mbit" in q for q in qdiscs), qdiscs
        before = _bytes_through("lartpc-v1")
        # inside pytest's 600 s per test, with room for the sweep and the throttling
        info = sh.wait(sh.sbatch(script, env), cluster, timeout_s=420)
        moved = _bytes_through("lartpc-v1") - before
    finally:
        subprocess.run(["bash", str(THROTTLE), "off"], capture_output=True, timeout=60)
    assert info["JobState"] == "COMPLETED", _log(tmp_path)
    prof = json.loads(profile.read_text())
    m = prof["measured"]
    assert m["world_size"] == 2 and sorted(set(m["hosts"])) == NODES and m["link"] == "inter"
    assert m["sizes_bytes"][0] == 4 and m["sizes_bytes"][-1] == 4 << 20
    # every timed allreduce crossed the veth: each rank sends and receives its size
    assert moved > sum(s * n for s, n in zip(m["sizes_bytes"], m["repeats"], strict=True))
    beta_mbit = prof["beta_inter_GBps"] * 8e3
    assert beta_mbit == pytest.approx(RATE_MBIT, rel=0.20), m["fit"]
    assert prof["alpha_inter_us"] >= 0
    loaded = load_profile_file(profile)
    assert loaded.gpus_per_node == 1 and loaded.beta_inter_GBps == prof["beta_inter_GBps"]
    assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", "lartpc-v1"],
                                       capture_output=True, text=True).stdout
