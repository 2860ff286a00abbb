"""What the fused-kernel tests share: Triton's CPU interpreter switched on where there
is no GPU (before anything imports Triton, so import this module first) and images of
generated events to run the kernels on."""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def event_images(n: int, downsample: int, seed: int = 7) -> torch.Tensor:
    """(n, 1, H, W) float32 images of generated events (mostly empty, as real ones)."""
    from lartpc.geometry import Geometry
    from lartpc.sim import simulate_event

    g = Geometry(downsample=downsample)
    dense = np.stack([simulate_event(i, seed, g).dense(g.shape) for i in range(n)])
    return torch.from_numpy(dense)[:, None].to(DEVICE)
