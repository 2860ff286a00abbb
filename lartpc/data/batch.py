"""The batch every loader yields and every model accepts.

A dense batch fills ``dense``; a sparse batch fills ``coords``/``features``. Models
declare which they need with their ``input_kind`` attribute (``"dense"`` or
``"sparse"``), so the training loop never needs to know which model it drives.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch


@dataclass(slots=True)
class Batch:
    """One minibatch.

    Attributes
    ----------
    labels : int64 (B,) class indices.
    shape : (H, W) of the image geometry.
    dense : float32 (B, 1, H, W) or None.
    coords : int32 (P, 3) rows of (batch index, row, col) or None; spconv's layout.
    features : float32 (P, 1) charge at ``coords`` or None.
    event_ids : int64 (B,) store indices of the events (for bookkeeping and tests).
    truth : per-event truth arrays, each of leading length B.
    rulebooks : spconv rulebooks (:mod:`lartpc.models.rulebooks`) or the torch layers'
        index tables (:mod:`lartpc.models.sparse_torch`) built ahead for ``coords``
        (``data.rulebooks = loader``), or None: the model builds them.
    dense_reused : ``dense`` is one of the few buffers the loader rewrites in turn (the
        device-dense loader's), not a tensor of this batch's own: a CUDA graph may read
        it where it lies (``train.cuda_graph``). False for a copy or a new tensor.
    """

    labels: torch.Tensor
    shape: tuple[int, int]
    dense: torch.Tensor | None = None
    coords: torch.Tensor | None = None
    features: torch.Tensor | None = None
    event_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    truth: dict[str, np.ndarray] = field(default_factory=dict)
    rulebooks: object | None = None
    dense_reused: bool = False

    @property
    def data_size(self) -> int:
        """The events in this batch: the rank log's ``data_size`` (a shard's last batch may
        hold fewer than ``train.batch_per_rank``)."""
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Copy tensors to ``device`` (a no-op for tensors already there)."""
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        dense = mv(self.dense)
        return replace(self, labels=mv(self.labels), dense=dense,
                       coords=mv(self.coords), features=mv(self.features),
                       dense_reused=self.dense_reused and dense is self.dense)
