"""The classifier head both networks share: Linear(flat, 32) -> ELU -> Linear(32, 5)."""

from __future__ import annotations

import torch
from torch import nn

from lartpc import NUM_CLASSES

HIDDEN = 32


class Head(nn.Module):
    """Flatten a (B, C, H, W) map and classify it into logits (B, 5).

    Parameters
    ----------
    in_features : C * H * W of the map the trunk produces.
    hidden : width of the hidden layer (32 in the study).
    num_classes : number of output logits.
    """

    def __init__(self, in_features: int, hidden: int = HIDDEN, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.in_features = in_features
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.ELU()
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # reshape, not view: a channels_last map is not contiguous in NCHW order
        return self.fc2(self.act(self.fc1(x.reshape(x.shape[0], -1))))
