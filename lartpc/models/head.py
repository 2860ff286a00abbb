"""The classifier head both networks share: Linear(flat, 32) -> ELU -> Linear(32, 5).

``pooling="flatten"`` is the study's head: the whole (C, H, W) map of the trunk goes into
the first dense layer, so a feature is weighted by where in the image it appears (9 x 9
cells for SCNet at full resolution). ``pooling="max"`` first takes each channel's maximum
over the map, so the head sees C numbers and a feature counts the same wherever the
event lies (a diagnostic, not the published network; it has fewer parameters).
"""

from __future__ import annotations

import torch
from torch import nn

from lartpc import NUM_CLASSES
from lartpc.errors import ConfigError
from lartpc.models import HEADS

HIDDEN = 32


class Head(nn.Module):
    """Classify a (B, C, H, W) map into logits (B, 5).

    Parameters
    ----------
    channels : C of the map the trunk produces.
    map_hw : (H, W) of that map.
    pooling : ``flatten`` (the study) or ``max`` (each channel's maximum over the map).
    hidden : width of the hidden layer (32 in the study).
    num_classes : number of output logits.
    """

    def __init__(self, channels: int, map_hw: tuple[int, int], pooling: str = "flatten",
                 hidden: int = HIDDEN, num_classes: int = NUM_CLASSES):
        super().__init__()
        if pooling not in HEADS:
            raise ConfigError(f"model.head={pooling!r}: expected one of {', '.join(HEADS)}")
        self.pooling = pooling
        self.in_features = channels * (map_hw[0] * map_hw[1] if pooling == "flatten" else 1)
        self.fc1 = nn.Linear(self.in_features, hidden)
        self.act = nn.ELU()
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pooling == "max":
            x = x.amax(dim=(2, 3))
        # reshape, not view: a channels_last map is not contiguous in NCHW order
        return self.fc2(self.act(self.fc1(x.reshape(x.shape[0], -1))))
