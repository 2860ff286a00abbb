"""Bad input ends in one line naming the file or field and exit 2, never a traceback
with exit 1 (the documented code of a diverged run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import BIN, rows, run, train_cmd

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def done(train_events_dir, tmp_path_factory):
    """A completed one-epoch run to damage."""
    out = tmp_path_factory.mktemp("done") / "run"
    r = run(train_cmd(train_events_dir, out, "train.epochs=1"))
    assert r.returncode == 0, r.stderr
    return out


def _one_line_exit_2(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and message in errors[0], r.stderr[-2000:]


def test_corrupt_run_json_beside_a_valid_checkpoint(done, train_events_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(done, out)
    (out / "run.json").write_text("{corrupt")
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"))
    _one_line_exit_2(r, f"{out / 'run.json'}: not valid JSON")


@pytest.mark.parametrize("argv,message", [
    (["train", "train.weight_decay=1e308"], "train.weight_decay = 1e+308: must be in [0, 1]"),
    (["train", "train.threads=100000"], "train.threads = 100000: must be at most 1024"),
    # each segfaulted creating the threads, as train.threads did
    (["bench", "model", "--model", "jishnet", "--size", "400", "--threads", "100000"],
     "--threads = 100000: must be in 0..1024"),
    (["bench", "model", "--model", "jishnet", "--size", "400", "--threads", "-1"],
     "--threads = -1: must be in 0..1024"),
    (["bench", "noise", "--threads", "100000"], "--threads = 100000: must be in 1..1024"),
    (["bench", "noise", "--threads", "0"], "--threads = 0: must be in 1..1024"),
])
def test_out_of_range_settings(train_events_dir, tmp_path, argv, message):
    cmd = (train_cmd(train_events_dir, tmp_path / "run", *argv[1:]) if argv[0] == "train"
           else [str(BIN / "lartpc"), *argv])
    _one_line_exit_2(run(cmd), message)


@pytest.mark.parametrize("text,message", [
    (b"[train]\nlr = " + b"[" * 5000 + b"]" * 5000 + b"\n", "invalid TOML (nested too deeply)"),
    (b"[train]\nlr = 0.001 # \xff\xfe\n", "not UTF-8 text"),
])
def test_bad_config_files(train_events_dir, tmp_path, text, message):
    cfg = tmp_path / "my.toml"
    cfg.write_bytes(text)
    r = run(train_cmd(train_events_dir, tmp_path / "run", config=str(cfg)))
    _one_line_exit_2(r, f"{cfg}")
    assert message in r.stderr


def test_garbage_noise_row_does_not_block_resume(done, train_events_dir, tmp_path):
    """A noise.csv row that cannot be read is dropped with a warning on resume (it is a
    measurement log); it used to make the run un-resumable."""
    out = tmp_path / "run"
    shutil.copytree(done, out)
    (out / "noise.csv").write_text("step,epoch,loss\n0,0,1.6\ngarbage,line,here\n")
    r = run(train_cmd(train_events_dir, out, "train.epochs=2", "train.noise_scale=halves"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "noise.csv: dropped 1 unreadable row(s) on resume" in r.stderr
    steps = [int(x["step"]) for x in rows(out / "noise.csv")]
    assert "garbage" not in (out / "noise.csv").read_text() and steps and steps[0] == 0


def test_report_into_a_read_only_folder(done, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount instead
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.strip()}")
    else:
        ro.chmod(0o555)
    try:
        r = subprocess.run([sys.executable, "-m", "lartpc.analysis", "report", str(done), "--out",
                            str(ro / "rep")], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], capture_output=True)
    _one_line_exit_2(r, f"{ro / 'rep'}: cannot write")


@pytest.mark.parametrize("field", ["model", "optimizer", "config", "rng", "global_step"])
def test_checkpoint_missing_fields(done, train_events_dir, tmp_path, field):
    import torch

    out = tmp_path / "run"
    shutil.copytree(done, out)
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    del ck[field]
    torch.save(ck, out / "checkpoint.pt")
    _one_line_exit_2(run(train_cmd(train_events_dir, out, "train.epochs=2")),
                     f"{out / 'checkpoint.pt'}: not a")
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
