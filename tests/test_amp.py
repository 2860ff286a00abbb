"""Mixed precision and model speed options in training (the CPU-testable part of the
GPU speed work): fp16 loss scaling, its checkpointing, and options a device cannot run."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import final_params, rows, run, train_cmd


@pytest.fixture(scope="module")
def small_events_dir(tmp_path_factory):
    """10 events at 300 x 300 (half of them to train: 2 steps an epoch at minibatch 4):
    CPU float16 convolutions are ~25x slower than float32."""
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("events_ds12")
    write_dataset(d, 10, seed=99, downsample=12, workers=1)
    return d


@pytest.mark.slow
def test_fp16_training_scales_the_loss_and_resumes_exactly(small_events_dir, tmp_path):
    """JishNet under fp16 autocast with dynamic loss scaling (CPU autocast supports
    float16): the run completes with finite losses, the scaler's state is checkpointed,
    and 2 epochs + 1 resumed epoch equal 3 epochs in one go."""
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    sets = ("data.downsample=12", "data.eval_fraction=0.5", "train.amp=fp16",
            "train.batch_per_rank=4")

    def cmd(out, epochs):
        return train_cmd(small_events_dir, out, *sets, f"train.epochs={epochs}")

    r = run(cmd(ref, 3))
    assert r.returncode == 0, r.stderr
    log = rows(ref / "rank-000.csv")
    losses = [float(x["local_loss"]) for x in log]
    assert all(torch.isfinite(torch.tensor(losses)))
    state = torch.load(ref / "checkpoint.pt", weights_only=False)
    scale = state["scaler"]["scale"]
    # dynamic scaling from 2^16: halved at each overflowing step, never grown within the
    # 2,000-step growth interval; whether these events' gradients overflow at 2^16
    # depends on the generator (they did before +sim2, not since)
    assert scale in [2.0 ** k for k in range(17)]
    for epochs in (2, 3):
        r = run(cmd(cut, epochs))
        assert r.returncode == 0, r.stderr
    assert [x["local_loss"] for x in rows(cut / "rank-000.csv")] == \
        [x["local_loss"] for x in log]
    pa, pb = final_params(ref), final_params(cut)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert len(json.loads((cut / "run.json").read_text())["segments"]) == 2


@pytest.mark.parametrize("config,sets,message", [
    ("tiny-scnet", ["train.amp=bf16"], "spconv has no bfloat16"),
    ("tiny-scnet", ["train.amp=fp16", "train.device=cpu"], "needs CUDA"),
    ("tiny-scnet", ["model.algo=implicit_gemm", "train.device=cpu"], "needs a CUDA build"),
    ("tiny-scnet", ["model.channels_last=true"], "JishNet option"),
    ("tiny-jishnet", ["model.algo=native"], "SCNet option"),
    ("tiny-jishnet", ["model.algo=fastest"], "model.algo"),
    ("tiny-jishnet", ["train.amp=fp8"], "train.amp"),
])
def test_speed_option_the_device_cannot_run_is_one_clear_error(train_events_dir, tmp_path,
                                                                config, sets, message):
    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out, *sets, config=config), timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_scaler_skips_the_same_step_on_every_backend_path():
    """A step whose averaged gradients hold inf is skipped, and the next step updates
    (the torch backend's former wrapper kept a stale 'already synchronized' flag across
    a skipped step; under DDP backward itself averages, so the step is plain)."""
    from lartpc.dist.torch_world import TorchWorld

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    world = TorchWorld(rank=0, local_rank=0, size=1, local_size=1, device=torch.device("cpu"))
    assert world.distributed_optimizer(opt, torch.nn.Linear(1, 1)) is opt
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    for grad, moved in ((torch.tensor([1.0, float("inf"), 0.0]), False),
                        (torch.tensor([1.0, 1.0, 1.0]), True)):
        opt.zero_grad()
        before = w.detach().clone()
        scaler.scale((w * grad).sum()).backward()
        assert world.step_optimizer(opt, scaler) == 0.0  # nothing exchanged
        assert (not torch.equal(before, w.detach())) is moved
    assert scaler.get_scale() == 2.0  # halved once, for the inf step
