"""Learning-rate scaling, warmup and the optimizer choice of the training protocol."""

from __future__ import annotations

import pytest
import torch

from lartpc.config import TrainConfig, load_config
from lartpc.train.optim import build_optimizer, lr_at, scaled_lr


@pytest.mark.parametrize("rule,n,expected", [("none", 8, 1e-3), ("linear", 8, 8e-3),
                                             ("sqrt", 16, 4e-3)])
def test_scaled_lr(rule, n, expected):
    assert scaled_lr(TrainConfig(lr_scaling=rule), n) == pytest.approx(expected)


def test_warmup_ramps_linearly_to_the_scaled_rate():
    cfg = TrainConfig(lr=0.1, lr_scaling="linear", warmup_epochs=2)
    steps = 10  # per epoch: warmup lasts 20 steps
    assert lr_at(cfg, 4, 0, steps) == pytest.approx(0.1)
    assert lr_at(cfg, 4, 10, steps) == pytest.approx(0.25)
    assert lr_at(cfg, 4, 20, steps) == pytest.approx(0.4)
    assert lr_at(cfg, 4, 500, steps) == pytest.approx(0.4)


def test_paper_preset_builds_the_papers_adam():
    cfg = load_config("paper-jishnet").train
    opt = build_optimizer(cfg, torch.nn.Linear(3, 2))
    assert isinstance(opt, torch.optim.Adam)
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8, 0.01)
    assert cfg.batch_per_rank == 7 and cfg.time_limit_s == 14400


def test_sgd_for_the_goyal_comparison():
    cfg = load_config("paper-jishnet", ["train.optimizer=\"sgd\"", "train.lr=0.1"]).train
    opt = build_optimizer(cfg, torch.nn.Linear(3, 2))
    assert isinstance(opt, torch.optim.SGD)
    assert opt.param_groups[0]["momentum"] == 0.9
    g = opt.param_groups[0]
    assert (g["lr"], g["weight_decay"], g["nesterov"]) == (0.1, 0.01, False)
    # Two steps by hand: d = grad + wd * w; buf = 0.9 * buf + d; w -= lr * buf.
    lin = torch.nn.Linear(1, 1, bias=False)
    opt = build_optimizer(cfg, lin)
    with torch.no_grad():
        lin.weight.fill_(2.0)
    w, buf = 2.0, 0.0
    for _ in range(2):
        opt.zero_grad()
        (3.0 * lin.weight).sum().backward()  # gradient 3
        opt.step()
        buf = 0.9 * buf + (3.0 + 0.01 * w)
        w -= 0.1 * buf
    assert lin.weight.item() == pytest.approx(w, rel=1e-6)
    assert w == pytest.approx(1.124502)
