"""Every status training writes passes through the analysis commands and the live view,
built from real `lartpc train` output: analysis refused `preempted` and `diverged`, the
state a requeued or a failed cluster job leaves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_segments import DISK_FULL
from train_helpers import BIN, clean_env, kill_after_steps, run, train_cmd

from lartpc.runfolder.schema import STATUSES

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


#: every run measures the noise scale at every step (one rank: halves), so predict has
#: its input
NOISE = ("train.noise_scale=halves", "train.noise_every_steps=1")


@pytest.fixture(scope="module")
def study(train_events_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("statuses")
    r = run(train_cmd(train_events_dir, root / "completed", "train.epochs=1", *NOISE))
    assert r.returncode == 0, r.stderr
    r = run(train_cmd(train_events_dir, root / "time_limit", "train.time_limit_s=1", *NOISE))
    assert r.returncode == 0, r.stderr
    r = run(train_cmd(train_events_dir, root / "diverged", "train.lr=1e30", "train.epochs=1",
                      *NOISE))
    assert r.returncode == 1, r.stderr
    # a full disk at the second checkpoint: status failed, exit 2
    cmd = train_cmd(train_events_dir, root / "failed", *NOISE)
    r = run([sys.executable, "-c", DISK_FULL, "runtimeerror", *cmd[1:]])
    assert r.returncode == 2, r.stderr
    # SIGKILL, as a lost node leaves it: status running
    kill_after_steps(train_cmd(train_events_dir, root / "running", *NOISE), root / "running", 3)
    out = root / "preempted"
    # epochs enough that it cannot complete before the signal lands on a busy host
    proc = subprocess.Popen(train_cmd(train_events_dir, out, *NOISE, "train.epochs=1000"),
                            env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    log = out / "rank-000.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (log.exists()
                                               and len(log.read_text().splitlines()) > 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    got = {p.name: json.loads((p / "run.json").read_text())["status"] for p in root.iterdir()}
    assert got == {s: s for s in STATUSES}
    return root


def _analysis(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc.analysis", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_schema_lists_every_status_training_writes():
    from lartpc.train.run import EXIT_CODES

    assert set(EXIT_CODES) | {"running", "failed"} == set(STATUSES)


@pytest.mark.parametrize("command", ["fit", "curves", "confusion", "report", "predict"])
def test_analysis_takes_every_status(study, tmp_path, command):
    extra = {"fit": [], "predict": ["--cluster", "local-cpu", "--gpus", "1,2",
                                    "--out", str(tmp_path / command)]}
    # predict without --strict: a run that diverged at once resolves no noise scale,
    # which (not its status) leaves it out with a warning
    strict = [] if command == "predict" else ["--strict"]
    r = _analysis(command, str(study), *strict,
                  *extra.get(command, ["--out", str(tmp_path / command)]))
    assert r.returncode == 0, r.stderr[-2000:]
    if command == "predict":
        assert "B_noise" in r.stdout and "diverged: noise.csv" in r.stderr
    if command == "fit":
        for status in STATUSES:
            assert status in r.stdout


def test_watch_takes_every_status(study):
    r = subprocess.run([str(BIN / "lartpc"), "watch", "--once",
                        *[str(p) for p in sorted(study.iterdir())]],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 0, r.stderr[-2000:]
    shown = {c[1]: c[2] for c in ([x.strip() for x in ln.split("│")]
                                  for ln in r.stdout.splitlines() if "│" in ln)}
    # each run's status is shown; the killed one's run.json still says running, but its
    # process (named in run.lock, on this host) is gone
    assert shown == {s: "killed?" if s == "running" else s for s in STATUSES}


def test_fit_says_what_each_status_means(study):
    """The notes of a run that did not end normally; a diverged run's censoring is no
    lower bound of its time to loss, so it stays out of the TTL fit."""
    r = _analysis("fit", str(study), "--strict", "--json", "--no-figures")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    notes = " | ".join(n for m in out["runs"] for n in m["notes"])
    assert "running: run.json says running but its training process is gone" in notes
    assert "failed: ended with an error (" in notes
    assert "diverged: its loss diverged (non-finite)" in notes
    fit = out["models"]["jishnet"]
    runs = {m["name"]: m for m in out["runs"]}
    assert runs["diverged"]["ttl_censored"] and runs["diverged"]["ttl_lower_bound_s"]
    entered = [m for m in runs.values() if not m["ttl_censored"] or (
        m["ttl_lower_bound_s"] and m["status"] != "diverged")]
    assert fit["ttl_fit"]["n_points"] == len(entered) < len(runs)
