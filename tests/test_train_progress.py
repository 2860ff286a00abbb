"""Rank 0's progress line: its numbers (fake clock) and a real two-rank training's log."""

from __future__ import annotations

import logging
import math
import re

import pytest
from train_helpers import BIN, rows, run, train_cmd

from lartpc.train.progress import ConsoleProgress, NoProgress, duration, open_progress

LINE = re.compile(
    r"\[rank (?P<rank>\d+)\] INFO lartpc\.train\.progress: step (?P<step>\d+)/(?P<steps>\d+)"
    r"  epoch (?P<epoch>[\d.]+)/(?P<epochs>\d+)  loss (?P<loss>\S+)  acc (?P<acc>\S+)"
    r"  (?P<images_s>\S+) images/s  step (?P<step_s>\S+) s = data (?P<data_s>\S+) "
    r"\((?P<share>\d+)%\) \+ compute (?P<compute_s>\S+) \+ comm (?P<comm_s>\S+)"
    r"  time left (?P<left>\d+:\d\d:\d\d)  finish in (?P<finish>\d+:\d\d:\d\d)")


def _seconds(hms: str) -> int:
    h, m, s = map(int, hms.split(":"))
    return 3600 * h + 60 * m + s


@pytest.fixture
def lines(caplog, monkeypatch):
    """The progress records, also after ``lartpc.logs.setup_logging`` stopped the
    package's loggers from propagating (another test ran a command in this process)."""
    monkeypatch.setattr(logging.getLogger("lartpc"), "propagate", True)
    caplog.set_level("INFO", logger="lartpc.train.progress")
    return caplog


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_line_numbers_and_interval(lines):
    clock = Clock()
    p = ConsoleProgress(every_s=10.0, steps_per_epoch=4, epochs=3, time_limit_s=600.0,
                        process_start=900.0, start_step=2, bar=False, clock=clock)
    p.on_eval(5.0)
    for step, loss in ((3, 1.0), (4, 2.0)):  # step 4 ends epoch 1: a line at once
        clock.t += 2.0
        p.on_step(step, loss=loss, acc=0.5, images=14, data_s=0.5, compute_s=1.0,
                  comm_s=0.5)
    s = p.stats(clock.t)
    assert s["epoch"] == pytest.approx(4 / 4) and s["loss"] == pytest.approx(1.5)
    assert s["images_s"] == pytest.approx(14 / 2.0) and s["data_share"] == pytest.approx(0.25)
    assert s["time_left_s"] == pytest.approx(600.0 - 104.0)
    assert s["finish_s"] == pytest.approx(8 * 2.0 + 2 * 5.0)  # 8 steps, 2 evaluations
    assert len(lines.records) == 1
    assert lines.records[0].getMessage().startswith("step 4/12  epoch 1.00/3  loss 1.5000")
    clock.t += 9.0  # 9 s after the last line: none yet
    p.on_step(5, loss=1.0, acc=0.5, images=14, data_s=0.5, compute_s=1.0, comm_s=0.5)
    clock.t += 1.0
    p.on_step(6, loss=1.0, acc=0.5, images=14, data_s=0.5, compute_s=1.0, comm_s=0.5)
    assert len(lines.records) == 2 and "step 6/12  epoch 1.50/3" in lines.records[1].message
    assert "time left 0:08:06  finish in 0:00:22" in lines.records[1].message


def test_zero_interval_prints_only_at_epoch_ends(lines):
    clock = Clock()
    p = ConsoleProgress(every_s=0.0, steps_per_epoch=3, epochs=2, time_limit_s=math.inf,
                        process_start=0.0, bar=False, clock=clock)
    for step in range(1, 7):
        clock.t += 100.0
        p.on_step(step, loss=1.0, acc=0.5, images=7, data_s=0.0, compute_s=1.0, comm_s=0.0)
    msgs = [r.getMessage() for r in lines.records]
    assert [m.split("  ")[1] for m in msgs] == ["epoch 1.00/2", "epoch 2.00/2"]
    assert "time left no limit" in msgs[0]


def test_other_ranks_print_nothing():
    from lartpc.config import Config

    assert isinstance(open_progress(Config(), False, 5, 0.0, 0), NoProgress)
    assert isinstance(open_progress(Config(), True, 5, 0.0, 0), ConsoleProgress)
    assert duration(3725.4) == "1:02:05" and duration(-1.0) == "-"


@pytest.mark.slow
@pytest.mark.horovod
def test_two_rank_training_logs_progress_from_rank_0(train_events_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           *train_cmd(train_events_dir, out, "train.progress_every_s=0")]
    r = run(cmd, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = r.stdout + r.stderr
    assert "lartpc.train.progress" in text
    found = [LINE.search(ln) for ln in text.splitlines() if "lartpc.train.progress" in ln]
    assert all(found), [ln for ln in text.splitlines() if "train.progress" in ln]
    assert {m["rank"] for m in found} == {"0"}, text  # rank 1 prints no progress line
    # train.progress_every_s=0: one line at the end of each of the 2 epochs
    assert [m["epoch"] for m in found] == ["1.00", "2.00"], text
    log, log1 = rows(out / "rank-000.csv"), rows(out / "rank-001.csv")
    spe = len(log) // 2
    assert [int(m["step"]) for m in found] == [spe, 2 * spe]
    for m in found:
        nums = {k: float(m[k]) for k in ("images_s", "step_s", "data_s", "compute_s",
                                         "comm_s", "loss", "acc")}
        assert all(math.isfinite(v) for v in nums.values())
        assert nums["images_s"] > 0 and nums["step_s"] > 0 and nums["loss"] > 0
        assert nums["step_s"] == pytest.approx(
            nums["data_s"] + nums["compute_s"] + nums["comm_s"], abs=2.5e-3)
        # global images/s: both ranks' events (their short last batches may differ) per
        # rank 0's step time, as the two CSVs have them
        tail = log[:int(m["step"])][-20:]
        step_s = sum(float(x[c]) for x in tail for c in ("data_s", "compute_s", "comm_s"))
        images = sum(int(x["data_size"]) for x in (*tail, *log1[:int(m["step"])][-20:]))
        assert float(m["images_s"]) == pytest.approx(images / step_s, rel=1e-2, abs=0.1)
        left = _seconds(m["left"])
        assert 0 < left <= 900  # the tiny preset's train.time_limit_s, from process start
    assert _seconds(found[-1]["finish"]) == 0
