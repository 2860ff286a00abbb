"""`lartpc bench train`'s bare step: the trainer's own step on the training's own
batches, with no loop around it, and the loop's overhead over it in the JSON."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch
from train_helpers import BIN, clean_env, run

from lartpc import dist
from lartpc.bench.bare_step import BareStep
from lartpc.config import load_config
from lartpc.data.store import EventStore
from lartpc.train.plan import plan_run
from lartpc.train.segments import Segment
from lartpc.train.trainer import Trainer

SETS = ["data.downsample=9", "data.eval_fraction=0.2", "train.epochs=2", "train.threads=1"]


@pytest.mark.sparse
@pytest.mark.parametrize("rulebooks", ["forward", "loader"])
def test_bare_step_is_the_trainers_step_on_its_batches(train_events_dir, tmp_path, rulebooks):
    """Across an epoch boundary, the bare step sees the batches the trainer sees and
    ends with the very parameters the trainer ends with (its batches carry the loader's
    rulebooks when the training's do)."""
    torch.set_num_threads(1)
    cfg = load_config("tiny-scnet", [*SETS, f"data.rulebooks={rulebooks}"])
    store = EventStore(train_events_dir)
    plan = plan_run(cfg, store, 1)
    n = plan.steps_per_epoch + 2
    t = Trainer.build(Segment(cfg, store, plan, dist.init("none", "cpu"), tmp_path, time.time()))
    seen = []
    while len(seen) < n:
        for batch, data_s in t.batches():
            seen.append((batch.event_ids.copy(), batch.coords.clone(), batch.features.clone()))
            t.step(batch, data_s)
            if len(seen) == n:
                break
        else:
            t.state.next_epoch()
    bare = BareStep(cfg, train_events_dir)
    batches = bare.batches(n)
    for k, b in enumerate(batches):
        ids, coords, features = seen[k]
        assert (b.event_ids == ids).all()
        assert torch.equal(b.coords, coords) and torch.equal(b.features, features)
        assert (b.rulebooks is not None) == (rulebooks == "loader")
        bare.step(b, k)
    for pt, pb in zip(t.model.parameters(), bare.model.parameters(), strict=True):
        assert torch.equal(pt, pb)
    t.close()


@pytest.mark.slow
def test_bench_train_reports_the_bare_step_beside_the_loop(train_events_dir):
    r = run([str(BIN / "lartpc"), "bench", "train", "--model", "scnet", "--ranks", "1",
             "--backend", "none", "--data", str(train_events_dir), "--downsample", "9",
             "--bare-steps", "4", "--set", "train.epochs=1", "--set", "data.eval_fraction=0.2",
             # a fixed number of epochs, not seconds: a loaded machine takes the same steps
             "--seconds", "600"],
            timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    bare, point = res["bare_step"], res["points"][0]
    assert point["rulebooks"] == "forward"
    assert bare["bare_steps"] == 4 and bare["bare_threads"] == point["threads_per_rank"] == 1
    assert bare["bare_step_s_median"] > 0 and point["bare_step_s_median"] == \
        bare["bare_step_s_median"]
    assert point["loop_overhead"] == pytest.approx(
        point["step_s_median"] / bare["bare_step_s_median"] - 1)


@pytest.mark.slow
def test_two_bench_trainings_under_torchrun_at_once(train_events_dir, tmp_path):
    """`--backend torch` points: torchrun on a free port of the host each time (a fixed
    port made the second of two benches beside each other fail to start)."""
    cmd = [str(BIN / "lartpc"), "bench", "train", "--model", "scnet", "--ranks", "2",
           "--backend", "torch", "--data", str(train_events_dir), "--downsample", "9",
           "--bare-steps", "0", "--set", "train.epochs=1", "--set", "train.threads=1",
           # one epoch whatever the load (the default 60 s may end two loaded runs early)
           "--seconds", "600"]
    logs = [tmp_path / f"bench-{i}.json" for i in range(2)]
    procs = []
    for log in logs:
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE, text=True,
                                          env=clean_env()))
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        errs.append(err)
    for log, err in zip(logs, errs, strict=True):
        (point,) = json.loads(log.read_text())["points"]
        assert point["ranks"] == 2 and point["backend"] == "torch" and point["steps"] > 1
        # one epoch is a few steps: the point says its rates are those few steps'
        assert point["few_steps"] and f"{point['steps'] - 1} step(s) measured" in err
