"""The training loop driven in this process, on a single-process world: the trainer,
the checkpointer and the sinks as the loop uses them, without a subprocess."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from train_helpers import rows

from lartpc.config import load_config
from lartpc.data.store import EventStore
from lartpc.train import checkpoint
from lartpc.train.checkpoint import Checkpointer
from lartpc.train.loop import fit
from lartpc.train.plan import plan_run
from lartpc.train.segments import Segment
from lartpc.train.sinks import EvalRecord, Sink, Sinks, StepRecord, open_sinks
from lartpc.train.state import StepVote
from lartpc.train.trainer import Trainer

SETS = ["data.downsample=9", "data.eval_fraction=0.2", "train.epochs=2",
        "train.log_flush_steps=1", "train.threads=1", "train.progress_every_s=0"]


class Recorder(Sink):
    """A sink that keeps what it is given."""

    def __init__(self):
        self.steps: list[StepRecord] = []
        self.evals: list[EvalRecord] = []
        self.flushes = 0

    def on_step(self, rec):
        self.steps.append(rec)

    def on_eval(self, rec):
        self.evals.append(rec)

    def flush(self):
        self.flushes += 1


def _trainer(world, data, out, *sets, resume=None):
    cfg = load_config("tiny-jishnet", [*SETS, *sets])
    store = EventStore(data)
    plan = plan_run(cfg, store, world.size)
    return cfg, Trainer.build(Segment(cfg, store, plan, world, out, time.time(), resume))


def test_loop_in_process_writes_every_step_and_evaluation(world, train_events_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    cfg, t = _trainer(world, train_events_dir, out)
    rec = Recorder()
    sinks = Sinks(rec, open_sinks(t.segment, 0))
    status = fit(t, Checkpointer(world, out, 0, 600.0), sinks)
    assert status == "completed"
    spe = t.plan.steps_per_epoch
    assert [r.global_step for r in rec.steps] == list(range(2 * spe))
    assert [r.batchno for r in rec.steps] == [*range(spe), *range(spe)]
    assert all(r.images == r.data_size and r.step_s > 0 for r in rec.steps)
    assert [e.row["epoch"] for e in rec.evals] == [0, 1]
    assert rec.evals[-1].global_step == 2 * spe - 1
    assert rec.flushes >= 3  # before each epoch-end checkpoint, and at the end
    csv_rows = rows(out / "rank-000.csv")
    assert [float(r["global_loss"]) for r in csv_rows] == [r.global_loss for r in rec.steps]
    assert len(rows(out / "eval.csv")) == 2
    ck = checkpoint.load(out)
    assert (ck["epoch"], ck["global_step"]) == (2, 2 * spe)
    assert t.close() == 0.0


def _three_steps_saved(world, data, tmp_path):
    """A trainer in ``tmp_path/a`` three steps in, its checkpoint written through the file
    (as a resume reads it); returns it, its batch iterator, its folder and an empty
    ``tmp_path/b`` for a second trainer."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    _, a = _trainer(world, data, a_dir, "train.epochs=1")
    batches = a.batches()
    for _ in range(3):
        a.step(*next(batches))
    checkpoint.write(a_dir, a.state_dict())
    return a, batches, a_dir, b_dir


def test_state_dict_round_trip_continues_identically(world, train_events_dir, tmp_path):
    """A trainer rebuilt from another's state_dict takes the very same next step."""
    a, batches, a_dir, b_dir = _three_steps_saved(world, train_events_dir, tmp_path)
    state = checkpoint.load(a_dir)
    _, b = _trainer(world, train_events_dir, b_dir, "train.epochs=1", resume=state)
    assert b.state.global_step == 3 and b.saved_step == 3
    # a step's numbers come back with the next step: read this one's now
    nxt_a = (a.step(*next(batches)) + a.read_back())[-1]
    nxt_b = (b.step(*next(b.batches())) + b.read_back())[-1]
    assert nxt_a.global_loss == nxt_b.global_loss and nxt_a.batchno == nxt_b.batchno == 3
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("vote,reason", [
    (StepVote(1.0, 0.0, 0.0), None),
    (StepVote(1.0, 0.5, 0.0), "time_limit"),  # one rank of two out of time
    (StepVote(1.0, 0.5, 0.5), "preempted"),
    (StepVote(float("nan"), 0.0, 1.0), "diverged"),
    (StepVote(1.0, 0.0, 0.0, 0.0, 0.5), "time_limit"),  # one rank reached the budget
])
def test_stop_vote(vote, reason):
    assert vote.stop == reason


def test_time_left_reserves_the_slowest_recent_step_evaluation_and_save(monkeypatch):
    """The time-limit check reserves each duration at its slowest recent value: one
    slow step among fast ones (a loaded host) stops the run as if every step were that
    slow; a quicker evaluation or save after a slow one does not shrink the reserve."""
    from types import SimpleNamespace

    from lartpc.train import trainer
    from lartpc.train.state import RECENT_STEPS, Timing

    now = 1.0e9  # a clock that stands still: the margins below are 0.1 s
    monkeypatch.setattr(trainer.time, "time", lambda: now)

    def left(timing: Timing, elapsed: float, limit: float = 30.0) -> bool:
        t = SimpleNamespace(timing=timing, process_start=now - elapsed,
                            cfg=SimpleNamespace(train=SimpleNamespace(time_limit_s=limit)),
                            plan=None)
        return Trainer.time_left(t)

    timing = Timing()
    timing.evaluated(2.0)
    timing.evaluated(0.5)
    timing.saved(0.2)  # the first save replaces the 1 s guess
    timing.saved(0.1)
    assert (timing.eval_s, timing.checkpoint_s) == (2.0, 0.2)
    timing.step_times.extend([0.1] * (RECENT_STEPS - 1))
    # reserve 1.5 * (2 * 0.1 + 2.0 + 0.2) + 2 = 5.6 s
    assert left(timing, 24.3) and not left(timing, 24.5)
    timing.step_times.append(3.0)  # reserve 1.5 * (6 + 2.2) + 2 = 14.3 s
    assert left(timing, 15.6) and not left(timing, 15.8)
    timing.step_times.extend([0.1] * RECENT_STEPS)  # the slow step has left the window
    assert left(timing, 24.3)


def test_time_limit_stops_and_evaluates(world, train_events_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # 8 s from the start of the build: a few steps, whatever this machine's speed
    cfg, t = _trainer(world, train_events_dir, out, "train.epochs=50", "train.time_limit_s=8")
    rec = Recorder()
    status = fit(t, Checkpointer(world, out, 0, 600.0), rec)
    assert status == "time_limit"
    assert 0 < len(rec.steps) < 50 * t.plan.steps_per_epoch
    assert rec.evals and rec.evals[-1].global_step == len(rec.steps) - 1
    assert checkpoint.load(out)["global_step"] == len(rec.steps)


def test_init_from_takes_another_runs_weights_and_nothing_else(world, train_events_dir,
                                                                tmp_path):
    """train.init_from (fine-tuning): a new run starts from a checkpoint's weights, with
    a fresh optimizer and counters; a run folder or the file itself may be given."""
    a, batches, a_dir, b_dir = _three_steps_saved(world, train_events_dir, tmp_path)
    _, fresh = _trainer(world, train_events_dir, b_dir, "train.seed=5")
    for source in (a_dir, a_dir / "checkpoint.pt"):
        _, b = _trainer(world, train_events_dir, b_dir, f"train.init_from={str(source)!r}",
                        "train.seed=5")
        assert b.state.global_step == 0 and b.saved_step == -1 and not b.opt.state
        for pa, pb, pf in zip(a.model.parameters(), b.model.parameters(),
                              fresh.model.parameters(), strict=True):
            assert torch.equal(pa, pb) and not torch.equal(pb, pf)


def test_init_from_with_another_head_takes_the_trunk_and_starts_the_head_fresh(
        world, train_events_dir, tmp_path, caplog):
    """model.head=max from a flatten-head run (the pooled-head diagnostic started from a
    trained trunk): the convolutions' weights carry over, the head is this run's own."""
    a, _, a_dir, b_dir = _three_steps_saved(world, train_events_dir, tmp_path)
    _, fresh = _trainer(world, train_events_dir, b_dir, "train.seed=5", "model.head='max'")
    with caplog.at_level("INFO", logger="lartpc.train.trainer"):
        _, b = _trainer(world, train_events_dir, b_dir, f"train.init_from={str(a_dir)!r}",
                        "train.seed=5", "model.head='max'")
    assert "trunk only: its head is not model.head=max" in caplog.text
    for name, p in b.model.named_parameters():
        source = fresh if name.startswith("head.") else a
        assert torch.equal(p, dict(source.model.named_parameters())[name]), name
    assert (a.model.head.pooling, b.model.head.pooling) == ("flatten", "max")
    assert not torch.equal(b.model.head.fc1.weight, a.model.head.fc1.weight)


def test_init_from_refuses_a_missing_file_another_model_and_other_shapes(
        world, train_events_dir, tmp_path):
    from lartpc.errors import ConfigError

    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    _, a = _trainer(world, train_events_dir, a_dir, "train.epochs=1")
    state = a.state_dict()
    checkpoint.write(a_dir, state)
    with pytest.raises(ConfigError, match=r"train.init_from '.*nothing': no checkpoint"):
        _trainer(world, train_events_dir, b_dir, f"train.init_from={str(tmp_path / 'nothing')!r}")
    state["config"]["model"]["name"] = "scnet"
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="a scnet checkpoint cannot start a jishnet run"):
        _trainer(world, train_events_dir, b_dir,
                 f"train.init_from={str(tmp_path / 'other.pt')!r}")
    state["config"]["model"]["name"] = "jishnet"
    name, w = next(iter(state["model"].items()))
    state["model"][name] = torch.zeros(*w.shape[:-1], w.shape[-1] + 1)
    torch.save(state, tmp_path / "shapes.pt")
    with pytest.raises(ConfigError, match="its weights do not fit this model"):
        _trainer(world, train_events_dir, b_dir,
                 f"train.init_from={str(tmp_path / 'shapes.pt')!r}")


def test_save_vote_counts_any_rank(world):
    assert StepVote(1.0, 0.0, 0.0, 0.5).save > 0  # one rank of two asks: all save
    assert StepVote(1.0, 0.0, 0.0).save == 0


@pytest.mark.slow
def test_ranks_whose_checkpoint_clocks_disagree_save_together(train_events_dir, tmp_path):
    """Rank 0's checkpoint interval passes after step 3, rank 1's does not: both save
    there (a checkpoint holds collectives; one rank entering them alone crashed a
    2-rank run with gloo's 'Received data size doesn't match expected size')."""
    import json
    import subprocess

    from train_helpers import BIN, clean_env

    out = tmp_path / "run"
    out.mkdir()
    worker = str(Path(__file__).with_name("skewed_save_worker.py"))
    r = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", worker,
                        str(train_events_dir), str(out)], capture_output=True, text=True,
                       timeout=300, env=clean_env(OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    saves = [json.loads((out / f"saves-rank{k}.json").read_text()) for k in (0, 1)]
    spe = saves[0]["steps_per_epoch"]
    assert spe > 3, "step 3 must fall inside epoch 0 to test a mid-epoch save"
    assert saves[0] == saves[1]
    assert saves[0]["status"] == "completed"
    assert saves[0]["saved_at"] == [3, spe, 2 * spe]  # the wished one, then epoch ends
    assert checkpoint.load(out)["global_step"] == 2 * spe


def test_a_signal_on_an_epochs_last_step_saves_before_evaluating(world, train_events_dir,
                                                                 tmp_path):
    """A stop signal during an epoch's last step saves at once (the epoch-end evaluation
    could outlast the scheduler's grace time); the resumed segment makes the evaluation
    up before its first step, and the run ends with one evaluation per epoch."""
    class Stops:
        requested = None

    out = tmp_path / "run"
    out.mkdir()
    stops = Stops()
    cfg, t = _trainer(world, train_events_dir, out)
    t.stops = stops
    spe, order, step, evaluate = t.plan.steps_per_epoch, [], t.step, t.evaluate

    def signalled_step(batch, data_s, save_wanted=False):
        if t.state.global_step == spe - 1:
            stops.requested = 15  # SIGTERM during the first epoch's last step
        return step(batch, data_s, save_wanted)

    def logged_evaluate():
        order.append(("evaluate", t.state.epoch, t.state.step_in_epoch))
        return evaluate()

    t.step, t.evaluate = signalled_step, logged_evaluate
    rec = Recorder()
    assert fit(t, Checkpointer(world, out, 0, 600.0), Sinks(rec, open_sinks(t.segment, 0))) \
        == "preempted"
    assert order == [] and not rec.evals
    ck = checkpoint.load(out)
    assert (ck["epoch"], ck["step_in_epoch"], ck["global_step"]) == (0, spe, spe)
    t.close()
    _, resumed = _trainer(world, train_events_dir, out, resume=ck)
    rec = Recorder()
    assert fit(resumed, Checkpointer(world, out, 0, 600.0),
               Sinks(rec, open_sinks(resumed.segment, 0))) == "completed"
    assert [e.global_step for e in rec.evals] == [spe - 1, 2 * spe - 1]
    assert [r["epoch"] for r in rows(out / "eval.csv")] == ["0", "1"]
    resumed.close()


def test_the_budget_stops_at_the_first_step_that_reaches_it(world, train_events_dir,
                                                           tmp_path, caplog):
    """train.budget_s: the run stops after the first step whose training time reaches
    the budget (never a step later), so its checkpoint holds a time a rerun finds spent;
    the log names the budget, not the time limit."""
    from lartpc.train import segments

    out = tmp_path / "run"
    out.mkdir()
    cfg, t = _trainer(world, train_events_dir, out, "train.epochs=50", "train.budget_s=0.5")
    rec = Recorder()
    with caplog.at_level("WARNING"):
        assert fit(t, Checkpointer(world, out, 0, 600.0), rec) == "time_limit"
    assert t.budget_spent
    times = [r.step_s for r in rec.steps]
    assert sum(times[:-1]) < 0.5 <= t.state.train_time_s
    assert t.state.train_time_s == pytest.approx(sum(times))
    assert segments.budget_spent(cfg, checkpoint.load(out))
    assert "study budget reached" in caplog.text and "time limit" not in caplog.text
    t.close()
