"""Hostile and careless run folders: each is refused with the file and field named, or
tolerated with a note, and never miscounted; a study survives one dead job; names from
files never leave ``--out``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from lartpc.analysis.__main__ import main
from lartpc.analysis.metrics import run_metrics
from lartpc.analysis.runcheck import safe_name
from lartpc.analysis.runs import RunFolderError, load_run
from synthetic_runs import requeue, write_synthetic_run

RATE, TTL, DLT = 0.5, 200.0, 20.0


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return write_synthetic_run(tmp_path_factory.mktemp("clean") / "run", model="jishnet",
                               world_size=1, epoch_rate_per_min=RATE, ttl_s=TTL, dlt_s=DLT,
                               time_limit_s=300, train_events=500, loss_noise=0.0)


@pytest.fixture
def run(clean, tmp_path) -> Path:
    return Path(shutil.copytree(clean, tmp_path / "run"))


def _meta(folder: Path, **changes) -> dict:
    meta = json.loads((folder / "run.json").read_text())
    meta.update(changes)
    for k in [k for k, v in changes.items() if v is ...]:
        del meta[k]
    (folder / "run.json").write_text(json.dumps(meta))
    return meta


def _set(path: Path, row: int, column: str, value: str) -> None:
    """Replace one cell (row 0 = first data row) of a CSV, keeping every other byte."""
    lines = path.read_text().splitlines()
    cols = lines[0].split(",")
    cells = lines[row + 1].split(",")
    cells[cols.index(column)] = value
    lines[row + 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def test_duplicated_steps_do_not_inflate_the_epoch_rate(run, clean):
    """A second writer appended half the steps again: the rate is the clean run's."""
    ref = run_metrics(load_run(clean), smooth=1)
    csv = run / "rank-000.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join(lines) + "".join(lines[1 + len(lines) // 2:]))
    r = load_run(run)
    m = run_metrics(r, smooth=1)
    assert len(r.steps[0]) == ref.n_steps == len(lines) - 1
    assert m.epoch_rate_per_min == pytest.approx(ref.epoch_rate_per_min, rel=1e-12)
    assert m.epoch_rate_per_min == pytest.approx(RATE, rel=1e-3)
    assert m.ttl_s == ref.ttl_s
    assert any("repeat an (epoch, batchno)" in n for n in m.notes)


@pytest.mark.parametrize("file, row, column, value, message", [
    ("rank-000.csv", 4, "time", "-5", r"rank-000\.csv:6: column 'time'.*not a time after"),
    ("rank-000.csv", 4, "time", "1000", r"rank-000\.csv:6: column 'time'.*not a time after"),
    ("rank-000.csv", 2, "batchno", "9" * 30, r"rank-000\.csv:4: column 'batchno'.*2\*\*53"),
    ("rank-000.csv", 2, "batchno", "500", r"rank-000\.csv:4: column 'batchno'.*below "
                                          r"steps_per_epoch 72"),
    ("rank-000.csv", 3, "epoch", "-1", r"rank-000\.csv:5: column 'epoch'.*negative"),
    ("rank-000.csv", 3, "global_acc", "2.5", r"rank-000\.csv:5: column 'global_acc'.*\[0, 1\]"),
    ("rank-000.csv", 3, "comm_s", "-0.1", r"rank-000\.csv:5: column 'comm_s'.*duration"),
    ("eval.csv", 0, "accuracy", "2.5", r"eval\.csv:2: column 'accuracy'.*\[0, 1\]"),
    ("eval.csv", 0, "n_events", "-5", r"eval\.csv:2: column 'n_events'.*negative"),
    ("eval.csv", 0, "acc_muon", "-0.5", r"eval\.csv:2: column 'acc_muon'.*\[0, 1\]"),
    ("eval.csv", 0, "time", "-3", r"eval\.csv:2: column 'time'.*not a time after"),
])
def test_impossible_values_are_refused(run, file, row, column, value, message):
    _set(run / file, row, column, value)
    with pytest.raises(RunFolderError, match=message):
        load_run(run)


@pytest.mark.parametrize("changes, message", [
    ({"steps_per_epoch": 10 ** 9}, r"'steps_per_epoch' is 1000000000, but 500 train_events "
                                   r"in batches of 7 on 1 rank\(s\) give between 72 and 72"),
    ({"steps_per_epoch": 1e9}, r"'steps_per_epoch' must be a positive integer"),
    ({"start_time": -5}, r"'start_time' must be unix seconds"),
    ({"start_time": 10 ** 400}, r"'start_time' must be unix seconds"),
    ({"world_size": 10 ** 400}, r"'world_size' must be an integer in 1\.\.1000000"),
    ({"train_events": 10 ** 400}, r"'train_events' must be an integer"),
    ({"end_time": 5.0}, r"'end_time' must be null or unix seconds not before start_time"),
    ({"segments": 5}, r"'segments' must be a list"),
    ({"segments": [5]}, r"segments\[0\] must be an object"),
    ({"segments": [{"start_time": "x"}]}, r"segments\[0\]\.start_time must be unix seconds"),
    ({"segments": [{"start_time": 1.7e9, "end_time": 1.0}]}, r"segments\[0\]\.end_time"),
    ({"model": "/../../X"}, r"field 'model' must be a model name"),
])
def test_impossible_run_json_is_refused(run, changes, message):
    _meta(run, **changes)
    with pytest.raises(RunFolderError, match=message):
        load_run(run)


@pytest.mark.parametrize("name, data, message", [
    ("rank-000.csv", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"rank-000\.csv: binary data"),
    ("eval.csv", "epoch,time\n1,\xe9\n".encode("latin-1"), r"eval\.csv: not UTF-8"),
    ("confusion.csv", b"\xff\xfe\x00t\x00r", r"confusion\.csv: binary data"),
    ("run.json", b"\xff\xfe{", r"run\.json: not UTF-8"),
])
def test_binary_files_are_clear_errors(run, capsys, name, data, message):
    (run / name).write_bytes(data)
    with pytest.raises(RunFolderError, match=message):
        load_run(run)
    assert main(["fit", str(run)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_torn_final_line_is_dropped_with_a_note(run, clean, capsys):
    csv = run / "rank-000.csv"
    n = len(csv.read_text().splitlines()) - 1
    csv.write_text(csv.read_text() + "1700000299.5,3,0,1")  # a kill mid-write
    r = load_run(run)
    assert len(r.steps[0]) == n
    assert r.notes == [f"{csv}:{n + 2}: ignored a torn final line (no newline: the run is "
                       "being written or was killed mid-write)"]
    m, ref = run_metrics(r, smooth=1), run_metrics(load_run(clean), smooth=1)
    assert (m.epoch_rate_per_min, m.ttl_s) == (ref.epoch_rate_per_min, ref.ttl_s)
    assert main(["fit", str(run)]) == 0
    assert "torn final line" in capsys.readouterr().out


def test_a_run_still_being_written_draws_curves(run, tmp_path, capsys):
    """No eval.csv yet, status running, a half-written row: `curves` works."""
    (run / "eval.csv").unlink()
    (run / "confusion.csv").unlink()
    _meta(run, status="running", end_time=None)
    (run / "rank-000.csv").write_text((run / "rank-000.csv").read_text() + "17000002")
    assert main(["curves", str(run), "--out", str(tmp_path / "c")]) == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "epoch_rate_jishnet.png", "loss_jishnet.png", "speedup_jishnet.png",
        "ttl_jishnet.png"]
    assert "torn final line" in capsys.readouterr().err


def test_a_study_survives_a_job_that_failed_in_set_up(clean, tmp_path, capsys):
    study = tmp_path / "study"
    for n in (1, 2, 4):
        write_synthetic_run(study / f"n{n}", model="jishnet", world_size=n,
                            epoch_rate_per_min=RATE * n ** 0.9, ttl_s=TTL * n ** -0.7,
                            dlt_s=DLT, time_limit_s=300, train_events=500, seed=n)
    dead = study / "n8"
    dead.mkdir()
    meta = json.loads((study / "n4" / "run.json").read_text())
    for key in ("steps_per_epoch", "train_events", "eval_events"):
        del meta[key]
    meta.update(world_size=8, status="failed")
    (dead / "run.json").write_text(json.dumps(meta))
    assert main(["fit", str(study), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["world_size"] for r in doc["runs"]] == [1, 2, 4]
    assert doc["models"]["jishnet"]["epoch_rate_exponent"] == pytest.approx(0.9, abs=0.01)
    assert doc["skipped"] == [f"{dead / 'run.json'}: missing field 'steps_per_epoch' (a "
                              "positive integer); the run never started training (status "
                              "'failed': it failed or was killed during set-up)"]
    assert main(["fit", str(study)]) == 0
    assert "note: skipped: " + doc["skipped"][0] in capsys.readouterr().out
    assert main(["fit", str(study), "--strict"]) == 2
    assert "missing field 'steps_per_epoch'" in capsys.readouterr().err
    assert main(["report", str(study), "--out", str(tmp_path / "rep")]) == 0
    assert "never started training" in (tmp_path / "rep" / "report.html").read_text()


def test_ttl_of_a_requeued_run_excludes_the_queue_wait(run, clean):
    """5000 s in the queue between two jobs: TTL counts the run's own wall time."""
    ref = run_metrics(load_run(clean), smooth=1, clock="wall")
    skew = 0.26
    requeue(run, after=40, wait_s=5000.0, restart_s=3.0, skew_s=skew)
    m = run_metrics(load_run(run), smooth=1, clock="wall")
    # on the training clock (the default) neither the wait nor the start-up counts (the
    # rewritten log rounds each duration to 1 ms)
    assert run_metrics(load_run(run), smooth=1).ttl_s == pytest.approx(
        run_metrics(load_run(clean), smooth=1).ttl_s, abs=0.1)
    assert m.queue_wait_s == pytest.approx(5000.0 - skew, abs=1e-6)
    # own time adds the first job's last 0.1 s and the second job's 3 s start-up, less
    # the normal step interval they replace; the only error is the start-time skew
    dt = 60 / (RATE * 72)
    assert m.ttl_s == pytest.approx(ref.ttl_s + 0.1 + 3.0 - dt + skew, abs=2e-3)
    assert m.ttl_s < ref.ttl_s + 3.1 + 1.0  # 5,000 s more before
    assert m.epoch_rate_per_min == pytest.approx(RATE, rel=1e-3)
    assert any("5000 s waiting between job segments excluded from TTL" in n
               for n in m.notes)


def test_restart_found_despite_a_skewed_segment_clock(run):
    """A restart within a second, its start recorded 0.26 s early (before the last step
    of the first job): the restart interval is excluded, not the normal step before it."""
    requeue(run, after=40, wait_s=0.0, restart_s=2.5, skew_s=0.26)
    m = run_metrics(load_run(run), smooth=1, clock="wall")
    assert m.epoch_rate_per_min == pytest.approx(RATE, rel=1e-3)


def test_safe_name_never_leaves_the_folder(tmp_path):
    for bad in ("/../../X", "..", "../..", "a/../../b", "\x00x", "C:\\win", ". .", ""):
        name = safe_name(bad)
        assert "/" not in name and "\\" not in name and not name.startswith(".")
        assert (tmp_path / name).resolve().parent == tmp_path.resolve()
    assert safe_name("loss_/../../X.png") == "loss__.._.._X.png"
    assert safe_name("scnet-n004-s0") == "scnet-n004-s0"


def test_report_with_a_hostile_model_writes_only_under_out(run, tmp_path):
    """run.json model '/../../X' used to be a path in --out: the run is skipped and
    nothing is written outside --out."""
    good = write_synthetic_run(tmp_path / "study" / "ok", model="scnet", world_size=1,
                               epoch_rate_per_min=RATE, ttl_s=TTL, dlt_s=DLT,
                               time_limit_s=300, train_events=500)
    shutil.move(run, good.parent / "evil")
    _meta(good.parent / "evil", model="/../../X")
    out = tmp_path / "deep" / "er" / "out"
    before = set(tmp_path.rglob("*"))
    assert main(["report", str(good.parent), "--out", str(out)]) == 0
    made = set(tmp_path.rglob("*")) - before
    assert made and all(p == out or out in p.parents or p in out.parents for p in made)
    html = (out / "report.html").read_text()
    assert "field &#x27;model&#x27; must be a model name" in html
    assert np.isin(["loss_scnet.png", "epoch_rate_scnet.png"],
                   [p.name for p in out.iterdir()]).all()


def test_confusion_of_a_run_folder_with_a_hostile_name(run, tmp_path, capsys):
    """Folder names are input too: '$' (matplotlib mathtext) and spaces are harmless."""
    odd = run.rename(run.parent / "r $x^$ 1")
    assert main(["confusion", str(odd), "--out", str(tmp_path / "m")]) == 0
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        f"r__x___1_confusion{s}" for s in (".md", ".png", "_counts.csv", "_percent.csv")]
    assert "### jishnet, 1 GPU, seed 0" in capsys.readouterr().out
