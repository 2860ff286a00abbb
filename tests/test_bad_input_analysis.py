"""Bad input to ``lartpc analyze``, ``watch`` and ``sweep`` ends in one line naming the
option, file or field and exit 2, before anything is written; a file the user made is
never replaced (torch-free, in-process, a few seconds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from lartpc.analysis.__main__ import main as analysis_main
from synthetic_runs import write_synthetic_run

from lartpc.cli import main

ANALYZE = ("fit", "curves", "confusion", "report", "predict")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """Two small runs of one model (1 and 2 GPUs)."""
    root = tmp_path_factory.mktemp("study")
    for n in (1, 2):
        write_synthetic_run(root / f"jishnet-n{n}", model="jishnet", world_size=n,
                            epoch_rate_per_min=0.5 * n, ttl_s=300 / n, dlt_s=20 / n,
                            time_limit_s=600 / n, train_events=700)
    return root


def _refused(capsys, argv: list[str], *names: str) -> str:
    """Run ``lartpc ARGV``: exit 2 and one stderr line naming each of ``names``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in names), err
    return lines[0]


def _analyze(command: str, study: Path, out: Path, *extra: str) -> list[str]:
    more = ["--cluster", "summit"] if command == "predict" else []
    return ["analyze", command, str(study), "--out", str(out), *more, *extra]


@pytest.mark.parametrize("command", ANALYZE)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "-0.5"])
def test_threshold_must_be_a_finite_loss(study, tmp_path, capsys, command, value):
    out = tmp_path / "out"
    _refused(capsys, _analyze(command, study, out, f"--threshold={value}"), "--threshold")
    assert not out.exists()


def test_predict_needs_a_threshold_above_zero(study, tmp_path, capsys):
    """0 is a threshold no run reaches (fit: every TTL censored, as test_analysis_train
    uses it); the noise scale must be read at a loss."""
    out = tmp_path / "out"
    _refused(capsys, _analyze("predict", study, out, "--threshold=0"), "--threshold")
    assert not out.exists()


@pytest.mark.parametrize("command,option,value", [
    ("fit", "--smooth", "0"), ("report", "--smooth", "-3"),
    ("predict", "--span", "0"), ("predict", "--train-events", "0"),
    ("predict", "--base-gpus", "0"), ("predict", "--gpus", "0,4"),
    ("predict", "--alpha-us", "nan"), ("predict", "--compute-ms", "-1"),
])
def test_other_numbers_are_checked_before_any_run_is_read(study, tmp_path, capsys, command,
                                                           option, value):
    out = tmp_path / "out"
    _refused(capsys, _analyze(command, study, out, f"{option}={value}"), option)
    assert not out.exists()


@pytest.mark.parametrize("command", ANALYZE)
def test_out_that_is_a_file_is_refused(study, tmp_path, capsys, command):
    out = tmp_path / "up.h5"
    out.write_bytes(b"mine")
    _refused(capsys, _analyze(command, study, out), "--out", str(out), "not a folder")
    _refused(capsys, _analyze(command, study, out / "sub"), "--out", "not a folder")
    assert out.read_bytes() == b"mine" and sorted(tmp_path.iterdir()) == [out]


def test_python_m_analysis_reports_the_same(study, tmp_path, capsys):
    assert analysis_main(["fit", str(study), "--threshold", "nan", "--no-figures"]) == 2
    assert capsys.readouterr().err.startswith("analysis fit: error: --threshold")


def test_report_never_replaces_a_report_html_it_did_not_write(study, tmp_path, capsys):
    out = tmp_path / "docs"
    out.mkdir()
    (out / "report.html").write_text("<html>my own page</html>")
    _refused(capsys, _analyze("report", study, out), str(out / "report.html"))
    assert [p.name for p in out.iterdir()] == ["report.html"]
    assert (out / "report.html").read_text() == "<html>my own page</html>"


def test_report_regenerates_its_own_files(study, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(_analyze("report", study, out)) == 0
    first = sorted(p.name for p in out.iterdir())
    assert main(_analyze("report", study, out)) == 0  # as `make demo` run again does
    assert sorted(p.name for p in out.iterdir()) == first


def test_confusion_files_of_runs_named_alike_stay_apart(study, tmp_path, capsys):
    """'a b' and 'a_b' both became a_b_confusion.*: the second run replaced the first."""
    runs = tmp_path / "runs"
    shutil.copytree(study / "jishnet-n1", runs / "a b")
    shutil.copytree(study / "jishnet-n2", runs / "a_b")
    out = tmp_path / "conf"
    assert main(["analyze", "confusion", str(runs), "--out", str(out)]) == 0
    assert len(list(out.glob("*.png"))) == 2 and len(list(out.iterdir())) == 8


# -- watch ---------------------------------------------------------------------------

def _run_json(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(text)
    return folder


GOOD = {"status": "running", "world_size": 2, "model": "jishnet", "steps_per_epoch": 10}


@pytest.mark.parametrize("text,field", [
    (json.dumps({**GOOD, "world_size": "abc"}), "'world_size'"),
    (json.dumps({**GOOD, "world_size": 0}), "'world_size'"),
    (json.dumps({**GOOD, "status": 5}), "'status'"),
    (json.dumps({**GOOD, "model": ["x"]}), "'model'"),
    (json.dumps({**GOOD, "steps_per_epoch": "ten"}), "'steps_per_epoch'"),
    (json.dumps({**GOOD, "segments": [{"start_time": "now"}]}), "segments[0].start_time"),
    (json.dumps({**GOOD, "config": {"train": {"epochs": "2"}}}), "config.train.epochs"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_watch_names_the_run_json_and_field_it_cannot_show(tmp_path, capsys, text, field):
    run = _run_json(tmp_path / "r", text)
    _refused(capsys, ["watch", "--once", str(run)], str(run / "run.json"), field)


def test_watch_refuses_a_rank_log_without_the_loss(tmp_path, capsys):
    run = _run_json(tmp_path / "r", json.dumps(GOOD))
    (run / "rank-000.csv").write_text("time,epoch\n1.0,0\n")
    _refused(capsys, ["watch", "--once", str(run)], str(run / "rank-000.csv"),
             "missing column 'data_size'")


@pytest.mark.parametrize("files", [[], ["events-000.h5", "events-001.h5"]])
def test_watch_refuses_a_folder_with_no_run(tmp_path, capsys, files):
    folder = tmp_path / "ev"
    folder.mkdir()
    for f in files:
        (folder / f).write_bytes(b"\x89HDF")
    _refused(capsys, ["watch", "--once", str(folder)], str(folder), "not a run folder")
    assert sorted(p.name for p in folder.iterdir()) == files


def test_watch_shows_a_starting_training_as_pending(tmp_path, capsys, monkeypatch):
    """The training holds run.lock before it writes run.json: pending, not an error,
    given as the run folder or as a folder above it."""
    monkeypatch.setenv("COLUMNS", "200")
    run = tmp_path / "runs" / "jishnet-n1"
    run.mkdir(parents=True)
    (run / "run.lock").write_text("")
    for path in (run, run.parent):
        assert main(["watch", "--once", str(path)]) == 0
        assert "│ jishnet-n1 │ pending" in capsys.readouterr().out


def test_watch_names_a_manifest_point_with_a_bad_gpu_count(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "manifest.json").write_text(json.dumps(
        {"points": [{"name": "jishnet-n1-s0", "model": "jishnet", "gpus": "abc"}]}))
    _refused(capsys, ["watch", "--once", str(sweep)], "manifest.json", "points[0].gpus")


# -- sweep ---------------------------------------------------------------------------

def _sweep(tmp_path: Path, out: Path, *extra: str, scheduler: str = "slurm") -> list[str]:
    launcher = "torchrun" if scheduler == "slurm" else "jsrun"
    (tmp_path / "ev").mkdir(exist_ok=True)
    return ["sweep", "--scheduler", scheduler, "--launcher", launcher, "--models", "jishnet",
            "--gpus", "1", "--data", str(tmp_path / "ev"), "--no-data-check",
            "--out-dir", str(out), *extra]


@pytest.mark.parametrize("scheduler", ["slurm", "lsf"])
@pytest.mark.parametrize("time", ["99:99", "1:60:00", "0:75", "1-2:60", "1-2:03:60", "abc",
                                  "0", "0:00:00", "1:2:3:4", "-5"])
def test_sweep_time_is_one_of_slurms_forms(tmp_path, capsys, scheduler, time):
    out = tmp_path / "runs"
    _refused(capsys, _sweep(tmp_path, out, f"--time={time}", scheduler=scheduler),
             "--time", repr(time))
    assert not out.exists()


@pytest.mark.parametrize("time,slurm,lsf", [
    ("90", "--time=90", "-W 1:30"), ("90:30", "--time=90:30", "-W 1:31"),
    ("4:00:00", "--time=4:00:00", "-W 4:00"), ("2-12", "--time=2-12", "-W 60:00"),
    ("1-2:30", "--time=1-2:30", "-W 26:30"), ("1-02:03:04", "--time=1-02:03:04", "-W 26:04"),
])
def test_sweep_takes_every_slurm_form(tmp_path, capsys, time, slurm, lsf):
    for scheduler, line in (("slurm", f"#SBATCH {slurm}\n"), ("lsf", f"#BSUB {lsf}\n")):
        assert main(_sweep(tmp_path, tmp_path / "runs", f"--time={time}", "--dry-run",
                           scheduler=scheduler)) == 0
        assert line in capsys.readouterr().out


@pytest.mark.parametrize("text,message", [
    ('{"mine": 1}', "not a sweep's manifest"), ("{}", "not a sweep's manifest"),
    ('{"points": [1]}', "not a sweep's manifest"), ("[]", "not a readable sweep manifest"),
    ("{corrupt", "not a readable sweep manifest"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_sweep_never_replaces_a_manifest_that_is_not_a_sweeps(tmp_path, capsys, text,
                                                              message, dry_run):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "manifest.json").write_text(text)
    _refused(capsys, _sweep(tmp_path, out, *["--dry-run"] * dry_run),
             str(out / "manifest.json"), message)
    assert [p.name for p in out.iterdir()] == ["manifest.json"]  # no jobs/, no logs/
    assert (out / "manifest.json").read_text() == text


@pytest.mark.parametrize("under", [False, True])
@pytest.mark.parametrize("dry_run", [False, True])
def test_sweep_out_dir_that_is_a_file_is_named_as_one(tmp_path, capsys, under, dry_run):
    """``--out-dir afile`` (or a folder under it) says afile is a file; it blamed
    ``afile/manifest.json`` as an unreadable manifest to move away."""
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    out = afile / "runs" if under else afile
    line = _refused(capsys, _sweep(tmp_path, out, *["--dry-run"] * dry_run),
                    f"--out-dir {out}: ", "is a file, not a folder")
    assert "manifest" not in line and (not under or f": {afile} is a file" in line)
    assert afile.read_text() == "mine\n"


def test_sweep_adds_to_its_own_manifest(tmp_path, capsys):
    out = tmp_path / "runs"
    for _ in range(2):
        assert main(_sweep(tmp_path, out)) == 0
    doc = json.loads((out / "manifest.json").read_text())
    assert len(doc["sweeps"]) == 2 and [p["name"] for p in doc["points"]] == ["jishnet-n1-s0"]
