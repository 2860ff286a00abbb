"""Files we write or delete in folders we do not own: nothing is
followed through a planted symlink, no temporary name can be guessed, and nothing the
user made is deleted or overwritten."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lartpc.analysis.__main__ import main as analysis_main
from synthetic_runs import write_synthetic_run
from train_helpers import rows, run, train_cmd

from lartpc.fsutil import (
    TEMP_SUFFIX,
    UnsafePathError,
    atomic_write,
    open_nofollow,
    output_folder,
    read_nofollow,
    remove_stale_temporaries,
    subfolder,
)

VICTIM = "precious data\n"


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text(VICTIM)
    v.chmod(0o600)
    return v


def _untouched(v: Path) -> None:
    assert v.read_bytes() == VICTIM.encode() and (v.stat().st_mode & 0o777) == 0o600


def test_atomic_write_replaces_a_link_and_never_writes_through_it(tmp_path):
    v = _victim(tmp_path)
    target = tmp_path / "out" / "report.html"
    target.parent.mkdir()
    target.symlink_to(v)
    atomic_write(target, "new", mode=0o755)
    _untouched(v)
    assert not target.is_symlink() and target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["report.html"]


def test_atomic_write_failure_leaves_old_content_and_no_temporary(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, boom)
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["f.bin"]


def test_stale_temporaries_are_only_ours(tmp_path):
    (tmp_path / f".checkpoint.pt.abc{TEMP_SUFFIX}").write_bytes(b"x")
    (tmp_path / ".draft.tmp").write_text("mine")
    (tmp_path / f".link{TEMP_SUFFIX}").symlink_to(_victim(tmp_path))
    gone = remove_stale_temporaries(tmp_path)
    assert [p.name for p in gone] == [f".checkpoint.pt.abc{TEMP_SUFFIX}"]
    assert (tmp_path / ".draft.tmp").exists() and (tmp_path / f".link{TEMP_SUFFIX}").is_symlink()


def _run_folder_with_link(tmp_path: Path, name: str, target: Path, marked: bool = True) -> Path:
    """``tmp_path/run`` holding a link ``name`` -> ``target``; ``marked``: with a run.json,
    so the folder is a run folder and only the link is in question."""
    out = tmp_path / "run"
    out.mkdir()
    if marked:
        (out / "run.json").write_text("{}")
    (out / name).symlink_to(target)
    return out


@pytest.mark.slow
def test_symlinked_lock_is_refused_and_its_target_untouched(train_events_dir, tmp_path):
    """run.lock planted as a link to another file: training used to truncate and
    write the file it points to."""
    v = _victim(tmp_path)
    out = _run_folder_with_link(tmp_path, "run.lock", v, marked=False)
    r = run(train_cmd(train_events_dir, out), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{out / 'run.lock'}: is a symbolic link; refusing to write through it" in r.stderr
    assert "Traceback" not in r.stderr
    _untouched(v)
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]


@pytest.mark.slow
def test_symlinked_tensorboard_folder_is_refused(train_events_dir, tmp_path):
    """a tb/ link would have TensorBoard write its event files into another folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")  # a run folder, so only tb/ is in question
    (out / "tb").symlink_to(elsewhere, target_is_directory=True)
    r = run(train_cmd(train_events_dir, out, "train.tensorboard=true"), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "the TensorBoard folder is a symbolic link" in r.stderr
    assert list(elsewhere.iterdir()) == []


@pytest.mark.slow
def test_out_that_is_not_a_run_folder_is_refused(train_events_dir, tmp_path):
    """--out naming a user's folder: their .draft.tmp was deleted as 'left by a
    killed writer' and their eval.csv overwritten."""
    out = tmp_path / "my-notes"
    out.mkdir()
    (out / ".draft.tmp").write_text("draft")
    (out / "eval.csv").write_text("my,own\n1,2\n")
    r = run(train_cmd(train_events_dir, out), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"--out {out}: holds files but is not a run folder (no run.json)" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == [".draft.tmp", "eval.csv"]
    assert (out / "eval.csv").read_text() == "my,own\n1,2\n"


def test_analysis_writers_never_follow_planted_links(tmp_path):
    """report, curves and confusion wrote through links planted at their (then
    predictable) temporary names and at their outputs; one victim was chmod-ed."""
    run_dir = write_synthetic_run(tmp_path / "runs" / "run", model="jishnet", world_size=1,
                                  epoch_rate_per_min=0.5, ttl_s=200, dlt_s=20,
                                  time_limit_s=300, train_events=500)
    v = _victim(tmp_path)
    out = tmp_path / "rep"
    out.mkdir()
    for name in ("report.html", "report.html.tmp", "loss_jishnet.png.tmp",
                 "epoch_rate_jishnet.png", "run_confusion.png.tmp", "run_confusion.md",
                 "run_confusion_percent.csv.tmp"):
        (out / name).symlink_to(v)
    assert analysis_main(["report", str(run_dir.parent), "--out", str(out)]) == 0
    assert analysis_main(["confusion", str(run_dir.parent), "--out", str(out)]) == 0
    _untouched(v)
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert not (out / "report.html").is_symlink()


@pytest.mark.slow
def test_noise_scale_figures_never_follow_planted_links(train_events_dir, tmp_path):
    """noise_scale.png and predict-<cluster>.png (report and predict --out) were saved
    with savefig(path): a link planted at either name had its target overwritten."""
    study = tmp_path / "runs"
    r = run(train_cmd(train_events_dir, study / "run", "train.epochs=1",
                      "train.noise_scale=halves", "train.noise_every_steps=1"), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    v = _victim(tmp_path)
    out = tmp_path / "rep"
    out.mkdir()
    names = ("noise_scale.png", "predict-local-cpu.png", "predict-summit.png")
    for name in names:
        (out / name).symlink_to(v)
    assert analysis_main(["report", str(study), "--out", str(out)]) == 0
    assert analysis_main(["predict", str(study), "--cluster", "summit", "--out", str(out)]) == 0
    _untouched(v)
    for name in names:
        assert not (out / name).is_symlink()
        assert (out / name).read_bytes().startswith(b"\x89PNG\r\n")
    page = (out / "report.html").read_text()
    assert "Gradient noise scale and predicted scaling" in page


def test_sweep_scripts_never_follow_planted_links(tmp_path):
    """`lartpc sweep` wrote each script through '.NAME.tmp' and chmod-ed it 755."""
    v = _victim(tmp_path)
    scripts = tmp_path / "runs" / "jobs"
    scripts.mkdir(parents=True)
    name = "jishnet-n1-s0.sbatch"
    (scripts / f".{name}.tmp").symlink_to(v)
    (scripts / name).symlink_to(v)
    r = subprocess.run([sys.executable, "-m", "lartpc", "sweep", "--data", str(tmp_path),
                        "--out-dir", str(tmp_path / "runs"), "--models", "jishnet", "--gpus",
                        "1", "--scheduler", "slurm", "--launcher", "horovod", "--no-data-check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _untouched(v)
    assert (scripts / name).read_text().startswith("#!/usr/bin/env bash")


@pytest.mark.slow
@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to-a-file"])
def test_symlinked_noise_log_is_refused_and_never_written_through(train_events_dir, tmp_path,
                                                                  completed_run, dangling):
    """noise.csv planted as a link: rank 0 appended its rows to wherever it pointed
    (a dangling link created the file outside the run folder). In a run that resumes it
    is refused; in one that starts from step 0 it is moved away with an earlier
    attempt's files, as the link, never followed."""
    v = tmp_path / "outside.csv" if dangling else _victim(tmp_path)
    fresh = _run_folder_with_link(tmp_path, "noise.csv", v)
    r = run(train_cmd(train_events_dir, fresh, "train.epochs=1", "train.noise_scale=halves",
                      "train.noise_every_steps=1"), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    (discarded,) = fresh.glob("discarded-*")
    assert (discarded / "noise.csv").is_symlink() and not (fresh / "noise.csv").is_symlink()
    if dangling:
        assert not os.path.lexists(v)
    else:
        _untouched(v)
    out = tmp_path / "resumed"
    shutil.copytree(completed_run, out)
    (out / "noise.csv").symlink_to(v)
    r = run(train_cmd(train_events_dir, out, "train.epochs=2", "train.noise_scale=halves",
                      "train.noise_every_steps=1"), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert (f"{out / 'noise.csv'}: the noise-scale log is a symbolic link; refusing to "
            "write through it") in r.stderr
    assert "Traceback" not in r.stderr
    if dangling:
        assert not os.path.lexists(v)
    else:
        _untouched(v)
    assert (out / "noise.csv").is_symlink()
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_symlinked_rank_log_is_never_written_through(train_events_dir, tmp_path):
    """rank-000.csv planted as a link: the new log replaces the link, the file it
    points to stays as it was."""
    v = _victim(tmp_path)
    out = _run_folder_with_link(tmp_path, "rank-000.csv", v)
    log = out / "rank-000.csv"
    r = run(train_cmd(train_events_dir, out, "train.epochs=1"), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    _untouched(v)
    assert not log.is_symlink() and len(rows(log)) == 8  # 55 training events, 7 per step
    assert [int(x["batchno"]) for x in rows(log)] == list(range(8))


def test_helpers_refuse_a_linked_folder_and_follow_only_the_users_own_link(tmp_path):
    """The shared rule: a link at the file or at the folder it is in is refused (a
    folder swapped after a check too: the write is made relative to the folder
    opened); the user's link naming the output folder is resolved once."""
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").symlink_to(victim, target_is_directory=True)
    for write in (lambda: atomic_write(out / "sub" / "f.txt", "x"),
                  lambda: open_nofollow(out / "sub" / "f.txt", os.O_WRONLY | os.O_CREAT),
                  lambda: subfolder(out, "sub", "the folder")):
        with pytest.raises(UnsafePathError, match="is a symbolic link"):
            write()
    assert os.listdir(victim) == []
    (victim / "f.txt").write_text(VICTIM)
    (out / "f.txt").symlink_to(victim / "f.txt")
    with pytest.raises(UnsafePathError, match="refusing to read through it"):
        read_nofollow(out / "f.txt")
    users_link = tmp_path / "my-out"
    users_link.symlink_to(out, target_is_directory=True)
    real = output_folder(users_link)
    assert real == out
    atomic_write(subfolder(real, "made", "a folder") / "g.txt", "y")
    assert (out / "made" / "g.txt").read_text() == "y"
