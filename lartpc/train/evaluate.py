"""Evaluation over the held-out events: each seen exactly once across ranks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lartpc import CLASSES
from lartpc.dist import World


@dataclass
class EvalResult:
    loss: float
    n_events: int
    confusion: np.ndarray  # (k, k) int counts, rows true, k = len(classes)
    classes: tuple[str, ...] = CLASSES  # the store's classes

    def row(self) -> dict:
        correct = np.diag(self.confusion)
        per_class = correct / np.maximum(self.confusion.sum(1), 1)
        return {"loss": self.loss, "accuracy": float(correct.sum() / max(self.n_events, 1)),
                "n_events": self.n_events,
                **{f"acc_{c}": float(a) for c, a in zip(self.classes, per_class, strict=True)}}


@torch.no_grad()
def evaluate(model, loader, world: World, loss_fn, autocast,
             classes: tuple[str, ...] = CLASSES) -> EvalResult:
    """Loss (event-weighted mean) and confusion matrix summed over all ranks, over the
    store's ``classes``.

    ``loader`` is None on a rank without held-out events. Ranks may hold different
    numbers of them; the only
    collective comes after the loop, so unequal step counts cannot deadlock.
    """
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    k = len(classes)
    conf = torch.zeros(k, k, dtype=torch.float64)
    for batch in (loader if loader is not None else ()):
        with autocast():
            logits = model(batch).float()
        loss_sum += float(loss_fn(logits, batch.labels)) * batch.batch_size
        pred = logits.argmax(1).cpu()
        idx = batch.labels.cpu() * k + pred
        conf += torch.bincount(idx, minlength=k ** 2).view(k, -1)
    totals = world.allreduce_sum(torch.cat([conf.flatten(), torch.tensor([loss_sum])]))
    conf = totals[:-1].view(k, k).round().to(torch.int64).numpy()
    n = int(conf.sum())
    model.train(was_training)
    return EvalResult(loss=float(totals[-1]) / max(n, 1), n_events=n, confusion=conf,
                      classes=tuple(classes))
