"""Live views of a run folder: `lartpc watch` (CSV tails, torn last line, rewrite on
resume) and `python -m analysis curves` on a run that is still going."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from train_helpers import rows, run, train_cmd

from analysis.live import SMOOTH_STEPS, CsvTail, LiveRun
from lartpc.cli import main

HEADER = "time,epoch,rank,batchno,data_size,global_loss,global_acc\n"


@pytest.fixture(scope="module")
def trained(train_events_dir, tmp_path_factory):
    """A finished two-epoch tiny run made by `lartpc train`."""
    out = tmp_path_factory.mktemp("live") / "run"
    r = run(train_cmd(train_events_dir, out))
    assert r.returncode == 0, r.stderr
    return out


def _as_running(src, dst, torn: str):
    """A copy of ``src`` as it looks mid-training: status running, no eval yet, and
    ``torn`` appended to rank 0's CSV without a newline."""
    shutil.copytree(src, dst)
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
    done, running = (ln.split("│") for ln in out.splitlines() if "│ run " in ln
                     or "│ going " in ln)
    steps, loss = _expected(log)
    for cells in (done, running):  # the torn line is not a step yet
        assert cells[3].strip() == steps and cells[5].strip() == loss
    assert done[2].strip() == "completed" and running[2].strip() == "running"
    assert done[4].strip() == "2/2"
    assert done[9].strip() == f"epoch {int(ev['epoch']) + 1}: {float(ev['loss']):.4f} / " \
                              f"{float(ev['accuracy']):.3f}"
    assert running[9].strip() == "-"


@pytest.mark.slow
def test_curves_on_a_run_still_going(trained, tmp_path):
    going = _as_running(trained, tmp_path / "going", torn="1.7e9,1,0,")
    r = subprocess.run([sys.executable, "-m", "analysis", "curves", str(going), "--out",
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


def test_watch_exits_when_no_run_is_running(tmp_path, capsys, monkeypatch):
    p = tmp_path / "run"
    p.mkdir()
    (p / "run.json").write_text(json.dumps({"status": "completed", "world_size": 1}))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["watch", "--interval", "0.01", str(p)]) == 0
    assert main(["watch", str(tmp_path / "missing")]) == 2
    assert "missing: not a folder" in capsys.readouterr().err
