"""Issue 36's changes to the step change no result: Adam's multi-tensor form trains to
the very parameters of torch's tensor-at-a-time form, and numbers read back a step
later are the numbers read back at once (same rank-log rows, same parameters)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from train_helpers import rows

from lartpc.config import load_config
from lartpc.data.store import EventStore
from lartpc.train.checkpoint import Checkpointer
from lartpc.train.loop import fit
from lartpc.train.plan import plan_run
from lartpc.train.segments import Segment
from lartpc.train.sinks import Sink, open_sinks
from lartpc.train.trainer import Trainer

SETS = ["data.downsample=9", "data.eval_fraction=0.2", "train.epochs=2",
        "train.log_flush_steps=1", "train.threads=1", "train.progress_every_s=0"]
#: the rank log's columns that hold results (time and durations differ run to run)
VALUES = ("epoch", "rank", "batchno", "data_size", "local_loss", "global_loss", "local_acc",
          "global_acc")


def _build(world, data, out, preset, sets, resume=None):
    cfg = load_config(preset, [*SETS, *sets])
    store = EventStore(data)
    out.mkdir(exist_ok=True)
    return Trainer.build(Segment(cfg, store, plan_run(cfg, store, 1), world, out, time.time(),
                                 resume))


def _segment(world, t: Trainer, out) -> str:
    """The rest of ``t``'s run in ``out`` through the loop, its sinks opened at its step
    and closed afterwards whatever happens; the run's status."""
    sinks = open_sinks(t.segment, t.state.global_step)
    try:
        return fit(t, Checkpointer(world, out, 0, 600.0), sinks)
    finally:
        sinks.close()


def _fit(world, data, out, preset="tiny-scnet", *sets, graph_stats: dict | None = None):
    """A two-epoch training through the loop: (final parameters, rank-log values);
    ``graph_stats`` gets ``train.cuda_graph``'s step counts."""
    t = _build(world, data, out, preset, sets)
    assert _segment(world, t, out) == "completed"
    params = [p.detach().clone() for p in t.model.parameters()]
    if graph_stats is not None and t.graphed is not None:
        graph_stats.update(t.graphed.stats)
    t.close()
    return params, [{k: r[k] for k in VALUES} for r in rows(out / "rank-000.csv")]


def _same(a, b):
    (pa, la), (pb, lb) = a, b
    assert len(la) == len(lb) > 0 and la == lb
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))


@pytest.mark.sparse
@pytest.mark.parametrize("preset,extra", [("tiny-scnet", ()),
                                          ("tiny-jishnet", ("train.optimizer=sgd",))])
def test_foreach_optimizer_trains_to_the_same_parameters_and_log(world, train_events_dir,
                                                                 tmp_path, preset, extra):
    loop_form = _fit(world, train_events_dir, tmp_path / "for-loop", preset, *extra,
                     "train.optimizer_impl=for-loop")
    foreach = _fit(world, train_events_dir, tmp_path / "foreach", preset, *extra)
    _same(loop_form, foreach)


@pytest.mark.sparse
def test_numbers_read_a_step_later_equal_numbers_read_at_once(world, train_events_dir,
                                                              tmp_path):
    """The loop reads step k's loss and accuracy with step k+1; read at once
    (``train.overlap_readback=false``, the loop before issue 36) it logs the same
    values and ends with the same parameters."""
    _same(_fit(world, train_events_dir, tmp_path / "at-once", "tiny-scnet",
               "train.overlap_readback=false"),
          _fit(world, train_events_dir, tmp_path / "overlapped"))


@pytest.mark.sparse
def test_each_step_is_recorded_once_in_order_whenever_read(world, train_events_dir,
                                                           tmp_path):
    """Stepped by hand: each step hands back the previous step's record (both at an
    epoch's last step); read_back gives the one still out."""
    t = _build(world, train_events_dir, tmp_path / "by-hand", "tiny-scnet", ())
    spe, recs = t.plan.steps_per_epoch, []
    for k, (batch, data_s) in enumerate(t.batches()):
        got = [r.global_step for r in t.step(batch, data_s)]
        assert got == ([] if k == 0 else [k - 1, k] if k == spe - 1 else [k - 1])
        recs += got
    t.state.next_epoch()
    batches = t.batches()
    t.step(*next(batches))
    assert [r.global_step for r in t.read_back()] == [spe] and t.read_back() == []
    assert recs == list(range(spe))
    batches.close()
    t.close()


class Recorder(Sink):
    def __init__(self):
        self.steps = []

    def on_step(self, rec):
        self.steps.append(rec)


def test_a_diverged_run_stops_a_step_later_and_names_the_first_bad_step(
        world, train_events_dir, tmp_path):
    t = _build(world, train_events_dir, tmp_path / "run", "tiny-jishnet",
               ("train.lr=1e30", "train.epochs=1"))
    rec = Recorder()
    assert fit(t, Checkpointer(world, tmp_path / "run", 0, 600.0), rec) == "diverged"
    first = next(r for r in rec.steps if not math.isfinite(r.global_loss))
    assert t.last_loss_at == (first.epoch, first.batchno)
    # seen with the next step, which is recorded too, and nothing after it
    assert rec.steps[-1].global_step == first.global_step + 1 < t.plan.steps_per_epoch - 1
    assert [r.global_step for r in rec.steps] == list(range(len(rec.steps)))
    t.close()


def test_a_resumed_optimizer_keeps_the_configured_form(world, train_events_dir, tmp_path):
    """A checkpoint from before train.optimizer_impl holds torch's foreach=None: the
    resumed run updates the configured way all the same."""
    a = _build(world, train_events_dir, tmp_path / "a", "tiny-jishnet", ())
    batch, data_s = next(a.batches())
    a.step(batch, data_s)
    state = a.state_dict()
    for group in state["optimizer"]["param_groups"]:
        group["foreach"] = None
    b = _build(world, train_events_dir, tmp_path / "b", "tiny-jishnet", (), resume=state)
    assert [(g["foreach"], g["fused"]) for g in b.opt.param_groups] == [(True, None)]
    a.close(), b.close()


def test_an_evaluation_by_steps_waits_for_its_steps_numbers(world, train_events_dir,
                                                            tmp_path):
    """With an evaluation every step and a loss that turns non-finite, the step that
    reaches the cadence is read before the evaluation acts: read a step later or at
    once, the run stops at the same step with the same evaluations."""
    got = []
    for overlap in ("true", "false"):
        out = tmp_path / overlap
        t = _build(world, train_events_dir, out, "tiny-jishnet",
                   ("train.lr=1e30", "train.epochs=1", "train.eval_every_steps=1",
                    f"train.overlap_readback={overlap}"))
        assert _segment(world, t, out) == "diverged"
        t.close()
        got.append(([r["step"] for r in rows(out / "eval.csv")],
                    len(rows(out / "rank-000.csv"))))
    assert got[0] == got[1]
