"""Gradient noise scale measured during training (McCandlish et al. 2018, app. A).

Every ``train.noise_every_steps`` steps the squared gradient norm is taken at two batch
sizes that data-parallel training already has:

* ``ranks``: each rank's local gradient (B_small = its minibatch, taken *before* it is
  averaged: under DDP from each bucket DDP hands to allreduce, under Horovod by tensor
  hooks on the parameters) and the averaged gradient (B_big = the sum of the
  minibatches, read after the exchange);
* ``halves``: each rank's minibatch split in two halves, each with its own backward
  pass (B_small = a half), and the averaged gradient (B_big = the minibatches summed);
  the one-rank estimator.

Unbiased estimates of the true gradient's squared norm and the per-example covariance
trace follow from E|g_B|^2 = |G|^2 + tr(Sigma)/B; rank 0 appends them to ``noise.csv``.
The ratio ``b_simple = trace_est / g2_est`` of single steps is very noisy (and can be
negative): smooth ``g2_est`` and ``trace_est`` separately before dividing
(``lartpc.analysis.noise`` does).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from contextlib import nullcontext
from pathlib import Path

import torch

from lartpc.errors import ConfigError, LartpcError
from lartpc.fsutil import (
    UnsafePathError,
    atomic_write,
    open_nofollow,
    read_nofollow,
    refuse_symlink,
)
from lartpc.runfolder.schema import NOISE_COLUMNS

log = logging.getLogger(__name__)

MODES = ("off", "auto", "ranks", "halves")


def estimates(g2_small: float, b_small: float, g2_big: float, b_big: float
              ) -> tuple[float, float]:
    """Unbiased |G|^2 and tr(Sigma) from squared gradient norms at two batch sizes.

    Parameters
    ----------
    g2_small, g2_big : squared norms of mean gradients over ``b_small`` and ``b_big``
        examples (``g2_small`` may itself be an average of several such norms).
    b_small, b_big : the batch sizes, ``b_small < b_big``; for an average of norms at
        unequal sizes use the harmonic mean of the sizes (E|g_b|^2 is linear in 1/b).

    Returns
    -------
    (g2_est, trace_est) : |G|^2 and tr(Sigma) estimates; each is noisy and either may be
        negative on a single step.
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    trace = (g2_small - g2_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def harmonic_mean(sizes: list[float]) -> float:
    """Harmonic mean of batch sizes: the B_small whose 1/B is the mean of 1/b_i."""
    return len(sizes) / sum(1.0 / b for b in sizes)


def resolve_mode(mode: str, world_size: int) -> str:
    """The estimator a run uses: ``auto`` (the default) is ``ranks`` on several ranks and
    ``off`` on one, where the only estimator, ``halves``, runs the measured steps as two
    half-minibatch passes and so changes their rounding: a one-rank run measures only
    when asked for ``halves`` (which works with any number of ranks and either backend);
    ``ranks`` needs two ranks."""
    if mode not in MODES:
        raise ConfigError(f"train.noise_scale={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "auto":
        mode = "ranks" if world_size > 1 else "off"
    if mode == "ranks" and world_size < 2:
        raise ConfigError("train.noise_scale=ranks needs at least 2 ranks; use halves on "
                          "one rank")
    return mode


class NoiseMeter:
    """Hooks on a model's gradients and the ``noise.csv`` writer of one rank.

    Use per step: ``fb = meter.forward_backward(...)`` in place of the ordinary forward
    and backward, the optimizer step, then ``meter.record(...)``. Off steps cost one
    comparison per parameter gradient (per DDP bucket in ``ranks`` mode under DDP).

    ``model`` is the model as trained (DistributedDataParallel for the torch backend).
    """

    def __init__(self, mode: str, every: int, world, model: torch.nn.Module,
                 run: Path | None, scaler=None, start_step: int = 0):
        self.mode = resolve_mode(mode, world.size) if mode != "off" else "off"
        self.every, self.world, self.scaler = every, world, scaler
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.path = Path(run) / "noise.csv" if run is not None else None
        self._active = False
        self._part: int | None = None  # which piece's backward the hooks are observing
        # per piece |g|^2: a float, or {parameter index: 0-d tensor} the hooks fill, summed
        # in parameter order (never in the order gradients or buckets arrive, which differs
        # between a run and its resumed segments)
        self._parts: list = []
        # ranks under DDP: the local gradients in DDP's buckets; otherwise (halves, whose
        # hook must see one half's gradient, not the .grad sum DDP sends; Horovod) hooks
        # on every parameter
        buckets = self.mode == "ranks" and world.watch_local_gradients(self._observe)
        self._handles = [p.register_hook(functools.partial(self._hook, i))
                         for i, p in enumerate(self.params)] \
            if self.mode != "off" and not buckets else []
        if self.path is not None and self.mode != "off":
            self._prepare_log(start_step)

    def _prepare_log(self, start_step: int) -> None:
        """Rank 0 cuts ``noise.csv`` back to ``start_step`` (a resumed run logs each step
        once); a refusal (a symlink there) fails every rank at once."""
        error = None
        if self.world.is_root:
            try:
                keep_rows_before(self.path, start_step)
            except LartpcError as e:
                error = str(e)
        error = self.world.broadcast_object(error)
        if error:
            raise UnsafePathError(error if self.world.is_root else f"rank 0: {error}")

    def due(self, step: int) -> bool:
        return self.mode != "off" and step % self.every == 0

    def _observe(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        self._hook(self._index[id(param)], grad)

    def _hook(self, i: int, grad: torch.Tensor) -> None:
        # Runs as parameter i's gradient is computed, before it is accumulated and before
        # any averaging hook of the distributed optimizer sees it; or with its DDP bucket
        # (local gradients) before the allreduce.
        if self._active and self._part is not None:
            # stays on the device: no synchronisation inside the backward pass
            sq = grad.detach().float().pow(2).sum()
            part = self._parts[self._part]
            part[i] = part[i] + sq if i in part else sq

    def forward_backward(self, model, loss_fn, batch, autocast, step: int):
        """Forward and backward of one step; returns (logits, mean loss).

        On a measured ``halves`` step the minibatch goes through as two halves, each
        weighted by its share so the gradient is the minibatch's. The first half's
        gradient comes from ``torch.autograd.grad`` (no accumulation, so no averaging
        hook fires; under DDP inside ``no_sync``) and is placed in ``.grad``; the second
        half's ordinary backward then accumulates onto it before Horovod's per-parameter
        hook or DDP's bucket sends the sum.
        """
        self._active = self.due(step)
        halves = self._active and self.mode == "halves" and batch.data_size >= 2
        pieces = split_batch(batch) if halves else [batch]
        self._sizes = [pc.data_size for pc in pieces]
        self._weights = [n / batch.data_size for n in self._sizes]
        self._scale = float(self.scaler.get_scale()) if self.scaler else 1.0
        self._parts = [{} for _ in pieces]
        logits, loss = [], 0.0
        for i, (piece, w) in enumerate(zip(pieces, self._weights, strict=True)):
            last = i == len(pieces) - 1
            with nullcontext() if last else self.world.no_sync(model), autocast():
                out = model(piece)
                piece_loss = loss_fn(out.float(), piece.labels)
            scaled = self.scaler.scale(piece_loss * w) if self.scaler else piece_loss * w
            if not last:
                self._part = None  # the hook ignores this pass; the norm is taken here
                grads = torch.autograd.grad(scaled, self.params, allow_unused=True)
                self._parts[i] = _sq_norm(grads)
                _add_to_grad(self.params, grads)
            else:
                self._part = i
                scaled.backward()
            logits.append(out)
            loss = loss + piece_loss.detach() * w
        return torch.cat(logits) if len(logits) > 1 else logits[0], loss

    def record(self, step: int, epoch: int, global_loss: float) -> dict | None:
        """After the optimizer step: combine the norms, write a row on rank 0.

        Every rank must call it on the same steps (it holds a collective).
        """
        if not self._active:
            return None
        self._active = False
        # Undo the loss scale and each piece's weight: norms of mean gradients.
        s2 = self._scale ** 2
        local = [_total(g2) / s2 / w ** 2 for g2, w in zip(self._parts, self._weights,
                                                            strict=True)]
        # the averaged gradient, read after the exchange (and after the fp16 unscale);
        # Adam and SGD do not modify .grad in place
        g2_big = _sq_norm([p.grad for p in self.params])
        n_local = sum(self._sizes)
        t = self.world.allreduce_sum(torch.tensor(
            [sum(local) / len(local), 1.0 / harmonic_mean(self._sizes), 1.0 / n_local],
            dtype=torch.float64))
        n = self.world.size
        g2_small, b_small = float(t[0]) / n, n / float(t[1])
        # both backends average the ranks' mean gradients: 1/B_big = mean(1/n_i) / N
        b_big = n * n / float(t[2])
        row = _row(step, epoch, global_loss, b_small, b_big, g2_small, g2_big)
        if row is not None and self.world.is_root and self.path is not None:
            append_row(self.path, row)
        return row

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        if self.mode == "ranks":
            self.world.watch_local_gradients(None)


def _total(part: float | dict) -> float:
    """A piece's |g|^2: the float taken at once, or the hooks' per-parameter sums added
    in parameter order."""
    if isinstance(part, dict):
        return float(torch.stack([part[i] for i in sorted(part)]).sum()) if part else 0.0
    return float(part)


def _sq_norm(tensors) -> float:
    """Sum of squares of all ``tensors`` (None skipped), one device-to-host copy."""
    parts = [t.detach().float().pow(2).sum() for t in tensors if t is not None]
    return float(torch.stack(parts).sum()) if parts else 0.0


def _add_to_grad(params: list[torch.Tensor], grads) -> None:
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g.detach()
        else:
            p.grad.add_(g)


def _row(step: int, epoch: int, loss: float, b_small: float, b_big: float,
         g2_small: float, g2_big: float) -> dict | None:
    """One noise.csv row, or None when a norm is not finite (a skipped fp16 step)."""
    if not (math.isfinite(g2_small) and math.isfinite(g2_big)) or b_big <= b_small:
        return None
    g2, trace = estimates(g2_small, b_small, g2_big, b_big)
    return {"step": step, "epoch": epoch, "loss": loss, "batch_small": b_small,
            "batch_big": b_big, "g2_small": g2_small, "g2_big": g2_big, "g2_est": g2,
            "trace_est": trace, "b_simple": trace / g2 if g2 != 0 else math.nan}


def split_batch(batch):
    """Two halves of a :class:`~lartpc.data.batch.Batch` (the first has the floor)."""
    from dataclasses import replace

    n = batch.data_size
    h = n // 2
    out = []
    for lo, hi in ((0, h), (h, n)):
        kw = {"labels": batch.labels[lo:hi]}
        if batch.dense is not None:
            kw.update(dense=batch.dense[lo:hi], dense_reused=False)  # (a view at an offset)
        if batch.coords is not None:
            keep = (batch.coords[:, 0] >= lo) & (batch.coords[:, 0] < hi)
            coords = batch.coords[keep].clone()
            coords[:, 0] -= lo
            kw.update(coords=coords, features=batch.features[keep])
        if len(batch.event_ids):
            kw["event_ids"] = batch.event_ids[lo:hi]
        kw["truth"] = {k: v[lo:hi] for k, v in batch.truth.items()}
        out.append(replace(batch, **kw))
    return out


def append_row(path: Path, row: dict) -> None:
    """Append one line (header first on a new file) in a single write; a symlink at
    ``path`` is refused, never written through (:class:`UnsafePathError`)."""
    new = not os.path.lexists(path)
    line = ",".join(repr(float(row[c])) if isinstance(row[c], float) else str(row[c])
                    for c in NOISE_COLUMNS) + "\n"
    text = (",".join(NOISE_COLUMNS) + "\n" if new else "") + line
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _row_step(line: str) -> int | None:
    """The step of a complete noise.csv row, or None for a torn or unreadable one."""
    if not line.endswith("\n"):
        return None
    try:
        return int(line.split(",", 1)[0])
    except ValueError:
        return None


def keep_rows_before(path: Path, step: int) -> None:
    """Cut ``noise.csv`` back to its rows before ``step`` (remove it when ``step`` is 0).

    It is a measurement log, not training state: a row that cannot be read (torn by a
    kill, or edited) is dropped with a warning rather than making the run un-resumable.
    A symlink at ``path`` (dangling or not) is refused before anything is read or
    removed (:class:`UnsafePathError`).
    """
    refuse_symlink(path, "the noise-scale log")
    if not path.exists():
        return
    if step <= 0:
        path.unlink()
        return
    lines = read_nofollow(path).decode("utf-8", errors="replace").splitlines(keepends=True)
    steps = [_row_step(ln) for ln in lines[1:]]
    bad = sum(s is None for s in steps)
    if bad:
        log.warning("%s: dropped %d unreadable row(s) on resume", path, bad)
    kept = [ln for ln, s in zip(lines[1:], steps, strict=True) if s is not None and s < step]
    atomic_write(path, lines[0] + "".join(kept))
