"""Evaluation cadence in training images or optimizer steps (issue 37): where the
evaluations fall, what eval.csv says about them, and that a run stopped and resumed
evaluates where an uninterrupted one does."""

from __future__ import annotations

import signal

import pytest
from test_train_loop import _trainer
from train_helpers import rows

from lartpc.config import load_config
from lartpc.data.sharding import ShardPlan
from lartpc.errors import ConfigError
from lartpc.runfolder.schema import EVAL_COLUMNS
from lartpc.train import checkpoint
from lartpc.train.checkpoint import Checkpointer
from lartpc.train.loop import fit
from lartpc.train.sinks import open_sinks
from lartpc.train.trainer import Trainer

EVERY = 20  #: images: not a multiple of the 7 images of a step, nor of an epoch's


def _fit(world, cfg, t, out) -> str:
    sinks = open_sinks(t.segment, t.state.global_step)
    return fit(t, Checkpointer(world, out, cfg.train.checkpoint_every_steps, 600.0), sinks)


def _eval_rows(out) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in rows(out / "eval.csv")]


def _reached(plan: ShardPlan, total: int, every: int) -> list[int]:
    """Global steps after which ``every`` images have been passed again, and the last."""
    seen = plan.images_seen
    got = [g for g in range(1, total + 1) if seen(g) // every > seen(g - 1) // every]
    return got if got[-1] == total else [*got, total]


@pytest.fixture(scope="module")
def reference(world, train_events_dir, tmp_path_factory):
    """An uninterrupted run evaluating every EVERY images."""
    out = tmp_path_factory.mktemp("cadence") / "run"
    out.mkdir()
    cfg, t = _trainer(world, train_events_dir, out, f"train.eval_every_images={EVERY}")
    assert _fit(world, cfg, t, out) == "completed"
    return out, t.plan


def test_images_cadence_evaluates_at_each_multiple_and_says_where(reference):
    out, plan = reference
    spe = plan.steps_per_epoch
    got = rows(out / "eval.csv")
    assert tuple(got[0]) == EVAL_COLUMNS
    steps = _reached(plan, 2 * spe, EVERY)
    assert [int(r["step"]) for r in got] == steps
    assert [int(r["images"]) for r in got] == [plan.images_seen(g) for g in steps]
    # several evaluations within an epoch, not one at each epoch end
    assert len(steps) > 2 and [int(r["epoch"]) for r in got] == [(g - 1) // spe for g in steps]


def test_images_seen_counts_the_short_batches():
    plan = ShardPlan(70, 3, 7, 0, 0.2)
    per_epoch = len(plan.train)
    assert plan.images_seen(plan.steps_per_epoch) == per_epoch
    assert plan.images_seen(2 * plan.steps_per_epoch + 1) == 2 * per_epoch + 3 * 7


class SignalAt:
    """A SIGTERM that arrives during the step that makes ``step`` global steps."""

    def __init__(self, trainer: Trainer, step: int):
        self.trainer, self.step = trainer, step

    @property
    def requested(self):
        return signal.SIGTERM if self.trainer.state.global_step + 1 >= self.step else None


def test_preempted_on_a_cadence_step_makes_its_evaluation_up(world, train_events_dir,
                                                             tmp_path, reference):
    """A stop saves before evaluating; the resumed segment evaluates there first."""
    ref, plan = reference
    at = _reached(plan, 2 * plan.steps_per_epoch, EVERY)[1]
    out = tmp_path / "run"
    out.mkdir()
    sets = f"train.eval_every_images={EVERY}"
    cfg, t = _trainer(world, train_events_dir, out, sets)
    t.stops = SignalAt(t, at)
    assert _fit(world, cfg, t, out) == "preempted"
    ck = checkpoint.load(out)
    assert ck["global_step"] == at and at not in [r["step"] for r in ck["eval_rows"]]
    cfg, t = _trainer(world, train_events_dir, out, sets, resume=ck)
    assert _fit(world, cfg, t, out) == "completed"
    assert _eval_rows(out) == _eval_rows(ref)
    assert rows(out / "rank-000.csv") and [r["global_loss"] for r in rows(out / "rank-000.csv")] \
        == [r["global_loss"] for r in rows(ref / "rank-000.csv")]


def test_killed_during_an_evaluation_resumes_to_the_same_rows(world, train_events_dir,
                                                              tmp_path, reference):
    """A job lost in an evaluation resumes from its last step checkpoint (every 5 steps
    here) and evaluates at the same steps as an uninterrupted run."""
    ref, plan = reference
    at = _reached(plan, 2 * plan.steps_per_epoch, EVERY)[2]
    out = tmp_path / "run"
    out.mkdir()
    sets = (f"train.eval_every_images={EVERY}", "train.checkpoint_every_steps=5")
    cfg, t = _trainer(world, train_events_dir, out, *sets)
    real = t.evaluate

    def evaluate():
        if t.state.global_step == at:
            raise KeyboardInterrupt("killed")  # nothing after it runs, as after a SIGKILL
        return real()
    t.evaluate = evaluate
    with pytest.raises(KeyboardInterrupt):
        _fit(world, cfg, t, out)
    ck = checkpoint.load(out)
    assert ck["global_step"] < at
    cfg, t = _trainer(world, train_events_dir, out, *sets, resume=ck)
    assert _fit(world, cfg, t, out) == "completed"
    assert _eval_rows(out) == _eval_rows(ref)


def test_steps_cadence_evaluates_every_k_steps(world, train_events_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    cfg, t = _trainer(world, train_events_dir, out, "train.eval_every_steps=3")
    assert _fit(world, cfg, t, out) == "completed"
    total = 2 * t.plan.steps_per_epoch
    want = [g for g in range(3, total + 1, 3)]
    want += [] if want[-1] == total else [total]
    assert [int(r["step"]) for r in rows(out / "eval.csv")] == want


def test_epoch_cadence_still_one_row_per_epoch_with_its_step(world, train_events_dir,
                                                              tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    cfg, t = _trainer(world, train_events_dir, out)
    assert _fit(world, cfg, t, out) == "completed"
    spe = t.plan.steps_per_epoch
    got = rows(out / "eval.csv")
    assert [(r["epoch"], int(r["step"])) for r in got] == [("0", spe), ("1", 2 * spe)]


@pytest.mark.parametrize("sets,message", [
    (["train.eval_every_images=-1"], "train.eval_every_images = -1: must be >= 0"),
    (["train.eval_every_steps=-3"], "train.eval_every_steps = -3: must be >= 0"),
    (["train.eval_every_images=100", "train.eval_every_steps=5"],
     "train.eval_every_images = 100 with train.eval_every_steps = 5: set at most one"),
    (["train.eval_every_images='epoch'"], "train.eval_every_images = 'epoch' has type str"),
])
def test_bad_cadence_is_refused_naming_the_option(sets, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config("tiny-jishnet", sets)



def test_analysis_reads_new_and_older_eval_csv(reference, tmp_path):
    """eval.csv from before issue 37 (no step, images) still reads, those as nan; the
    header is otherwise still checked."""
    import math

    from lartpc.analysis.csvread import read_table
    from lartpc.analysis.runcheck import RunFolderError

    from lartpc.runfolder.schema import EVAL_COLUMNS_V1

    def read(path):
        return read_table(path, EVAL_COLUMNS, ("epoch", "n_events"), older=(EVAL_COLUMNS_V1,))

    ref, _ = reference
    new = read(ref / "eval.csv")
    assert list(new.columns) == list(EVAL_COLUMNS) and (new["step"] > 0).all()
    lines = (ref / "eval.csv").read_text().splitlines()
    old = tmp_path / "eval.csv"
    old.write_text("".join(",".join(ln.split(",")[:len(EVAL_COLUMNS_V1)]) + "\n"
                           for ln in lines))
    got = read(old)
    assert list(got.columns) == list(EVAL_COLUMNS)
    assert got["loss"].tolist() == new["loss"].tolist()
    assert all(math.isnan(v) for v in got["step"]) and all(math.isnan(v) for v in got["images"])
    old.write_text("".join(",".join(ln.split(",")[:-1]) + "\n" for ln in lines))
    with pytest.raises(RunFolderError, match="header is"):
        read(old)
