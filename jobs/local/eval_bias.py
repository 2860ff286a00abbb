"""Issue 37's bias measurement: how much evaluation and checkpoints inside the timed
window change TTL and the epoch rate, on a local 2-node SLURM.

Starts ``jobs/slurm/local/start.sh`` with ``LARTPC_SLURM_NODES=2`` in a state folder,
port and network namespaces of its own (a cluster another user runs on the machine is
left alone), submits ``lartpc sweep --submit`` points of two CPU ranks on two nodes
(torchrun, Gloo over the namespaces' veths), one at a time: each evaluation cadence
(every epoch, the paper's; every ``--images-epochs`` epochs' worth of images) repeated
``--repeats`` times. Every run is analysed on both clocks (``lartpc analyze fit --json
--clock train`` and ``--clock wall``): the training clock leaves evaluation and
checkpoints out of the timed window, the wall clock keeps them in. Prints one JSON
object (also written to ``--out``) with each run's numbers and the medians.

Usage (root): python -m lartpc.jobs.local.eval_bias --out docs/results/issue37-eval-bias.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "jobs" / "slurm" / "local"
#: a cluster of its own beside the tests' (their defaults: /var/tmp/lartpc-slurm, 6817,
#: lartpc, 10.77.0)
CLUSTER = {"LARTPC_SLURM_DIR": "/var/tmp/lartpc-slurm-evalbias", "LARTPC_SLURM_NODES": "2",
           "LARTPC_SLURM_PORT": "6837", "LARTPC_SLURM_NET": "lbias",
           "LARTPC_SLURM_SUBNET": "10.79.0"}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
LAUNCHER_VARS = ("HOROVOD_", "OMPI_", "PMI", "SLURM_", "TORCHELASTIC", "JSM_", "LARTPC_")


def start_cluster() -> dict[str, str]:
    """The 2-node cluster up; the environment to submit to it."""
    r = subprocess.run(["bash", str(LOCAL / "start.sh")], capture_output=True, text=True,
                       timeout=600, env={**os.environ, **CLUSTER})
    m = re.search(r"^export SLURM_CONF=(\S+)$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        sys.exit(f"eval_bias: start.sh failed (exit {r.returncode}): {r.stderr[-2000:]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env["SLURM_CONF"] = m.group(1)
    return env


def stop_cluster() -> None:
    subprocess.run(["bash", str(LOCAL / "stop.sh")], capture_output=True, text=True,
                   timeout=120, env={**os.environ, **CLUSTER})


def wait(job: str, env: dict[str, str], timeout_s: float = 1200) -> dict[str, str]:
    """Poll ``scontrol show job`` until the job ends; its fields."""
    deadline, info = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        r = subprocess.run(["scontrol", "-o", "show", "job", job], env=env,
                           capture_output=True, text=True, timeout=60)
        info = dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}
        if info.get("JobState") in FINAL:
            return info
        time.sleep(2)
    subprocess.run(["scancel", job], env=env, timeout=60)
    sys.exit(f"eval_bias: job {job} not finished after {timeout_s:.0f} s: {info}")


def submit_point(out: Path, data: Path, sets: list[str], env: dict[str, str]) -> Path:
    """One 2-rank, 2-node point through ``lartpc sweep --submit``, waited for; its run."""
    cmd = [sys.executable, "-m", "lartpc", "sweep", "--models", "jishnet", "--gpus", "2",
           "--seeds", "0", "--scheduler", "slurm", "--launcher", "torchrun", "--cpu",
           "--gpus-per-node", "1", "--config-prefix", "tiny", "--time", "00:20:00",
           "--data", str(data), "--out-dir", str(out), "--submit"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        sys.exit(f"eval_bias: lartpc sweep failed: {r.stderr[-2000:]}")
    (point,) = json.loads((out / "manifest.json").read_text())["points"]
    info = wait(point["job_id"], env)
    if info["JobState"] != "COMPLETED":
        logs = "\n".join(p.read_text() for p in (out / "logs").glob("*.out"))
        sys.exit(f"eval_bias: job {point['job_id']} {info['JobState']}: {logs[-3000:]}")
    return Path(point["run"])


def analyse(runs: list[Path], clock: str, threshold: float) -> dict[str, dict]:
    """``lartpc analyze fit --json`` on one clock: run path -> its numbers."""
    r = subprocess.run([sys.executable, "-m", "lartpc", "analyze", "fit", *map(str, runs),
                        "--json", "--no-figures", "--clock", clock, "--threshold",
                        str(threshold), "--strict"], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        sys.exit(f"eval_bias: analyze fit --clock {clock} failed: {r.stderr[-2000:]}")
    return {str(Path(x["path"]).resolve()): x for x in json.loads(r.stdout)["runs"]}


def median(values: list) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if len(got) == len(values) and got else None


def summarise(mine: list[dict]) -> dict:
    """The medians of one cadence's runs, and the wall/train ratios (the bias), each the
    median of the runs' own ratios; None where a run has no value (TTL censored)."""
    s = {k: median([x[k] for x in mine]) for k in (
        "evaluations", "wall_s", "train_time_s", "eval_time_s", "checkpoint_time_s",
        "epoch_rate_per_min_train", "epoch_rate_per_min_wall", "ttl_s_train", "ttl_s_wall")}
    s["eval_checkpoint_share_of_wall"] = median([
        (x["eval_time_s"] + x["checkpoint_time_s"]) / x["wall_s"] for x in mine])
    s["epoch_rate_wall_over_train"] = median([
        x["epoch_rate_per_min_wall"] / x["epoch_rate_per_min_train"] for x in mine])
    s["ttl_wall_over_train"] = median([
        x["ttl_s_wall"] / x["ttl_s_train"] if x["ttl_s_wall"] and x["ttl_s_train"]
        else None for x in mine])
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.eval_bias",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--repeats", type=int, default=3, help="runs per cadence (default 3)")
    p.add_argument("--events", type=int, default=140, help="events generated (default 140)")
    p.add_argument("--epochs", type=int, default=6, help="train.epochs (default 6)")
    p.add_argument("--images-epochs", type=int, default=3,
                   help="the image cadence, in epochs' worth of images (default 3)")
    p.add_argument("--threshold", type=float, default=1.5,
                   help="TTL threshold on the smoothed loss (default 1.5: tiny runs)")
    p.add_argument("--work", type=Path, help="folder for events and runs (default: temporary)")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("needs root (start.sh runs slurmd and makes network namespaces)")
    work = a.work or Path(tempfile.mkdtemp(prefix="lartpc-eval-bias-"))
    data = work / "events"
    if not data.exists():
        from lartpc.sim import write_dataset

        write_dataset(data, a.events, seed=4321, downsample=9, shard_size=35, workers=1)
    base = ["train.threads=1", "data.downsample=9", "data.eval_fraction=0.2",
            f"train.epochs={a.epochs}", "train.log_flush_steps=20", "train.progress_every_s=0"]
    n_train = a.events - round(0.2 * a.events)  # about: the split is per class
    cadences = {"epoch": [],
                "images": [f"train.eval_every_images={a.images_epochs * n_train}"]}
    env = start_cluster()
    runs: list[dict] = []
    try:
        for r in range(a.repeats):  # interleaved, so load drifts hit both alike
            for name, sets in cadences.items():
                out = work / f"{name}-{r}"
                shutil.rmtree(out, ignore_errors=True)
                run = submit_point(out, data, base + sets, env)
                runs.append({"cadence": name, "repeat": r, "run": run})
    finally:
        stop_cluster()
    folders = [x["run"] for x in runs]
    clocks = {c: analyse(folders, c, a.threshold) for c in ("train", "wall")}
    rows = []
    for x in runs:
        key = str(x["run"].resolve())
        meta = json.loads((x["run"] / "run.json").read_text())
        evals = len((x["run"] / "eval.csv").read_text().splitlines()) - 1
        row = {"cadence": x["cadence"], "repeat": x["repeat"], "evaluations": evals,
               "wall_s": meta["end_time"] - meta["start_time"],
               **{k: meta.get(k) for k in ("train_time_s", "eval_time_s", "checkpoint_time_s",
                                           "steps_per_epoch", "world_size", "nodes")},
               "network": meta.get("network", {}).get("transport")}
        for c, res in clocks.items():
            row[f"epoch_rate_per_min_{c}"] = res[key]["epoch_rate_per_min"]
            row[f"ttl_s_{c}"] = None if res[key]["ttl_censored"] else res[key]["ttl_s"]
        rows.append(row)
    summary = {name: summarise([x for x in rows if x["cadence"] == name])
               for name in cadences}
    result = {
        "issue": 37,
        "what": "TTL and epoch rate with evaluation and checkpoints inside (--clock wall) "
                "and outside (--clock train) the timed window; eval every epoch vs every "
                f"{a.images_epochs} epochs' worth of images",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "gpu": None, "system": platform.platform(),
                    "python": platform.python_version()},
        # the work folder is this machine's: WORK in the record
        "command": "python -m lartpc.jobs.local.eval_bias " + " ".join(
            "WORK" if a.work and x == str(a.work) else x
            for x in (argv if argv is not None else sys.argv[1:])),
        "setup": {"nodes": 2, "ranks": 2, "launcher": "torchrun (CPU, Gloo)",
                  "model": "tiny-jishnet", "downsample": 9, "events": a.events,
                  "eval_fraction": 0.2, "epochs": a.epochs, "batch_per_rank": 7,
                  "threshold": a.threshold, "repeats": a.repeats,
                  "cadences": {k: v or ["train.eval_every_epochs=1"]
                               for k, v in cadences.items()}},
        "summary_median": summary,
        "runs": rows,
    }
    text = json.dumps(result, indent=1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
