"""Gradient noise scale: the estimator recovers a known B_noise from synthetic gradients,
and the training meter (hooks, halves, noise.csv) measures it on a linear model."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from train_helpers import BIN, rows, run, train_cmd

from lartpc.data.batch import Batch
from lartpc.dist import LocalWorld
from lartpc.errors import ConfigError
from lartpc.train.noise import (
    NOISE_COLUMNS,
    NoiseMeter,
    estimates,
    harmonic_mean,
    resolve_mode,
    split_batch,
)

# Per-example gradients g_i = G + e_i, e_i ~ N(0, s^2 I_d): tr(Sigma) = d s^2.
D, S, G_NORM2 = 40, 1.0, 1.6
B_NOISE = D * S**2 / G_NORM2  # 25 examples


def _true_gradient() -> np.ndarray:
    return np.full(D, math.sqrt(G_NORM2 / D))


def test_estimates_are_exact_on_expected_norms():
    g2, tr = 2.0, 30.0
    est = estimates(g2 + tr / 7, 7, g2 + tr / 28, 28)
    assert est == pytest.approx((g2, tr), rel=1e-12)
    assert harmonic_mean([3, 4]) == pytest.approx(24 / 7)
    with pytest.raises(ValueError, match="b_small < b_big"):
        estimates(1.0, 7, 1.0, 7)


def test_ranks_estimator_recovers_b_noise_within_10_percent():
    """N ranks of 7 examples: mean local |g|^2 (B=7) and |mean g|^2 (B=7N), as training."""
    rng = np.random.default_rng(0)
    n_ranks, b, steps = 4, 7, 3000
    g = _true_gradient()
    per_example = g + S * rng.standard_normal((steps, n_ranks, b, D))
    local = per_example.mean(axis=2)  # (steps, ranks, D)
    g2_small = (local**2).sum(-1).mean(-1)
    g2_big = (local.mean(axis=1) ** 2).sum(-1)
    g2_est, tr_est = zip(*(estimates(s, b, big, b * n_ranks)
                           for s, big in zip(g2_small, g2_big, strict=True)), strict=True)
    b_noise = np.mean(tr_est) / np.mean(g2_est)
    assert b_noise == pytest.approx(B_NOISE, rel=0.10)
    assert np.mean(tr_est) == pytest.approx(D * S**2, rel=0.05)


class _Linear(torch.nn.Module):
    """loss = mean_i w . x_i: the gradient of example i is x_i itself."""

    input_kind = "dense"

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(D, dtype=torch.float64))

    def forward(self, batch: Batch) -> torch.Tensor:
        return (batch.dense.flatten(1) @ self.w)[:, None]


def _mean_output(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return out.mean()


def test_meter_halves_recovers_b_noise_and_writes_noise_csv(tmp_path):
    torch.manual_seed(0)
    model, world = _Linear(), LocalWorld()
    meter = NoiseMeter("halves", 2, world, model, tmp_path)
    g = torch.from_numpy(_true_gradient())
    rows = []
    for step in range(3000):
        x = g + S * torch.randn(8, D, dtype=torch.float64)
        batch = Batch(labels=torch.zeros(8, dtype=torch.int64), shape=(1, D),
                      dense=x[:, None, None, :])
        model.zero_grad(set_to_none=True)
        _, loss = meter.forward_backward(model, _mean_output, batch, _nullctx, step)
        assert float(loss) == pytest.approx(float((x @ model.w.detach()).mean()))
        # the accumulated gradient is the whole minibatch's mean
        assert torch.allclose(model.w.grad, x.mean(0))
        row = meter.record(step, 0, float(loss))
        assert (row is None) == (step % 2 == 1)
        rows += [row] if row else []
    assert rows[0]["batch_small"] == 4 and rows[0]["batch_big"] == 8
    b_noise = np.mean([r["trace_est"] for r in rows]) / np.mean([r["g2_est"] for r in rows])
    assert b_noise == pytest.approx(B_NOISE, rel=0.10)
    with open(tmp_path / "noise.csv") as f:
        written = list(csv.DictReader(f))
    assert len(written) == 1500 and int(written[-1]["step"]) == 2998
    assert float(written[3]["g2_est"]) == pytest.approx(rows[3]["g2_est"], rel=1e-12)


def _nullctx():
    from contextlib import nullcontext

    return nullcontext()


def test_split_batch_sparse_renumbers_events():
    coords = torch.tensor([[0, 1, 1], [1, 2, 2], [2, 3, 3], [2, 4, 4]], dtype=torch.int32)
    b = Batch(labels=torch.tensor([0, 1, 2]), shape=(5, 5), coords=coords,
              features=torch.ones(4, 1))
    first, second = split_batch(b)
    assert first.data_size == 1 and second.data_size == 2
    assert first.coords.tolist() == [[0, 1, 1]]
    assert second.coords[:, 0].tolist() == [0, 1, 1]


@pytest.mark.parametrize("mode,size,message", [
    ("ranks", 1, "needs at least 2 ranks"),
    ("sometimes", 2, "expected one of"),
])
def test_bad_mode_is_config_error(mode, size, message):
    with pytest.raises(ConfigError, match=message):
        resolve_mode(mode, size)


def test_auto_mode_and_halves_anywhere():
    assert resolve_mode("halves", 2) == "halves"
    assert resolve_mode("auto", 1) == "off"  # halves changes rounding: asked for, not default
    assert resolve_mode("auto", 4) == "ranks"


def _assert_noise_csv(path, n_steps: int, every: int, scale: bool = True) -> list[dict]:
    """noise.csv has a row every ``every`` steps, finite positive norms, and (``scale``)
    smoothed estimates that give a positive, finite noise scale."""
    got = rows(path)
    assert list(got[0]) == list(NOISE_COLUMNS)
    assert [int(r["step"]) for r in got] == list(range(0, n_steps, every))
    for r in got:
        for c in ("g2_small", "g2_big", "loss", "batch_small"):
            assert math.isfinite(float(r[c])) and float(r[c]) > 0
    if scale:
        tr = np.mean([float(r["trace_est"]) for r in got])
        g2 = np.mean([float(r["g2_est"]) for r in got])
        assert tr > 0 and g2 > 0 and math.isfinite(tr / g2)
    return got


# 3 epochs (12 rows): single-step |G|^2 estimates swing in sign on 70 events, their mean
# over one epoch's 4 steps was negative on the +sim2 events
NOISE_SETS = ("train.epochs=3", "train.noise_scale=ranks", "train.noise_every_steps=1")


@pytest.fixture(scope="module")
def two_rank_noise_runs(train_events_dir, tmp_path_factory):
    """The same 2-rank training under Horovod (gradient hooks on each parameter) and
    under torchrun (DistributedDataParallel, the local norms taken in its bucket hook)."""
    base = tmp_path_factory.mktemp("noise-runs")
    launchers = {
        "horovod": [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"],
        "torch": [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                  "--no-python"],
    }
    outs = {}
    for name, launch in launchers.items():
        out = base / name
        r = run([*launch, *train_cmd(train_events_dir, out, *NOISE_SETS)], timeout=600)
        assert r.returncode == 0, f"{name}: " + r.stdout[-3000:] + r.stderr[-3000:]
        outs[name] = out
    return outs


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_two_rank_training_writes_noise_csv(two_rank_noise_runs, backend):
    out = two_rank_noise_runs[backend]
    got = _assert_noise_csv(out / "noise.csv", len(rows(out / "rank-000.csv")), 1)
    # 7 per rank (an epoch's short last step makes B_small a harmonic mean); B_big = 2 B_small
    assert float(got[0]["batch_small"]) == 7
    for r in got:
        assert float(r["batch_big"]) == pytest.approx(2 * float(r["batch_small"]))
        # |mean of local gradients|^2 <= mean of |local|^2 (Jensen), whatever the data
        assert float(r["g2_big"]) <= float(r["g2_small"])


@pytest.mark.slow
@pytest.mark.horovod
def test_ddp_bucket_hook_measures_what_horovod_hooks_measure(two_rank_noise_runs):
    """Both backends train the same steps (their rank logs agree), so the norms of the
    local and the averaged gradients must agree too: DDP's are summed bucket by bucket,
    Horovod's parameter by parameter, which changes only the float rounding."""
    hvd, ddp = (rows(two_rank_noise_runs[b] / "noise.csv") for b in ("horovod", "torch"))
    assert [r["step"] for r in ddp] == [r["step"] for r in hvd]
    for a, b in zip(ddp, hvd, strict=True):
        for c in ("g2_small", "g2_big", "batch_small", "batch_big", "loss"):
            assert float(a[c]) == pytest.approx(float(b[c]), rel=1e-4), (a["step"], c)


@pytest.mark.slow
@pytest.mark.horovod
def test_single_rank_halves_training_writes_noise_csv(train_events_dir, tmp_path):
    """Halves under Horovod's optimizer (the demo's 1-rank runs use horovodrun -np 1)."""
    out = tmp_path / "run"
    r = run([str(BIN / "horovodrun"), "-np", "1", "-H", "localhost:1", "--gloo",
             *train_cmd(train_events_dir, out, "train.epochs=1", "train.noise_scale=halves",
                        "train.noise_every_steps=2")])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # four halves estimates at minibatch 7 are too few for a positive mean |G|^2 (on the
    # +sim4 events: 6.4, -229.5, 71.3, 13.1); the two-rank runs' 12 rows check the scale
    got = _assert_noise_csv(out / "noise.csv", len(rows(out / "rank-000.csv")), 2,
                            scale=False)
    assert float(got[0]["batch_small"]) == pytest.approx(24 / 7)  # halves of 3 and 4
    assert float(got[0]["batch_big"]) == 7


def test_analysis_reads_the_columns_training_writes():
    from lartpc.analysis.noise import NOISE_COLUMNS as READ

    assert READ == NOISE_COLUMNS
