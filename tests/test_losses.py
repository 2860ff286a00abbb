"""Losses against values computed by hand (math module, not torch)."""

from __future__ import annotations

import math

import pytest
import torch

from lartpc.errors import ConfigError
from lartpc.models.losses import CHANCE_LOSS, PAPER_LOSS_MAX, PAPER_LOSS_MIN, build_loss


def paper_by_hand(logits: list[float], y: int) -> float:
    """-p_y + log(sum_j exp(p_j)) with p = softmax(logits)."""
    z = sum(math.exp(v) for v in logits)
    p = [math.exp(v) / z for v in logits]
    return -p[y] + math.log(sum(math.exp(q) for q in p))


def test_constants_are_the_published_loss_scale():
    # p one-hot on the true class: -1 + log(e + 4); on a wrong class: log(e + 4)
    assert PAPER_LOSS_MIN == pytest.approx(math.log(math.e + 4) - 1)
    assert PAPER_LOSS_MIN == pytest.approx(0.9048, abs=1e-4)
    assert PAPER_LOSS_MAX == pytest.approx(1.9048, abs=1e-4)
    assert CHANCE_LOSS == pytest.approx(1.6094, abs=1e-4)


def test_paper_loss_extremes_and_chance():
    loss = build_loss("paper")
    confident = torch.tensor([[100.0, 0, 0, 0, 0]])
    assert loss(confident, torch.tensor([0])).item() == pytest.approx(0.904833, abs=1e-5)
    assert loss(confident, torch.tensor([3])).item() == pytest.approx(1.904833, abs=1e-5)
    uniform = torch.full((4, 5), 0.3)
    assert loss(uniform, torch.tensor([0, 1, 2, 4])).item() == pytest.approx(math.log(5), abs=1e-6)


def test_paper_loss_hand_computed_batch_mean():
    # softmax of (ln 2, 0, 0, 0, 0) is (1/3, 1/6, 1/6, 1/6, 1/6)
    logits = [[math.log(2), 0, 0, 0, 0], [0.5, -1.0, 2.0, 0.0, 1.0]]
    y = [0, 3]
    by_hand_0 = -1 / 3 + math.log(math.exp(1 / 3) + 4 * math.exp(1 / 6))
    assert paper_by_hand(logits[0], 0) == pytest.approx(by_hand_0)
    want = (by_hand_0 + paper_by_hand(logits[1], 3)) / 2
    got = build_loss("paper")(torch.tensor(logits), torch.tensor(y)).item()
    assert got == pytest.approx(want, abs=1e-6)


def test_ce_hand_computed():
    ce = build_loss("ce")
    # -log(1/3) and -log(1/6)
    logits = torch.tensor([[math.log(2), 0, 0, 0, 0]] * 2)
    assert ce(logits, torch.tensor([0, 2])).item() == pytest.approx(
        (math.log(3) + math.log(6)) / 2, abs=1e-6)
    assert ce(torch.zeros(3, 5), torch.tensor([0, 1, 4])).item() == pytest.approx(math.log(5))


def test_paper_loss_stays_in_range_and_ce_is_unbounded():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 5, generator=g) * 20
    y = torch.randint(0, 5, (200,), generator=g)
    paper, ce = build_loss("paper"), build_loss("ce")
    per_sample = torch.stack([paper(logits[i:i + 1], y[i:i + 1]) for i in range(200)])
    assert per_sample.min() >= PAPER_LOSS_MIN - 1e-6
    assert per_sample.max() <= PAPER_LOSS_MAX + 1e-6
    assert per_sample.max() - per_sample.min() > 0.9  # the range is actually used
    assert ce(logits, y) > PAPER_LOSS_MAX


def test_paper_loss_gradient_flows_and_is_finite():
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5, 0.0]], requires_grad=True)
    build_loss("paper")(logits, torch.tensor([2])).backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 2] < 0  # raising the true logit lowers the loss


def test_paper_loss_computed_in_float32_under_bf16_logits():
    logits = torch.tensor([[100.0, 0, 0, 0, 0]], dtype=torch.bfloat16)
    out = build_loss("paper")(logits, torch.tensor([0]))
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(0.904833, abs=1e-5)


def test_unknown_loss_is_a_config_error_naming_model_loss():
    with pytest.raises(ConfigError, match="model.loss='mse': expected one of ce, paper"):
        build_loss("mse")


def test_every_configurable_loss_builds_its_own_module():
    """model.loss's allowed values are the losses build_loss makes, name for name."""
    from lartpc.config import CHOICES
    from lartpc.models.losses import LogitCrossEntropy, PaperLoss

    assert CHOICES["model.loss"] == ("ce", "paper")
    assert type(build_loss("ce")) is LogitCrossEntropy
    assert type(build_loss("paper")) is PaperLoss
