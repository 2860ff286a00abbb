"""``lartpc bench …`` on bad input: one line naming the option (or file, or field), exit
2, no traceback, nothing written; an existing ``--out`` is never replaced unasked."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch
from train_helpers import BIN, launcher, run

from lartpc.bench.train import rank_error
from lartpc.cli import main


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The temporary folder the benches make their work folders in: empty afterwards
    means nothing was left behind."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def refused(argv: list[str], capsys, scratch, message: str) -> str:
    """Run ``lartpc argv`` in this process; assert the one-line refusal with
    ``message``, no JSON printed and no work folder left; the error line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err and len(errors) == 1, err[-2000:]
    assert message in errors[0], err[-2000:]
    assert out == "" and not list(scratch.iterdir())
    return errors[0]


TRAIN_BAD = [
    (["--data", "nope"], "--data nope: no such event file or folder"),
    (["--seconds", "0"], "--seconds: must be a positive finite number, got 0"),
    (["--seconds", "nan"], "--seconds: must be a positive finite number, got nan"),
    (["--set", "train.foo=1"], "--set train.foo=1: unknown key train.foo"),
    (["--config", "nope"], "unknown config preset 'nope'"),
    (["--batch-per-rank", "0"], "--batch-per-rank: must be positive, got 0"),
    (["--downsample", "7"], "--downsample: downsample=7"),
    (["--downsample", "9"], "events are downsampled by 4 but the config says "
                            "data.downsample=9"),
]


@pytest.mark.parametrize("backend,argv,message", [
    *((backend, argv, message) for backend in ("horovod", "none")
      for argv, message in TRAIN_BAD),
    ("horovod", ["--ranks", "64"], "35 training events for 64 ranks"),
])
def test_bench_train_checks_the_training_before_any_rank_starts(
        backend, argv, message, events_dir, capsys, scratch):
    """The config (built by the training's own code), the data and the numbers are
    checked in the bench itself: a Horovod launch never reports a failed rank for them."""
    ranks = ["--ranks", "1"] if backend == "none" else []
    refused(["bench", "train", "--model", "jishnet", "--data", str(events_dir),
             "--backend", backend, "--bare-steps", "0", *ranks, *argv], capsys, scratch,
            message)


@pytest.mark.horovod
def test_a_rank_that_fails_under_horovod_is_named_by_its_own_error(events_dir, capsys,
                                                                   scratch):
    """Two one-process worlds (dist.backend=none) in one run folder: one rank is refused
    by the folder's lock, which only a rank finds out. Its error line, not Horovod's
    traceback, is what the bench says."""
    launcher("horovodrun")
    line = refused(["bench", "train", "--model", "jishnet", "--ranks", "2", "--data",
                    str(events_dir), "--seconds", "10", "--bare-steps", "0",
                    "--no-compare-torch", "--set", "dist.backend=none"], capsys, scratch,
                   "training on 2 rank(s) with horovod failed: lartpc train: error: ")
    assert "in use by another training" in line


def test_rank_error_reads_each_launchers_lines():
    horovod = ("Process 0 exit with status code 2.\n[1]<stderr>:lartpc train: error: nope: "
               "no such event file or folder\n[1]<stderr>:Terminated\nTraceback (most "
               "recent call last):\nRuntimeError: Horovod detected that one or more")
    assert rank_error(horovod) == "lartpc train: error: nope: no such event file or folder"
    assert rank_error("[rank1]:lartpc train: error: x\n") == "lartpc train: error: x"
    assert rank_error("Traceback (most recent call last):\nRuntimeError: y\n") is None


BAD_VALUES = [
    (["simulate", "--downsample", "7"], "--downsample: downsample=7"),
    (["simulate", "--seed=-1"], "--seed: must be in 0..2**63-1, got -1"),
    (["simulate", "--events", "0"], "--events: must be positive"),
    (["simulate", "--workers", "0"], "--workers: must be positive"),
    (["model", "--model", "jishnet", "--seed=-1"], "--seed: must be in 0..2**63-1"),
    (["model", "--model", "jishnet", "--batch-per-rank", "0"], "--batch-per-rank: must be"),
    (["model", "--model", "jishnet", "--repeats", "0"], "--repeats: must be positive"),
    (["model", "--model", "jishnet", "--warmup", "-1"], "--warmup: must be 0 or more"),
    (["model", "--model", "jishnet", "--size", "0"], "--size 0: must divide 3600"),
    (["model", "--model", "jishnet", "--peak-tflops", "nan"], "--peak-tflops: must be a "
                                                              "positive finite number"),
    (["model", "--model", "jishnet", "--peak-tflops", "-1"], "--peak-tflops: must be"),
    (["noise", "--seed=-1"], "--seed: must be in 0..2**63-1"),
    (["noise", "--steps", "0"], "--steps: must be positive"),
    (["noise", "--every", "0"], "--every: must be positive"),
    (["noise", "--batch-per-rank", "0"], "--batch-per-rank: must be positive"),
    (["noise", "--size", "7"], "--size 7: must divide 3600"),
    (["loader", "--data", "EV", "--batch-per-rank", "0"], "--batch-per-rank: must be"),
    (["loader", "--data", "EV", "--ranks", "0"], "--ranks: must be positive"),
    # no full batch to time: it used to loop for ever
    (["loader", "--data", "EV", "--batch-per-rank", "41"], "--batch-per-rank 41: more than "
                                                           "the 40 events"),
    (["loader", "--data", "EV", "--steps", "0"], "--steps 0"),
    (["loader", "--data", "EV", "--device", "foo"], "--device 'foo': expected cpu, cuda"),
    (["loader", "--data", "EV", "--clevel", "12"], "--clevel: blosc clevel 12"),
    (["loader", "--data", "EV", "--band-rows", "0"], "--band-rows: blosc band_rows 0"),
    (["loader", "--data", "EV", "--codec", "foo"], "--codec: blosc codec 'foo'"),
    (["loader", "--data", "EV", "--threads", "-1"], "--threads = -1: must be in 0..1024"),
    pytest.param(["loader", "--data", "EV", "--device", "cuda"],
                 "--device cuda: torch sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
    (["minibatch", "--data", "EV", "--base-batch", "0"], "--base-batch: must be positive"),
    (["minibatch", "--data", "EV", "--threshold", "nan"], "--threshold: must be a positive"),
    (["minibatch", "--data", "EV", "--seconds", "inf"], "--seconds: must be a positive"),
    (["minibatch", "--data", "nope"], "--data nope: no such event file or folder"),
    (["minibatch", "--downsample", "7"], "--downsample: downsample=7"),
    (["minibatch", "--events", "0"], "--events: must be positive"),
    (["minibatch", "--data", "EV", "--set", "train.foo=1"], "--set train.foo=1: unknown"),
    (["minibatch", "--data", "EV", "--batch-per-rank", "7,100"],
     "train.batch_per_rank = 100: more than the 35 training events"),
    (["convert", "--repeats", "0"], "--repeats: must be positive, got 0"),
    (["convert", "--events", "0"], "--events: must be positive"),
    (["convert", "--seed=-1"], "--seed: must be in 0..2**63-1"),
    (["convert", "--downsample", "7"], "--downsample: downsample=7"),
]


@pytest.mark.parametrize("argv,message", BAD_VALUES)
def test_a_bad_option_value_is_named_not_a_traceback(argv, message, events_dir, capsys,
                                                     scratch):
    """0, negative, nan: every numeric option of every bench, checked before any work."""
    argv = [str(events_dir) if a == "EV" else a for a in argv]
    refused(["bench", *argv], capsys, scratch, message)


def test_an_existing_minibatch_out_is_kept(tmp_path, events_dir, capsys, scratch):
    out = tmp_path / "scan"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    refused(["bench", "minibatch", "--data", str(events_dir), "--out", str(out)], capsys,
            scratch, f"--out {out}: exists; choose a new folder")
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_an_existing_allreduce_out_is_replaced_only_with_overwrite(tmp_path):
    """Two ranks under torchrun (the bench needs two): an existing --out is refused,
    naming it and --overwrite, and kept; with --overwrite it becomes the profile."""
    launcher("torchrun")
    out = tmp_path / "profile.json"
    out.write_text('{"mine": 1}\n')
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "lartpc",
           # up to 16 MiB: the bandwidth is always resolved (test_bench_allreduce.py)
           "bench", "allreduce", "--max-bytes", "16MiB", "--warmup", "1", "--repeats", "3",
           "--out", str(out)]
    r = run(cmd, timeout=120, OMP_NUM_THREADS="1")
    assert r.returncode != 0 and r.stdout == ""
    assert f"--out {out}: exists; choose a new file, or --overwrite to replace it" in r.stderr
    assert out.read_text() == '{"mine": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json"]
    r = run([*cmd, "--overwrite"], timeout=120, OMP_NUM_THREADS="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(out.read_text())["measured"]["world_size"] == 2
