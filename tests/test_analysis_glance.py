"""The report's opening and the demo's closing summary on real `lartpc train` output:
sparse vs dense images/s per rank on the same events, and the shared-host warning."""

from __future__ import annotations

import os

import pytest
from lartpc.analysis.glance import at_a_glance, noise_lines
from lartpc.analysis.tables import analyse
from train_helpers import BIN, run, train_cmd

pytestmark = [pytest.mark.slow, pytest.mark.horovod, pytest.mark.sparse]


def test_glance_on_real_runs(train_events_dir, tmp_path):
    runs = tmp_path / "runs"
    for model in ("jishnet", "scnet"):
        r = run(train_cmd(train_events_dir, runs / f"{model}-n1", "train.epochs=1",
                          config=f"tiny-{model}"))
        assert r.returncode == 0, r.stderr[-2000:]
    two = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           *train_cmd(train_events_dir, runs / "jishnet-n2", "train.epochs=1")]
    r = run(two, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:]
    a = analyse([runs])
    lines = at_a_glance(a)
    rate = {m.model: m.images_per_s_per_gpu for m in a.rows if m.world_size == 1}
    assert lines[0].startswith("Sparse against dense, on the same events: SCNet ")
    assert f"{rate['scnet'] / rate['jishnet']:.3g}x per rank" in lines[0]
    crowded = [t for t in lines if "measure contention" in t]
    # two one-thread ranks fill a host of <= 2 cores (this machine and CI); not a bigger one
    assert len(crowded) == (1 if (os.cpu_count() or 1) <= 2 else 0)
    if crowded:
        assert crowded[0].startswith("jishnet: the 2-rank runs ran on one host with")
        assert "the 1-rank one" in crowded[0]


def _result(b: float | None, n: float | None, bound: bool = False, runs=()) -> dict:
    return {"model": "scnet", "b_noise": b, "n_crit": n, "threshold_loss": 1.2,
            "b_noise_is_lower_bound": bound, "measured": {"noise_per_run": list(runs)}}


def test_noise_lines_say_n_crit():
    lines = noise_lines([_result(50.0, 7.1, runs=[{"run": "a", "loss": 1.2,
                                                    "reached": True}]),
                         {"model": "jishnet", "b_noise": None, "n_crit": None}])
    assert lines == ["scnet: gradient noise scale B_noise 50 at loss 1.2, N_crit 7.1 ranks "
                     "(N_crit = B_noise / minibatch): beyond that, more ranks at this "
                     "per-rank minibatch barely shorten the time to loss."]


def test_noise_lines_say_a_lower_bound_and_the_loss_it_was_taken_at():
    """A noise scale whose |G|^2 was not resolved is a lower bound (>), and one taken
    from a run that never reached the threshold is at the loss of its lowest rows."""
    lines = noise_lines([_result(18.3, 2.61, bound=True, runs=[
        {"run": "jishnet-n1", "loss": 1.71, "reached": False}])])
    assert lines[0].startswith("scnet: gradient noise scale B_noise >18.3 at loss 1.71 "
                               "(loss 1.2 not reached by jishnet-n1: its lowest rows), "
                               "N_crit >2.61 ranks")
