"""`lartpc train` on a run folder an earlier job left behind: a restart from step 0 moves
the earlier attempt's leftovers away, and a record it cannot continue is refused on
every rank before any backend starts, naming the file and field.

One completed one-epoch run (module fixture) is copied and altered by each test.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from lartpc.analysis.runs import load_run
from train_helpers import kill_after_steps, run, train_cmd

pytestmark = pytest.mark.slow


def _copy(completed_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    return out


def _info(out) -> dict:
    return json.loads((out / "run.json").read_text())


def _refused(r, message: str) -> None:
    """Exit 2 with ``message`` on one line, no traceback."""
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_restart_from_step_0_moves_an_earlier_attempts_files_away(completed_run,
                                                                  train_events_dir, tmp_path):
    """An attempt on two ranks killed before its first checkpoint, restarted on one and
    killed again before its first evaluation: its eval.csv, confusion.csv and second
    rank's log were read as the new attempt's (times before its start, a rank beyond its
    world size), and the folder could not be analysed."""
    out = _copy(completed_run, tmp_path)
    (out / "checkpoint.pt").unlink()
    # the earlier attempt's second rank: its first rank's rows as rank 1's (the first
    # rank's log goes, so the kill waits for the restart's own rows)
    log = (out / "rank-000.csv").read_text().splitlines(keepends=True)
    rank = log[0].split(",").index("rank")
    (out / "rank-001.csv").write_text(log[0] + "".join(
        ",".join("1" if i == rank else v for i, v in enumerate(row.split(","))) for row in log[1:]))
    (out / "rank-000.csv").unlink()
    old = {n: (out / n).read_bytes() for n in ("eval.csv", "confusion.csv", "rank-001.csv")}
    kill_after_steps(train_cmd(train_events_dir, out, "train.epochs=1"), out, 2)
    loaded = load_run(out)
    assert loaded.world_size == 1 and list(loaded.steps) == [0]
    assert loaded.steps[0]["time"].min() > _info(out)["start_time"]
    (discarded,) = out.glob("discarded-*")
    assert {p.name: p.read_bytes() for p in discarded.iterdir()} == old  # kept whole
    assert not any((out / n).exists() for n in old)


def test_resume_without_run_json_is_refused(completed_run, train_events_dir, tmp_path):
    """A new record would start after the rank logs' rows: analysis refused the folder."""
    out = _copy(completed_run, tmp_path)
    (out / "run.json").unlink()
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"), timeout=120)
    _refused(r, f"{out}: checkpoint.pt but no run.json (the run's record); restore "
                "run.json from a backup to resume, or move checkpoint.pt away")
    assert not (out / "run.json").exists() and (out / "checkpoint.pt").exists()


@pytest.mark.parametrize("resume,field,value,message", [
    (True, "config", None, "missing field 'config' (an object (the run's config))"),
    (True, "segments", {"status": "running"}, "field 'segments' must be a non-empty list "
                                              "of objects, got {'status': 'running'}"),
    (False, "discarded_segments", {"status": "failed"},
     "field 'discarded_segments' must be a list of objects"),
])
def test_run_json_that_cannot_be_continued_is_refused(completed_run, train_events_dir, tmp_path,
                                                      resume, field, value, message):
    out = _copy(completed_run, tmp_path)
    if not resume:
        (out / "checkpoint.pt").unlink()
    info = _info(out)
    if value is None:
        del info[field]
    else:
        info[field] = value
    (out / "run.json").write_text(json.dumps(info))
    before = sorted(p.name for p in out.iterdir())
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"), timeout=120)
    _refused(r, f"{out / 'run.json'}: {message}")
    assert sorted(p.name for p in out.iterdir()) == before  # nothing moved or written
    assert _info(out) == info


def test_complete_run_still_marked_running_is_marked_completed(completed_run, train_events_dir,
                                                               tmp_path):
    """Killed between its last checkpoint and marking the run: the next job found nothing
    to do and exited 0, and the job scripts counted 0 with "running" as a failure."""
    out = _copy(completed_run, tmp_path)
    info = _info(out)
    info.update(status="running", end_time=None, train_time_s=0.0)
    info["segments"][-1].update(status="running", end_time=None)
    (out / "run.json").write_text(json.dumps(info))
    r = run(train_cmd(train_events_dir, out, "train.epochs=1"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "nothing to do" in r.stderr
    now = _info(out)
    assert now["status"] == now["segments"][-1]["status"] == "completed"
    assert now["end_time"] == now["segments"][-1]["end_time"] >= info["start_time"]
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert now["train_time_s"] == saved["train_time_s"] > 0  # the checkpoint's clock
    assert len(now["segments"]) == len(info["segments"])


def test_rank_log_that_is_not_utf8_is_refused_on_resume(completed_run, train_events_dir,
                                                        tmp_path):
    out = _copy(completed_run, tmp_path)
    log = out / "rank-000.csv"
    data = bytearray(log.read_bytes())
    data[data.index(b"\n") + 5] = 0xFF  # in the first row
    log.write_bytes(bytes(data))
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"), timeout=120)
    _refused(r, f"{log}:2: not UTF-8 text (byte 0xff); restore the file from a backup "
                "to resume, or move checkpoint.pt away")
    assert log.read_bytes() == bytes(data)
