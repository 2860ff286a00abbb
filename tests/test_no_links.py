"""Nothing under an output folder is read or written through a link the project did
not make (issue 38: N1 a rank log, N2 a report's confusion/, N3 a sweep's jobs/ and
logs/, N4 TensorBoard's tb/ swapped after the first check), through the shared helpers
of lartpc.fsutil."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lartpc.analysis.__main__ import main as analysis_main
from synthetic_runs import write_synthetic_run

from lartpc.cli import main
from lartpc.fsutil import UnsafePathError
from lartpc.runfolder import tables
from lartpc.train import tblog

SECRET = "secret,do,not,copy\n"


def _secret(path: Path, text: str = SECRET) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _run(tmp_path: Path) -> Path:
    return write_synthetic_run(tmp_path / "runs" / "run", model="jishnet", world_size=1,
                               epoch_rate_per_min=0.5, ttl_s=200, dlt_s=20,
                               time_limit_s=300, train_events=500)


def test_rank_log_replaced_by_a_link_is_not_read_on_resume(tmp_path):
    """N1: rank-000.csv replaced by a link to a mode-600 file: the resume copied the
    file's lines into the run folder (mode 644)."""
    run = _run(tmp_path)
    log = run / "rank-000.csv"
    secret = _secret(tmp_path / "SECRET", log.read_text())  # enough rows to resume on
    log.unlink()
    log.symlink_to(secret)
    refused = f"{log}: is a symbolic link; refusing to read through it"
    with pytest.raises(UnsafePathError, match=refused):
        tables.kept_rows(log, 5)  # the resume's check of the log
    with pytest.raises(UnsafePathError, match=refused):
        tables.StepLog(run, 0, keep_steps=5)
    assert log.is_symlink() and (secret.stat().st_mode & 0o777) == 0o600
    assert [p for p in run.iterdir() if p.is_file() and not p.is_symlink()
            and secret.read_text() in p.read_text()] == []


def test_report_refuses_a_linked_confusion_folder(tmp_path, capsys):
    """N2: REP/confusion planted as a link: the report replaced the csv in the folder it
    points to."""
    run = _run(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    mine = _secret(victim / "run_confusion_percent.csv")
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "confusion").symlink_to(victim, target_is_directory=True)
    assert analysis_main(["report", str(run.parent), "--out", str(rep)]) == 2
    err = capsys.readouterr().err
    assert f"{rep / 'confusion'}: the confusion folder is a symbolic link" in err
    assert err.count("\n") == 1, err
    assert mine.read_text() == SECRET and os.listdir(victim) == [mine.name]
    assert os.listdir(rep) == ["confusion"]  # refused before anything was written


def _sweep(out_dir: Path, data: Path) -> int:
    return main(["sweep", "--data", str(data), "--out-dir", str(out_dir), "--models",
                 "jishnet", "--gpus", "1", "--scheduler", "slurm", "--launcher", "horovod",
                 "--no-data-check"])


@pytest.mark.parametrize("sub", ["jobs", "logs"])
def test_sweep_refuses_linked_jobs_and_logs_folders(tmp_path, capsys, sub):
    """N3: --out-dir/jobs a link: a script there was overwritten and made mode 755 (and
    a logs/ link would have the scheduler write the job logs through it)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    mine = _secret(victim / "jishnet-n1-s0.sbatch")
    out = tmp_path / "runs"
    out.mkdir()
    (out / sub).symlink_to(victim, target_is_directory=True)
    assert _sweep(out, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{out / sub}: the sweep's {sub} folder is a symbolic link" in err
    assert mine.read_text() == SECRET and (mine.stat().st_mode & 0o777) == 0o600
    assert os.listdir(victim) == [mine.name] and os.listdir(out) == [sub]
    (out / sub).unlink()  # the same sweep into a clean folder writes its script
    assert _sweep(out, tmp_path) == 0
    assert (out / "jobs" / "jishnet-n1-s0.sbatch").read_text().startswith("#!")


def test_tensorboard_folder_linked_before_the_writer_is_refused(tmp_path):
    """N4, first half: tb/ a link when rank 0 opens the writer (after the lock)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "tb").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="the TensorBoard folder is a symbolic link"):
        tblog.open_tblog(True, True, run, 0)
    assert os.listdir(elsewhere) == []


def test_tensorboard_folder_swapped_for_a_link_while_training_gets_nothing(tmp_path):
    """N4: tb/ swapped for a link after the writer started: TensorBoard reopens its event
    file by name for every write, so the later events went through the link."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    tb = tblog.open_tblog(True, True, run, 0)
    tb.step(0, loss=1.6, acc=0.2, lr=1e-3, images=7, step_s=0.5, data_s=0.1)
    tb.flush()
    moved = tmp_path / "tb-moved"
    os.rename(run / "tb", moved)
    (run / "tb").symlink_to(elsewhere, target_is_directory=True)
    for step, loss in ((1, 1.5), (2, 1.4)):
        tb.step(step, loss=loss, acc=0.3, lr=1e-3, images=7, step_s=0.5, data_s=0.1)
    tb.close()
    assert os.listdir(elsewhere) == []
    acc = EventAccumulator(str(moved), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("train/loss")] == \
        [(0, 1.6), (1, 1.5), (2, 1.4)]


def test_the_users_own_link_as_output_folder_is_followed(events_dir, tmp_path):
    """The one link followed: the folder the user named (resolved once, so the files
    below it are still checked)."""
    real = tmp_path / "disk"
    real.mkdir()
    plots = tmp_path / "plots"
    plots.symlink_to(real, target_is_directory=True)
    assert main(["display", str(events_dir), "--event", "0", "--out",
                 str(plots / "ev.png")]) == 0
    assert (real / "ev.png").read_bytes().startswith(b"\x89PNG")
    run = _run(tmp_path)
    assert analysis_main(["report", str(run.parent), "--out", str(plots)]) == 0
    assert (real / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (real / "confusion" / "run_confusion.png").is_file()
    assert plots.is_symlink()


def test_run_record_replaced_by_a_link_is_not_read(tmp_path):
    """run.json replaced by a link to someone's JSON: a resume would have taken it as
    the record and rewritten it into the run folder, mode 644."""
    from lartpc.runfolder.record import peek_record, read_record
    from lartpc.runfolder.schema import RunFolderError

    run = _run(tmp_path)
    secret = _secret(tmp_path / "SECRET.json", (run / "run.json").read_text())
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(secret)
    with pytest.raises(RunFolderError, match="run.json: is a symbolic link; refusing to "
                                             "read through it"):
        read_record(run)
    assert peek_record(run) is None


def test_analysis_does_not_read_run_files_replaced_by_links(tmp_path, capsys):
    """A run's confusion.csv replaced by a link to someone's table: its numbers went
    into the report. Now the run is skipped with a note (or refused under --strict)."""
    run = _run(tmp_path)
    secret = _secret(tmp_path / "SECRET.csv", (run / "confusion.csv").read_text())
    (run / "confusion.csv").unlink()
    (run / "confusion.csv").symlink_to(secret)
    rep = tmp_path / "rep"
    assert analysis_main(["report", str(run.parent), "--out", str(rep), "--strict"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'confusion.csv'}: is a symbolic link; refusing to read through it" in err
    assert not rep.exists()


def test_run_checkpoint_replaced_by_a_link_is_not_read(tmp_path):
    """checkpoint.pt replaced by a link to someone's checkpoint: the resume loaded their
    weights into this run (and saved them here, mode 644)."""
    from lartpc.train import checkpoint

    run = _run(tmp_path)
    theirs = _secret(tmp_path / "their-checkpoint.pt")
    (run / "checkpoint.pt").symlink_to(theirs)
    with pytest.raises(UnsafePathError, match="checkpoint.pt: is a symbolic link; refusing "
                                              "to read through it"):
        checkpoint.load(run)
