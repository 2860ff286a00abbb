"""Live views of a run folder: `lartpc watch` (CSV tails, torn last line, rewrite on
resume) and `python -m lartpc.analysis curves` on a run that is still going."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from lartpc.analysis.live import SMOOTH_STEPS, CsvTail, LiveRun
from train_helpers import BIN, rows, run, train_cmd

from lartpc.cli import main
from lartpc.runfolder.lock import RunLock

HEADER = "time,epoch,rank,batchno,data_size,global_loss,global_acc\n"


@pytest.fixture(scope="module")
def trained(train_events_dir, tmp_path_factory):
    """A finished two-epoch tiny run made by `lartpc train`."""
    out = tmp_path_factory.mktemp("live") / "run"
    r = run(train_cmd(train_events_dir, out))
    assert r.returncode == 0, r.stderr
    return out


_HELD: list[RunLock] = []  # the copies' locks, held as their training would hold them


def _as_running(src, dst, torn: str):
    """A copy of ``src`` as it looks mid-training: status running, its run.lock held
    (here by this process), no eval yet, and ``torn`` appended to rank 0's CSV without
    a newline."""
    shutil.copytree(src, dst)
    _HELD.append(RunLock(dst, time.time()).acquire())
    meta = json.loads((dst / "run.json").read_text())
    meta.update(status="running", end_time=None)
    meta["segments"][-1]["end_time"] = None
    (dst / "run.json").write_text(json.dumps(meta))
    (dst / "eval.csv").unlink()
    (dst / "confusion.csv").unlink()
    with open(dst / "rank-000.csv", "a") as f:
        f.write(torn)
    return dst


def _watch_once(capsys, monkeypatch, *paths) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["watch", "--once", *map(str, paths)]) == 0
    return capsys.readouterr().out


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by run name: the cells between the table's vertical lines."""
    cells = [[c.strip() for c in ln.split("│")] for ln in out.splitlines() if "│" in ln]
    return {c[1]: c for c in cells}


def _expected(log: list[dict]) -> tuple[str, str]:
    tail = log[-SMOOTH_STEPS:]
    loss = sum(float(x["global_loss"]) for x in tail) / len(tail)
    return str(len(log)), f"{loss:.4f}"


@pytest.mark.slow
def test_watch_once_shows_the_csv_numbers(trained, tmp_path, capsys, monkeypatch):
    going = _as_running(trained, tmp_path / "going", torn="1.7e9,1,0,4,7,0.1")
    out = _watch_once(capsys, monkeypatch, trained, going)
    log = rows(trained / "rank-000.csv")
    ev = rows(trained / "eval.csv")[-1]
    cells = _rows(out)
    done, running = cells["run"], cells["going"]
    steps, loss = _expected(log)
    for c in (done, running):  # the torn line is not a step yet
        assert c[3] == steps and c[5] == loss
    assert done[2] == "completed" and running[2] == "running"
    assert done[4] == "2/2"
    assert done[10] == f"epoch {int(ev['epoch']) + 1}: {float(ev['loss']):.4f} / " \
                       f"{float(ev['accuracy']):.3f}"
    assert running[10] == "-"
    assert 0 <= float(done[8].rstrip("%")) <= 100  # data wait, a share of the step time


@pytest.mark.slow
def test_curves_on_a_run_still_going(trained, tmp_path):
    going = _as_running(trained, tmp_path / "going", torn="1.7e9,1,0,")
    r = subprocess.run([sys.executable, "-m", "lartpc.analysis", "curves", str(going), "--out",
                        str(tmp_path / "c")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "c").glob("*.png")) == [
        "epoch_rate_jishnet.png", "loss_jishnet.png", "speedup_jishnet.png",
        "ttl_jishnet.png"]


def test_tail_waits_for_a_torn_line_and_reads_only_the_new_bytes(tmp_path):
    p = tmp_path / "rank-000.csv"
    p.write_text(HEADER + "".join(f"{i}.0,0,0,{i},7,{2 - i / 10},0.5\n" for i in range(5))
                 + "5.0,0,0,5,7,1.")
    tail = CsvTail(p, keep=3)
    assert tail.poll() == 5 and tail.n_rows == 5
    assert [r["global_loss"] for r in tail.rows] == [1.8, 1.7, 1.6]
    with open(p, "a") as f:
        f.write("5,0.5\n")
    assert tail.poll() == 1 and tail.rows[-1]["global_loss"] == 1.5
    assert tail.offset == p.stat().st_size
    assert tail.poll() == 0


def test_tail_rereads_a_rewritten_file(tmp_path):
    p = tmp_path / "rank-000.csv"
    p.write_text(HEADER + "".join(f"{i}.0,0,0,{i},7,1.0,0.5\n" for i in range(6)))
    tail = CsvTail(p)
    assert tail.poll() == 6
    # a resume cuts the log back to the checkpoint through a new file
    tmp = tmp_path / "new.csv"
    tmp.write_text(HEADER + "0.0,0,0,0,7,1.0,0.2\n1.0,0,0,1,7,0.5,0.6\n")
    os.replace(tmp, p)
    tail.poll()
    assert tail.n_rows == 2 and tail.rows[-1]["global_loss"] == 0.5


def test_eta_and_images_per_s(tmp_path):
    p = tmp_path / "run"
    p.mkdir()
    (p / "rank-000.csv").write_text(HEADER + "".join(
        f"{100 + 2 * i}.0,0,0,{i},7,1.0,0.5\n" for i in range(4)))
    meta = {"status": "running", "world_size": 2, "steps_per_epoch": 10,
            "config": {"train": {"epochs": 1, "time_limit_s": 1000.0}},
            "segments": [{"start_time": 90.0, "end_time": None}]}
    (p / "run.json").write_text(json.dumps(meta))
    s = LiveRun(p).snapshot(now=110.0)
    assert s.step == 4 and s.epoch == 0 and s.images_s == pytest.approx(3 * 7 * 2 / 6)
    assert s.eta_s == pytest.approx(6 * 2.0)  # 6 steps left at 2 s, well inside the limit
    meta["config"]["train"]["time_limit_s"] = 25.0
    (p / "run.json").write_text(json.dumps(meta))
    assert LiveRun(p).snapshot(now=110.0).eta_s == pytest.approx(5.0)


def test_watch_exits_when_its_training_was_killed(train_events_dir, tmp_path):
    """A training killed (SIGKILL) after its first steps leaves run.json saying running:
    watch shows it killed (its run.lock names a process of this host that is gone) and
    exits instead of waiting for it."""
    out = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(train_events_dir, out, "train.epochs=1000"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "rank-000.csv"
    try:
        deadline = time.monotonic() + 300
        while not (log.exists() and rows(log)) and proc.poll() is None:
            assert time.monotonic() < deadline, "no step logged in 300 s"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert rows(log), "the training ended before its first step"
    snap = LiveRun(out).snapshot()
    assert (snap.status, snap.active) == ("killed?", False)
    r = run([str(BIN / "lartpc"), "watch", "--interval", "0.05", str(out)], timeout=120,
            COLUMNS="200")  # before: it waited for the dead run for ever
    assert r.returncode == 0, r.stderr
    assert _rows(r.stdout)["run"][2] == "killed?"


def test_watch_exits_when_no_run_is_running(tmp_path, capsys, monkeypatch):
    p = tmp_path / "run"
    p.mkdir()
    (p / "run.json").write_text(json.dumps({"status": "completed", "world_size": 1}))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["watch", "--interval", "0.01", str(p)]) == 0
    assert main(["watch", "--wait", "0", str(tmp_path / "missing")]) == 2
    assert "missing: no such file or directory" in capsys.readouterr().err


def test_watch_waits_for_a_run_that_is_about_to_start(tmp_path, capsys, monkeypatch):
    """A training launched a moment before makes its folder and lock only after its
    imports: watch waits for it (``--wait``), then shows it; a RUN still missing after
    the wait is the error it was, saying how long it waited."""
    import threading

    monkeypatch.setenv("COLUMNS", "200")
    run_dir = tmp_path / "runs" / "scnet-n1"

    def start():
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"status": "completed",
                                                      "world_size": 1}))

    timer = threading.Timer(0.3, start)
    timer.start()
    try:
        assert main(["watch", "--interval", "0.05", "--wait", "30", str(run_dir)]) == 0
    finally:
        timer.join()
    out, err = capsys.readouterr()
    assert "waiting up to 30 s for a training to start" in err
    assert "scnet-n1" in out and "completed" in out
    assert main(["watch", "--interval", "0.05", "--wait", "0.2",
                 str(tmp_path / "never")]) == 2
    assert "never: no such file or directory (waited 0.2 s for a training to start " \
        "there)" in capsys.readouterr().err
    store = tmp_path / "events"  # a folder of something else: no run will start there
    store.mkdir()
    (store / "events-00000.h5").write_bytes(b"\x89HDF")
    assert main(["watch", "--interval", "0.05", "--wait", "30", str(store)]) == 2
    err = capsys.readouterr().err
    assert "not a run folder" in err and "waiting" not in err, err
    assert main(["watch", "--wait", "-1", str(run_dir)]) == 2
    assert "--wait must be >= 0 seconds" in capsys.readouterr().err


def test_eta_reads_the_current_segments_time_limit(tmp_path):
    p = tmp_path / "run"
    p.mkdir()
    (p / "rank-000.csv").write_text(HEADER + "".join(
        f"{100 + 2 * i}.0,0,0,{i},7,1.0,0.5\n" for i in range(4)))
    seg = {"start_time": 90.0, "end_time": None,
           "settings": {"train.time_limit_s": 25.0, "train.epochs": 3}}
    meta = {"status": "running", "world_size": 1, "steps_per_epoch": 10,
            "config": {"train": {"epochs": 1, "time_limit_s": 1000.0}},
            "segments": [{"start_time": 0.0, "end_time": 50.0, "status": "time_limit"}, seg]}
    (p / "run.json").write_text(json.dumps(meta))
    s = LiveRun(p).snapshot(now=110.0)
    assert s.eta_s == pytest.approx(5.0) and s.epochs == 3  # 25 s from the 2nd start
    assert s.data_wait is None  # an old log without the timing columns


def _sweep(root, points: list[str]):
    """A sweep output folder whose manifest lists ``points`` (names model-nN-sS)."""
    root.mkdir()
    pts = []
    for name in points:
        model, n, seed = name.split("-")
        pts.append({"model": model, "gpus": int(n[1:]), "seed": int(seed[1:]),
                    "name": name, "run": f"/cluster/study/{name}", "job_id": None})
    (root / "manifest.json").write_text(json.dumps({"points": pts}))
    (root / "logs").mkdir()
    return root


def test_find_run_dirs_lists_pending_sweep_points(tmp_path):
    from lartpc.analysis.runs import RunFolderError, find_run_dirs

    root = _sweep(tmp_path / "runs", ["jishnet-n1-s0", "jishnet-n2-s0", "scnet-n1-s0"])
    (root / "jishnet-n1-s0").mkdir()
    (root / "jishnet-n1-s0" / "run.json").write_text("{}")
    (root / "jishnet-n2-s0").mkdir()  # the job made its folder, no run.json yet
    empty = tmp_path / "later"
    empty.mkdir()
    pending = []
    found = find_run_dirs([root, empty], pending=pending)
    assert found == [(root / "jishnet-n1-s0").resolve()]
    assert pending == [(root / n).resolve() for n in ("jishnet-n2-s0", "scnet-n1-s0")] + \
        [empty.resolve()]
    with pytest.raises(RunFolderError, match="no run.json found below it"):
        find_run_dirs([empty])  # the analysis commands still need a run


@pytest.fixture(scope="module")
def preempted(train_events_dir, tmp_path_factory):
    """A tiny run stopped by SIGTERM after 3 steps (status preempted)."""
    import signal
    import time

    from train_helpers import clean_env

    out = tmp_path_factory.mktemp("live") / "preempted"
    # epochs enough that it cannot complete before the signal lands on a busy host
    proc = subprocess.Popen(train_cmd(train_events_dir, out, "train.epochs=1000"),
                            env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        log = out / "rank-000.csv"
        while not (log.exists() and len(log.read_text().splitlines()) > 3):
            assert time.monotonic() < deadline and proc.poll() is None, "no steps logged"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((out / "run.json").read_text())["status"] == "preempted"
    return out


@pytest.mark.slow
def test_watch_once_on_a_sweep_at_80_columns(trained, preempted, tmp_path):
    root = _sweep(tmp_path / "runs", ["jishnet-n1-s0", "jishnet-n1-s1", "jishnet-n1-s2",
                                      "jishnet-n2-s0", "scnet-n1-s0"])
    shutil.copytree(trained, root / "jishnet-n1-s0")
    _as_running(trained, root / "jishnet-n1-s1", torn="")
    shutil.copytree(preempted, root / "jishnet-n1-s2")
    (root / "scnet-n1-s0").mkdir()  # started, nothing written yet; jishnet-n2-s0: no folder
    r = run([sys.executable, "-m", "lartpc.cli", "watch", "--once", str(root)],
            timeout=120, COLUMNS="80")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines), r.stdout
    cells = _rows(r.stdout)
    status = {name: c[2] for name, c in cells.items()}
    assert status == {"jishnet-n1-s0": "completed", "jishnet-n1-s1": "running",
                      "jishnet-n1-s2": "preempted", "jishnet-n2-s0": "pending",
                      "scnet-n1-s0": "pending"}, r.stdout
    assert list(cells) == sorted(status)  # by model, then world size (then name)
    header = next(ln for ln in lines if "┃ run" in ln)
    assert all(h in header for h in ("status", "step", "loss", "img/s", "wait", "ETA"))
    steps = len(rows(trained / "rank-000.csv"))
    assert cells["jishnet-n1-s0"][3] == str(steps)
    assert cells["jishnet-n1-s2"][3] == str(len(rows(preempted / "rank-000.csv")))
    assert cells["jishnet-n2-s0"][3] == "-"
    missing = run([sys.executable, "-m", "lartpc.cli", "watch", "--once",
                   str(tmp_path / "nope")], timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [
        f"lartpc watch: error: {tmp_path / 'nope'}: no such file or directory"]


@pytest.mark.parametrize("width", [200, 80, 60, 40, 32])
def test_narrow_terminals_keep_run_and_status(width):
    from lartpc.analysis.live import Snapshot
    from rich.console import Console

    from lartpc.commands.watch import table

    snaps = [Snapshot(name=f"jishnet-n{n}-s0", status=st, step=120, epoch=3, epochs=40,
                      loss=1.25, acc=0.5, images_s=1234.5, eta_s=3600.0, eval_epoch=2,
                      eval_loss=1.3, eval_acc=0.45, data_wait=0.12)
             for n, st in ((1, "time_limit"), (2, "running"))]
    console = Console(width=width, record=True)
    console.print(table(snaps, width))
    out = console.export_text()
    assert "…" not in out and max(map(len, out.splitlines())) <= width
    for s in snaps:
        assert f"│ {s.name} │ {s.status}" in out
    assert ("1:00:00" in out) == (width >= 80) and ("epoch 3: 1.3000" in out) == (width >= 120)


def test_meta_of_a_torn_run_json_is_the_last_whole_one(tmp_path):
    live = LiveRun(tmp_path / "run")
    assert live.meta() == {}  # no folder yet
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"status": "running"}')
    assert live.meta() == {"status": "running"}
    (tmp_path / "run" / "run.json").write_text('{"status": "compl')  # a copy in progress
    assert live.meta() == {"status": "running"}
