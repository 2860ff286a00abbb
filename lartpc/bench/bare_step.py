"""The bare training step beside ``lartpc bench train``'s loop: forward, backward and
optimizer on the batches the training itself trained on, with no loop around them.

The step is the trainer's own (its parts: :func:`~lartpc.train.parts.model_options`,
:func:`~lartpc.train.optim.build_optimizer`, the noise meter's forward/backward with
the meter off, :meth:`World.step_optimizer <lartpc.dist.World.step_optimizer>`) on the
run's resolved config from run.json. Left out is everything the loop adds around it:
waiting for the loader, reading loss and accuracy back, the stop vote, the sinks, the
time-limit check, evaluations and checkpoints. The batches are the training loader's
first ones (epoch 0 onwards, mirrored when the run mirrored), copied to the device
before the timing starts; each timed step ends with a device synchronisation, as
each of the loop's steps did when it read the loss back. ``loop_overhead`` =
loop step / bare step - 1 is then what the loop costs per step (issue 36).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from lartpc.config import Config
from lartpc.data.batch import Batch

#: Batches are copied off the loader's rotating buffers; beyond this many bytes of
#: them (dense 3600 x 3600 batches are 363 MB each) the copies are reused in turn.
MAX_BATCH_BYTES = 2 * 1024 ** 3


def _copy(batch: Batch, device: torch.device) -> Batch:
    def own(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device).clone()

    # rulebooks built in the loader (data.rulebooks=loader) hold its coordinates, a tensor
    # of the batch's own (never a rotating buffer): kept, so that they still fit
    coords = batch.coords if batch.rulebooks is not None else own(batch.coords)
    return replace(batch, labels=own(batch.labels), dense=own(batch.dense),
                   coords=coords, features=own(batch.features), dense_reused=False)


def _nbytes(batch: Batch) -> int:
    return sum(t.numel() * t.element_size()
               for t in (batch.labels, batch.dense, batch.coords, batch.features)
               if t is not None)


def training_batches(cfg: Config, store, plan, model: torch.nn.Module, device: torch.device,
                     n: int, capacities=None) -> list[Batch]:
    """The first ``n`` batches rank 0's training loader yields (epochs in turn), as
    device copies; fewer distinct copies, reused in turn, past :data:`MAX_BATCH_BYTES`;
    their tables padded to ``capacities`` where given (``train.cuda_graph``)."""
    from lartpc.data.augment import mirror
    from lartpc.train.parts import loader_mode, make_loader

    loader = make_loader(cfg, store, loader_mode(cfg, model), plan.train_indices(0), device,
                         train=True, steps=plan.steps_per_epoch, model=model,
                         capacities=capacities)
    out: list[Batch] = []
    held, epoch = 0, 0
    while len(out) < n and held < MAX_BATCH_BYTES:
        loader.set_epoch(epoch)
        it = loader.iterate()
        try:
            for b in it:
                if cfg.data.augment == "mirror":
                    b = mirror(b, cfg.train.seed, epoch)
                out.append(_copy(b, device))
                held += _nbytes(out[-1])
                if len(out) == n or held >= MAX_BATCH_BYTES:
                    break
        finally:
            it.close()
        epoch += 1
    return [out[k % len(out)] for k in range(n)]


class BareStep:
    """The trainer's step alone: model, optimizer, loss and scaler built as
    :meth:`Trainer.build <lartpc.train.trainer.Trainer.build>` builds them for one rank
    (same seed, so the same initial weights), stepped by :meth:`step`."""

    def __init__(self, cfg: Config, data: Path):
        from lartpc.data.store import EventStore
        from lartpc.dist import World, device_type
        from lartpc.models import build
        from lartpc.models.losses import build_loss
        from lartpc.train.graphed import from_config
        from lartpc.train.noise import NoiseMeter
        from lartpc.train.optim import build_optimizer
        from lartpc.train.parts import autocast_and_scaler, model_options
        from lartpc.train.plan import plan_run

        self.cfg, tc = cfg, cfg.train
        self.device = torch.device(device_type(tc.device))
        self.store = EventStore(data)
        self.plan = plan_run(cfg, self.store, 1)
        torch.manual_seed(tc.seed)
        self.model = build(cfg.model.name, image_size=self.store.geometry.shape,
                           **model_options(cfg, self.device.type)).to(self.device)
        self.opt = build_optimizer(tc, self.model)
        self.world = World(device=self.device)
        dense = self.model.input_kind == "dense"
        self.trained = torch.compile(self.model) if tc.compile and dense else self.model
        self.trained.train()
        self.loss_fn = build_loss(cfg.model.loss)
        self.autocast, self.scaler = autocast_and_scaler(cfg, self.device.type)
        self.noise = NoiseMeter("off", 1, self.world, self.trained, None)
        self.graphed = from_config(cfg, self.world, self.model, self.loss_fn)
        self.caps = None if self.graphed is None else self.graphed.caps

    def batches(self, n: int) -> list[Batch]:
        """The training's first ``n`` batches (:func:`training_batches`)."""
        return training_batches(self.cfg, self.store, self.plan, self.model, self.device, n,
                                self.caps)

    def step(self, batch: Batch, global_step: int) -> None:
        """One optimizer step, as the trainer takes it at ``global_step``."""
        from lartpc.train.optim import lr_at, set_lr

        set_lr(self.opt, lr_at(self.cfg.train, 1, global_step, self.plan.steps_per_epoch))
        if self.graphed is None or self.graphed(batch) is None:
            self.opt.zero_grad()
            self.noise.forward_backward(self.trained, self.loss_fn, batch, self.autocast,
                                        global_step)
        self.world.step_optimizer(self.opt, self.scaler)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure(cfg: Config, data: Path, steps: int = 30, warmup: int = 5,
            threads: int | None = None) -> dict:
    """Median seconds of the bare step over ``steps`` steps after ``warmup``.

    Parameters
    ----------
    cfg : the training's resolved config (run.json's ``config``).
    data : its event folder.
    steps, warmup : timed steps, and untimed ones before them (on the batches that
        came first in the training).
    threads : CPU threads (the training's ``threads_per_rank``); None leaves torch's.

    Returns
    -------
    dict
        ``bare_step_s_median``, ``bare_images_per_s`` (minibatch / median),
        ``bare_steps``, ``bare_warmup``, ``bare_distinct_batches``, ``bare_threads``.
    """
    if threads:
        torch.set_num_threads(threads)
    bare = BareStep(cfg, data)
    batches = bare.batches(warmup + steps)
    times = []
    for k, batch in enumerate(batches):
        bare.sync()
        t0 = time.perf_counter()
        bare.step(batch, k)
        bare.sync()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {"bare_step_s_median": median,
            "bare_images_per_s": cfg.train.batch_per_rank / median,
            "bare_steps": steps, "bare_warmup": warmup,
            "bare_distinct_batches": len({id(b) for b in batches}),
            "bare_threads": torch.get_num_threads()}
