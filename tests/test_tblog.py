"""`train.tensorboard = true`: rank 0's event file holds the CSV's steps and losses,
resume continues it, and a missing package is one clear error."""

from __future__ import annotations

import sys

import pytest
from train_helpers import rows, run, train_cmd

from lartpc.errors import ConfigError
from lartpc.train import tblog


def _scalars(tb_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_event_file_matches_csv_across_resume(train_events_dir, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out, "train.tensorboard=true", "train.epochs=1"))
    assert r.returncode == 0, r.stderr
    first = len(rows(out / "rank-000.csv"))
    # What a process killed after its checkpoint leaves: a step logged past it.
    with SummaryWriter(str(out / "tb")) as w:
        w.add_scalar("train/loss", 99.0, first)
    r = run(train_cmd(train_events_dir, out, "train.tensorboard=true", "train.epochs=2",
                      "train.noise_scale=halves", "train.noise_every_steps=2"))
    assert r.returncode == 0, r.stderr
    log = rows(out / "rank-000.csv")
    assert len(log) > first
    loss = _scalars(out / "tb", "train/loss")
    assert [s for s, _ in loss] == list(range(len(log)))
    assert [v for _, v in loss] == pytest.approx([float(x["global_loss"]) for x in log],
                                                 rel=1e-6)
    acc = _scalars(out / "tb", "train/accuracy")
    assert [v for _, v in acc] == pytest.approx([float(x["global_acc"]) for x in log], rel=1e-6)
    ev = rows(out / "eval.csv")
    assert [v for _, v in _scalars(out / "tb", "eval/loss")] == pytest.approx(
        [float(x["loss"]) for x in ev], rel=1e-6)
    lr = _scalars(out / "tb", "train/lr")
    assert len(lr) == len(log) and lr[0][1] == pytest.approx(1e-3)
    share = [v for _, v in _scalars(out / "tb", "perf/data_wait_share")]
    assert len(share) == len(log) and all(0 <= v <= 1 for v in share)
    assert all(v > 0 for _, v in _scalars(out / "tb", "perf/images_per_s"))
    # the second segment measured the noise scale: the same numbers as noise.csv
    noise = rows(out / "noise.csv")
    assert len(noise) >= 2
    b = _scalars(out / "tb", "noise/b_simple")
    assert [s for s, _ in b] == [int(x["step"]) for x in noise]
    assert [v for _, v in b] == pytest.approx([float(x["b_simple"]) for x in noise], rel=1e-6)


def test_off_by_default_writes_nothing(tmp_path):
    tb = tblog.open_tblog(False, True, tmp_path, 0)
    tb.step(0, loss=1.0, acc=0.5, lr=1e-3, images=7, step_s=1.0, data_s=0.1)
    tb.scalars(0, {"noise/b_simple": 3.0})
    tb.close()
    assert not (tmp_path / "tb").exists()


def test_scalars_hook_and_rank_zero_only(tmp_path):
    assert tblog.open_tblog(True, False, tmp_path, 0).writer is None
    tb = tblog.open_tblog(True, True, tmp_path, 0)
    tb.scalars(3, {"noise/b_simple": 12.5})
    tb.close()
    assert _scalars(tmp_path / "tb", "noise/b_simple") == [(3, 12.5)]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import raises ImportError
    with pytest.raises(ConfigError, match=r"lartpc\[tensorboard\]"):
        tblog.require()
