"""Training losses: ``ce`` (cross-entropy on logits, the default) and ``paper``.

The study's networks ended in softmax and fed those probabilities to a cross-entropy
that applies softmax again. Its per-sample value is ``-p_y + log(sum_j exp(p_j))`` for
probabilities ``p``: at best (p one-hot on the true class) ``log(e + 4) - 1 = 0.905``,
at worst (one-hot on a wrong class) ``log(e + 4) = 1.905``, and ``ln 5 = 1.609`` at
uniform ``p``. That is the scale of the published loss curves and of their
time-to-loss threshold 1.2, so ``paper`` exists to compare with them; it trains poorly
(the gradient vanishes as p saturates) and is not the default.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lartpc import NUM_CLASSES
from lartpc.errors import ConfigError
from lartpc.models import LOSSES

#: Range of the per-sample ``paper`` loss for 5 classes, and its chance level.
PAPER_LOSS_MIN = math.log(math.e + NUM_CLASSES - 1) - 1.0
PAPER_LOSS_MAX = math.log(math.e + NUM_CLASSES - 1)
CHANCE_LOSS = math.log(NUM_CLASSES)


class PaperLoss(nn.Module):
    """Cross-entropy applied to softmax probabilities (the study's loss scale)."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # float32: under bf16 autocast the double softmax would lose the 0.905 floor
        return F.cross_entropy(F.softmax(logits.float(), dim=1), labels)


class LogitCrossEntropy(nn.Module):
    """Ordinary cross-entropy on logits (mean over the batch)."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels)


#: each loss's module, paired with model.loss's values (lartpc.models.LOSSES) in their
#: order (strict: a name added there fails here)
MODULES: dict[str, type[nn.Module]] = dict(zip(LOSSES, (LogitCrossEntropy, PaperLoss),
                                               strict=True))


def build_loss(name: str = "ce") -> nn.Module:
    """Loss module ``loss(logits (B, C), labels (B,)) -> scalar mean``.

    Parameters
    ----------
    name : ``ce`` (cross-entropy on logits) or ``paper`` (cross-entropy on softmax
        probabilities, the published loss scale).
    """
    if name not in MODULES:
        raise ConfigError(f"model.loss={name!r}: expected one of {', '.join(MODULES)}")
    return MODULES[name]()
