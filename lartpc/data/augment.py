"""Training-time augmentation: ``data.augment = "mirror"``.

Each training event is mirrored on the wire axis, on the time axis, both or neither,
one of the four with equal chance. The choice is a hash of (``train.seed``, epoch,
the event's store index), so every rank, every rerun and every resumed segment sees
the same mirror of the same event in the same epoch, and a resumed run stays equal to
an uninterrupted one. Evaluation batches are never mirrored.

Where it fits: in isotropic events a mirrored event is as likely as the original
(directions are uniform; the vertex distribution maps into wire and time ranges the
detector may leave empty, which carries no class). On the time axis it is only
approximate: the drift runs along it, so a mirrored track's diffusion and charge loss
grow the wrong way along the track. Both are small: at the full 256 cm drift the
longitudinal and transverse spreads are 0.13 cm (0.8 time pixel) and 0.21 cm (0.7
wire), and with a 10 ms electron lifetime the charge falls 4.5 % per 50 cm of drift.
In beam events every start sits upstream; mirroring takes that away, so it is meant
for isotropic events. The paper trained without augmentation (the default, ``none``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from lartpc.data.batch import Batch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  #: the splitmix64 increment


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Steele, Lea and Flood's splitmix64 finaliser: a 64-bit mix, uniform low bits."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def mirror_flags(seed: int, epoch: int, event_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mirror on the wire axis, mirror on the time axis), bool arrays like ``event_ids``."""
    ids = np.asarray(event_ids, np.int64).astype(np.uint64)
    key = _splitmix64(_splitmix64(np.array([seed], np.uint64)) ^ np.uint64(epoch))
    h = _splitmix64(ids ^ key)
    return (h & np.uint64(1)).astype(bool), ((h >> np.uint64(1)) & np.uint64(1)).astype(bool)


def mirror(batch: Batch, seed: int, epoch: int) -> Batch:
    """A copy of ``batch`` with each event mirrored as :func:`mirror_flags` says.

    The loader's batch is a view of its buffers and is left untouched.
    """
    wire, time = mirror_flags(seed, epoch, batch.event_ids)
    if not (wire.any() or time.any()):
        return batch
    h, w = batch.shape
    if batch.dense is not None:
        dense = torch.stack([_flip(img, bool(fw), bool(ft))
                             for img, fw, ft in zip(batch.dense, wire, time, strict=True)])
        return dataclasses.replace(batch, dense=dense, dense_reused=False)
    c = batch.coords
    b = c[:, 0].long()
    fw = torch.from_numpy(wire).to(c.device)[b]
    ft = torch.from_numpy(time).to(c.device)[b]
    coords = c.clone()
    coords[:, 1] = torch.where(ft, h - 1 - c[:, 1], c[:, 1])
    coords[:, 2] = torch.where(fw, w - 1 - c[:, 2], c[:, 2])
    return dataclasses.replace(batch, coords=coords)


def _flip(img: torch.Tensor, wire: bool, time: bool) -> torch.Tensor:
    """One (1, H, W) image mirrored (H: time ticks, W: wires); unmirrored: itself."""
    dims = ([-1] if wire else []) + ([-2] if time else [])
    return torch.flip(img, dims) if dims else img
