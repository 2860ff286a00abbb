"""The trainer: model, optimizer, loss scaler, loaders and where the run stands.

:meth:`Trainer.build` puts the parts together in the order distributed training needs:
shard the data, build the model, wrap the optimizer for the backend, load a resumed
run's state, broadcast rank 0's parameters and optimizer state, wrap the model in
DistributedDataParallel (torch backend), compile, build the loaders. Wrapping comes
before loading because ``hvd.DistributedOptimizer`` builds a new optimizer from the
param groups: state loaded into the inner one would be dropped (a resumed Horovod run
restarted Adam from step 0).

:meth:`Trainer.step` runs one optimizer step and the ranks' stop vote;
:meth:`Trainer.state_dict` is what a checkpoint holds. A step's loss and accuracy
reach the host one step later (:mod:`lartpc.train.readback`), so no step waits for the
device (the torch backend's gradient exchange on CUDA is timed by events in the stream,
:mod:`lartpc.dist.spans`, read with the step's numbers); the vote of step k carries step
k-1's numbers and step k's own stop, save and time wishes.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch

from lartpc import CLASSES
from lartpc.data.augment import mirror
from lartpc.dist import unwrap_model
from lartpc.dist.spans import DeviceSpan
from lartpc.runfolder.schema import CHECKPOINT, RunFolderError
from lartpc.train import checkpoint, graphed
from lartpc.train.evaluate import evaluate
from lartpc.train.noise import NoiseMeter
from lartpc.train.optim import build_optimizer, keep_impl, lr_at, set_lr
from lartpc.train.parts import autocast_and_scaler, loader_mode, make_loader, model_options
from lartpc.train.readback import Unread, step_values
from lartpc.train.segments import Segment
from lartpc.train.signals import StopRequests
from lartpc.train.sinks import EvalRecord, StepRecord
from lartpc.train.state import StepVote, Timing, TrainState, judged

log = logging.getLogger(__name__)


def _check_optimizer_shapes(opt: torch.optim.Optimizer) -> None:
    """Raise ValueError when a loaded per-parameter buffer (Adam's moments, SGD's
    momentum) has another shape than its parameter: ``load_state_dict`` checks only
    the number of parameters, and the first step would fail."""
    for group in opt.param_groups:
        for p in group["params"]:
            for name, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.dim() and v.shape != p.shape:
                    raise ValueError(f"optimizer state {name} has shape {tuple(v.shape)}, "
                                     f"its parameter {tuple(p.shape)}")


def _gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters' gradients, zeros set where a step gave one none (on several
    ranks every rank sends one of each)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]


def _records(steps: list[Unread], done: list[tuple]) -> list[StepRecord]:
    return [StepRecord(**u.settled(), local_loss=ll, local_acc=la, global_loss=gl,
                       global_acc=ga) for u, (ll, la, gl, ga) in zip(steps, done, strict=True)]


class Trainer:
    """Everything one rank trains with; built by :meth:`build`."""

    def __init__(self, seg: Segment, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 stops: StopRequests | None = None):
        from lartpc.models.losses import build_loss

        cfg = seg.cfg
        self.segment = seg
        self.cfg, self.world, self.run, self.plan = cfg, seg.world, Path(seg.run), seg.plan
        self.model, self.opt, self.process_start = model, opt, seg.process_start
        self.loss_fn = build_loss(cfg.model.loss)
        self.autocast, self.scaler = autocast_and_scaler(cfg, seg.world.device.type)
        self.state, self.timing = TrainState(), Timing()
        self.train_loader = self.eval_loader = None
        self.noise: NoiseMeter | None = None
        self.stops = stops  #: the signals the stop vote reads (None: none)
        self.store_id = seg.store_id  #: segments.store_identity, saved in checkpoints
        self.classes: tuple[str, ...] = CLASSES  #: the store's classes (Trainer.build)
        self.stop: str | None = None  #: the agreed reason to stop, after a step
        self.save_due = False  #: every rank agreed to checkpoint after this step
        self.budget_spent = False  #: every rank agreed the study budget is spent
        self.last_loss = 0.0  #: the agreed loss the last vote judged, and its step:
        self.last_loss_at = (0, -1)  #: (epoch, step in epoch)
        self.saved_step = -1  #: global step of the last checkpoint (written or loaded)
        self._unread: Unread | None = None  #: the last step, its numbers not read yet
        #: train.cuda_graph: the captured step and the sizes its loader pads to
        self.graphed: graphed.StaticStep | None = None

    @classmethod
    def build(cls, seg: Segment, *, stops: StopRequests | None = None) -> Trainer:
        """The trainer of this rank for ``seg`` (its plan: ``plan_run`` for this world's
        size; its checkpoint, if any, loaded); ``stops`` as :class:`Trainer` keeps them."""
        from lartpc.models import build

        cfg, store, plan, world, resume = seg.cfg, seg.store, seg.plan, seg.world, seg.resume
        tc = cfg.train
        torch.manual_seed(tc.seed)
        if world.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shapes: autotune once
        model = build(cfg.model.name, image_size=store.geometry.shape,
                      num_classes=len(store.classes),
                      **model_options(cfg, world.device.type)).to(world.device)
        mode = loader_mode(cfg, model)
        opt = world.distributed_optimizer(build_optimizer(tc, model), model,
                                          tc.grad_compression)
        t = cls(seg, model, opt, stops)
        t.classes = store.classes
        if resume is not None:
            t.load_state_dict(resume)
            keep_impl(opt, tc)
        elif tc.init_from:
            t.init_weights(tc.init_from)
        world.broadcast_parameters(model)  # every rank starts from rank 0's state
        world.broadcast_optimizer_state(opt)
        # DDP around the plain model (checkpoints hold that one: no `module.` keys),
        # compiled afterwards so that compile splits its graph at DDP's buckets
        dense = model.input_kind == "dense"  # before a DDP wrapper hides the attribute
        t.model = world.distributed_model(model, tc.grad_compression)
        if tc.compile and dense:
            t.model = torch.compile(t.model)
        t.graphed = graphed.from_config(cfg, world, model, t.loss_fn, resume)
        t.noise = NoiseMeter(tc.noise_scale, tc.noise_every_steps, world, t.model, t.run,
                             t.scaler, start_step=t.state.global_step)
        t0 = time.time()
        t.train_loader = make_loader(cfg, store, mode, plan.train_indices(world.rank),
                                     world.device, train=True, steps=plan.steps_per_epoch,
                                     model=model,
                                     capacities=None if t.graphed is None else t.graphed.caps)
        t.eval_loader = make_loader(cfg, store, mode, plan.eval_indices(world.rank),
                                    world.device, train=False, model=model)
        log.info("data ready in %.1f s: %d train / %d eval events on this rank, %d "
                 "steps/epoch, %s loader", time.time() - t0, len(plan.train_indices(world.rank)),
                 len(plan.eval_indices(world.rank)), plan.steps_per_epoch, mode)
        if resume is not None:
            checkpoint.restore_rng(resume)  # last: building drew from the RNGs
        return t

    def state_dict(self) -> dict:
        """What ``checkpoint.pt`` holds (tensors and plain containers only)."""
        return {"model": unwrap_model(self.model).state_dict(),
                "optimizer": self.opt.state_dict(), **self.state.state_dict(),
                "world_size": self.world.size, "config": self.cfg.to_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "store": self.store_id, "rng": checkpoint.rng_state(),
                # train.cuda_graph's padded sizes: a resumed run pads its steps alike
                "padded_sizes": self._padded_sizes()}

    def _padded_sizes(self) -> list[int] | None:
        """``train.cuda_graph`` with SCNet: the sizes its tables are padded to (None:
        no option, JishNet's step, or none yet)."""
        caps = None if self.graphed is None else self.graphed.caps
        return None if caps is None or caps.rows is None else list(caps.rows)

    def load_state_dict(self, state: dict) -> None:
        """Weights, optimizer, loss scale and counters of a checkpoint (not the RNGs).

        Raises
        ------
        RunFolderError
            When they do not fit this model, optimizer or plan (a crafted or damaged
            checkpoint: :func:`checkpoint.read` checked only their types).
        """
        path = self.run / CHECKPOINT
        if state["step_in_epoch"] > self.plan.steps_per_epoch:
            raise RunFolderError(f"{path}: field step_in_epoch = {state['step_in_epoch']} is "
                                 f"past an epoch's {self.plan.steps_per_epoch} steps; "
                                 f"{checkpoint.MOVE_AWAY}")
        try:
            unwrap_model(self.model).load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            _check_optimizer_shapes(self.opt)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            # load_state_dict lists the mismatches on the lines after its first
            why = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
            why = why if len(why) <= 200 else why[:197] + "..."
            raise RunFolderError(f"{path}: does not fit this {self.cfg.model.name} and its "
                                 f"optimizer ({why or type(e).__name__}); "
                                 f"{checkpoint.MOVE_AWAY}") from None
        self.state = TrainState.from_checkpoint(state)
        self.saved_step = self.state.global_step
        log.info("resuming at epoch %d step %d (global step %d)", self.state.epoch,
                 self.state.step_in_epoch, self.state.global_step)

    def init_weights(self, source: str) -> None:
        """Model weights of another run's checkpoint (``train.init_from``), nothing else."""
        head_fresh = checkpoint.load_init_weights(unwrap_model(self.model), source,
                                                  self.cfg.model.name, self.cfg.model.head)
        log.info("model weights from %s (train.init_from%s); optimizer and counters fresh",
                 source, f", trunk only: its head is not model.head={self.cfg.model.head}"
                 if head_fresh else "")

    def batches(self):
        """The rest of this epoch's batches, each with the seconds spent waiting for it
        (the time the caller spends between steps is not counted)."""
        self.train_loader.set_epoch(self.state.epoch)
        self.model.train()
        t_prev = time.perf_counter()
        mirrored = self.cfg.data.augment == "mirror"
        for batch in self.train_loader.iterate(start=self.state.step_in_epoch):
            if mirrored:
                batch = mirror(batch, self.cfg.train.seed, self.state.epoch)
            yield batch, time.perf_counter() - t_prev
            t_prev = time.perf_counter()

    def step(self, batch, data_s: float, save_wanted: bool = False) -> list[StepRecord]:
        """One optimizer step and the vote: ``self.stop`` says whether all stop,
        ``self.save_due`` whether all checkpoint now (``save_wanted`` is this rank's wish).

        Returns the records whose numbers came back: the previous step's, and this
        step's own at an epoch's last step, on a noise-scale step, before an evaluation
        by images or steps and whenever the vote stops or saves, so every step is
        recorded before anything acts on it. Every
        rank takes the same path (each branch holds collectives).
        """
        s, tc, world = self.state, self.cfg.train, self.world
        t0 = time.perf_counter()
        set_lr(self.opt, lr_at(tc, world.size, s.global_step, self.plan.steps_per_epoch))
        # train.cuda_graph: every step but a noise-scale one (the same steps on every
        # rank) goes without DDP's hooks, which a replay does not run, and is averaged
        # after its backward; a step the graph leaves (a rank's short last batch) too,
        # so that every rank makes the same exchange whichever way it stepped
        own = self.graphed is not None and not self.noise.due(s.global_step)
        static = self.graphed(batch) if own else None
        if static is not None:  # the gradients are the graph's buffers
            values = self.graphed.values  # (loss, accuracy), computed in the graph
        else:
            if self.graphed is not None:
                batch = self.graphed.settled(batch)
            self.opt.zero_grad()  # Horovod's wrapper takes no arguments
            model = unwrap_model(self.model) if own else self.model
            logits, loss = self.noise.forward_backward(model, self.loss_fn, batch,
                                                       self.autocast, s.global_step)
            values = step_values(loss, logits, batch.labels)
        exchanged = world.average_gradients(_gradients(self.graphed.params),
                                            tc.grad_compression) \
            if own and world.size > 1 else 0.0
        exchange = [exchanged, world.step_optimizer(self.opt, self.scaler)]
        # the host's seconds now; a GPU's exchange time once the step is read back
        spans = [t for t in exchange if isinstance(t, DeviceSpan)]
        comm_s = sum(float(t) for t in exchange if not isinstance(t, DeviceSpan))
        # all ranks' images (their short last batches may differ in size)
        images = self.plan.images_seen(s.global_step + 1) - self.plan.images_seen(s.global_step)
        this = Unread(values, {
            "global_step": s.global_step, "epoch": s.epoch, "batchno": s.step_in_epoch,
            "rank": world.rank, "data_size": batch.data_size, "images": images,
            "lr": self.opt.param_groups[0]["lr"], "data_s": data_s},
            spans)
        now = (not tc.overlap_readback or s.step_in_epoch + 1 == self.plan.steps_per_epoch
               or self.noise.due(s.global_step) or self.count_due(s.global_step + 1))
        ready = [u for u in (self._unread, this if now else None) if u is not None]
        self._unread = None if now else this
        local = [u.read() for u in ready]  # a wait for the device counts as compute
        t_vote, waited = time.perf_counter(), 0.0
        signalled = bool(self.stops is not None and self.stops.requested)
        # rank 0's clock alone: its training time is the one its checkpoint holds
        spent = world.is_root and not self.budget_left(data_s + time.perf_counter() - t0)
        done, flags = self._agree(local, [float(not self.time_left()), float(signalled),
                                          float(save_wanted), float(spent)])
        vote = StepVote(self._judged_loss(done), *flags)
        if (vote.stop or vote.save > 0) and self._unread is not None:
            t_read = time.perf_counter()
            pair = this.read()  # this step too, before anything acts
            waited = time.perf_counter() - t_read
            late, _ = self._agree([pair], [])
            self._unread, done, ready = None, done + late, [*ready, this]
            vote = StepVote(self._judged_loss(done), *flags)
        # a collective on measured steps, which read this step above
        noise = self.noise.record(s.global_step, s.epoch, done[-1][2] if done else math.nan)
        t_end = time.perf_counter()
        comm_s += t_end - t_vote - waited
        this.fields.update(compute_s=(t_end - t0) - comm_s, comm_s=comm_s, time=time.time(),
                           noise=noise)
        step_s = data_s + (t_end - t0)
        self.timing.step_times.append(step_s)
        s.train_time_s += step_s
        s.step_in_epoch += 1
        s.global_step += 1
        self.stop, self.save_due = vote.stop, vote.save > 0
        self.budget_spent = self.budget_spent or vote.over_budget > 0
        k = judged(done)
        if k is not None:
            f = ready[k].fields
            self.last_loss, self.last_loss_at = done[k][2], (f["epoch"], f["batchno"])
        return _records(ready, done)

    def _judged_loss(self, done: list[tuple]) -> float:
        """The agreed loss the stop vote judges (:func:`~lartpc.train.state.judged`);
        the previous vote's when no step was read."""
        k = judged(done)
        return self.last_loss if k is None else done[k][2]

    def read_back(self) -> list[StepRecord]:
        """The record of the last step if its numbers have not come back yet (the loop
        never leaves one behind; a caller stepping the trainer by hand may). A
        collective: every rank calls it at the same point."""
        if self._unread is None:
            return []
        steps, self._unread = [self._unread], None
        return _records(steps, self._agree([u.read() for u in steps], [])[0])

    def _agree(self, local: list[tuple[float, float]], flags: list[float]
               ) -> tuple[list[tuple], list]:
        """Steps' (local loss, local accuracy) and ``flags`` averaged over the ranks in
        one allreduce: ([(local loss, local acc, loss, acc)] per step, flags). One rank's
        mean is its own values (no tensor made: the step's thread stays lean)."""
        values = [float(v) for pair in local for v in pair] + [float(f) for f in flags]
        g = values if self.world.size == 1 else self.world.allreduce_mean(
            torch.tensor(values, dtype=torch.float64)).tolist()
        n = 2 * len(local)
        return [(*pair, g[2 * i], g[2 * i + 1]) for i, pair in enumerate(local)], g[n:]

    def time_left(self) -> bool:
        """True while another step, an evaluation and a checkpoint still fit the limit,
        each taken at its slowest recent duration (two steps: the one being voted on
        may be the slowest yet), with half as much again and 2 s for closing the
        segment."""
        times = self.timing.step_times
        step = max(times) if times else 0.0
        eval_s = self.timing.eval_s or 0.5 * step * max(
            1, len(self.plan.eval_indices(0)) / self.plan.batch_per_rank)
        save_s = self.timing.checkpoint_s or 1.0  # a guess until the first save
        reserve = 1.5 * (2 * step + eval_s + save_s) + 2.0
        return time.time() - self.process_start + reserve < self.cfg.train.time_limit_s

    def budget_left(self, this_step_s: float) -> bool:
        """True while the training time (all segments, with the ``this_step_s`` seconds
        of the step being taken) is short of ``train.budget_s``. The run stops after the
        first step that reaches the budget, passing it by less than a step, so that a
        stopped run's checkpoint holds ``train_time_s >= budget_s``: the test a rerun
        makes (:func:`~lartpc.train.segments.budget_spent`)."""
        return self.state.train_time_s + this_step_s < self.cfg.train.budget_s

    def evaluate(self) -> EvalRecord:
        """Evaluate on the held-out events; the row joins the state's eval rows."""
        t0 = time.time()
        res = evaluate(self.model, self.eval_loader, self.world, self.loss_fn, self.autocast,
                       self.classes)
        took = time.time() - t0
        self.timing.evaluated(took)
        s = self.state
        s.eval_time_s += took
        row = {"epoch": s.epoch, "time": time.time(), **res.row(), "step": s.global_step,
               "images": self.plan.images_seen(s.global_step)}
        # by epochs one row per epoch (an early stop's row gives way to the epoch end's);
        # by images or steps one per global step
        same = "step" if self.by_count else "epoch"
        s.eval_rows = [r for r in s.eval_rows if r.get(same) != row[same]] + [row]
        return EvalRecord(global_step=s.global_step - 1, row=row, rows=s.eval_rows,
                          confusion=res.confusion, seconds=took,
                          classes=res.classes)

    @property
    def by_count(self) -> bool:
        """Evaluations every ``train.eval_every_images`` or ``eval_every_steps``, not by
        epochs."""
        return bool(self.cfg.train.eval_every_images or self.cfg.train.eval_every_steps)

    def evaluated_now(self) -> bool:
        """Is there an evaluation at the current global step already?"""
        return any(r.get("step") == self.state.global_step for r in self.state.eval_rows)

    def eval_due(self) -> bool:
        """At the end of this epoch (its last step done)? By images or steps: only at
        the end of the last epoch, unless the cadence evaluated that step already."""
        done, tc = self.state.epoch + 1, self.cfg.train
        if self.by_count:
            return done == tc.epochs and not self.evaluated_now()
        return done % tc.eval_every_epochs == 0 or done == tc.epochs

    def count_due(self, after: int | None = None) -> bool:
        """Has the step just done (global step ``global_step - 1``; ``after - 1`` when
        given) reached the next multiple of ``train.eval_every_images`` images or
        ``eval_every_steps`` steps?"""
        g, tc = self.state.global_step if after is None else after, self.cfg.train
        if g == 0:
            return False
        if tc.eval_every_steps:
            return g % tc.eval_every_steps == 0
        if tc.eval_every_images:
            every, seen = tc.eval_every_images, self.plan.images_seen
            return seen(g) // every > seen(g - 1) // every
        return False

    def close(self) -> float:
        """End the segment: the gradient hooks go; the largest parameter difference
        between ranks (0.0, as the distributed optimizer must keep them identical)."""
        if self.noise is not None:
            self.noise.close()
        for loader in (self.train_loader, self.eval_loader):
            if loader is not None:
                loader.close()  # its processes, where it has them
        divergence = self.world.param_divergence(unwrap_model(self.model))
        # DDP's reducer (held by the model and the parameters' hooks) goes before the
        # process group
        self.model = self.opt = self.noise = self.train_loader = self.eval_loader = None
        return divergence
