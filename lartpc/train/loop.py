"""The training loop: the paper's protocol, one process per rank.

:func:`fit` runs epochs of :func:`train_one_epoch` and evaluation until the epochs or
the time limit run out; the parts it drives come from :mod:`lartpc.train.parts`.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lartpc.dist import unwrap_model
from lartpc.train import checkpoint, runlog
from lartpc.train.durable import RunFolderError
from lartpc.train.evaluate import evaluate
from lartpc.train.noise import NoiseMeter
from lartpc.train.optim import lr_at, set_lr
from lartpc.train.parts import Parts

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where the run stands; what a checkpoint restores."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    train_time_s: float = 0.0
    eval_rows: list[dict] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    last_ckpt_time: float = field(default_factory=time.time)
    ckpt_s: float = 1.0
    eval_s: float = 0.0
    #: why the loop stops early: None, "time_limit", "preempted" (signal) or "diverged"
    stop: str | None = None
    saved_step: int = -1
    last_loss: float = 0.0  #: global step of the last checkpoint this segment wrote


def _time_left(p: Parts, prog: Progress) -> bool:
    """True while another step, an evaluation and a checkpoint still fit the limit."""
    step = statistics.median(prog.step_times[-20:]) if prog.step_times else 0.0
    eval_s = prog.eval_s or 0.5 * step * max(1, len(p.plan.eval_indices(0)) / p.plan.batch_size)
    reserve = 1.5 * (2 * step + eval_s + prog.ckpt_s) + 2.0
    return time.time() - p.process_start + reserve < p.cfg.train.time_limit_s


def _agree_ok(p: Parts, error: RunFolderError | None, what: str) -> None:
    """Raise on every rank when any rank failed to write (none waits for it forever)."""
    failed = p.world.allreduce_sum(torch.tensor([0.0 if error is None else 1.0]))
    if float(failed[0]) > 0:
        raise error or RunFolderError(f"{p.run}: another rank could not write {what}")


def _save(p: Parts, prog: Progress, steplog: runlog.StepLog) -> None:
    """Flush every rank's log, agree, then rank 0 writes the checkpoint."""
    error = None
    try:
        steplog.flush()
        p.tb.flush()
    except RunFolderError as e:
        error = e
    _agree_ok(p, error, "its step log")  # all logs are on disk before the checkpoint
    if p.world.is_root:
        t0 = time.time()
        try:
            checkpoint.save(p.run, model=unwrap_model(p.model), opt=p.opt, epoch=prog.epoch,
                            step_in_epoch=prog.step_in_epoch, global_step=prog.global_step,
                            world_size=p.world.size, config=p.cfg.to_dict(),
                            eval_rows=prog.eval_rows, train_time_s=prog.train_time_s,
                            scaler=p.scaler, store=p.store_id)
        except RunFolderError as e:
            error = e
        prog.ckpt_s = time.time() - t0
    _agree_ok(p, error, "checkpoint.pt")
    prog.last_ckpt_time = time.time()
    prog.saved_step = prog.global_step


def _stop_reason(p: Parts, g: torch.Tensor) -> str | None:
    """The all-ranks verdict of one step's vote (``g`` is the same on every rank)."""
    if not math.isfinite(float(g[0])):
        return "diverged"
    if g[3] > 0:
        return "preempted"
    if g[2] > 0:
        return "time_limit"
    return None


def train_one_epoch(p: Parts, prog: Progress, steplog: runlog.StepLog,
                    noise: NoiseMeter | None = None) -> bool:
    """Run the rest of epoch ``prog.epoch``; False when a stop cut it short
    (``prog.stop`` is also set when the stop came on its last step)."""
    tc, world = p.cfg.train, p.world
    noise = noise or NoiseMeter("off", 1, world, p.model, None)
    p.train_loader.set_epoch(prog.epoch)
    p.model.train()
    t_prev = time.perf_counter()
    for batch in p.train_loader.iterate(start=prog.step_in_epoch):  # resumes mid-epoch
        t_data = time.perf_counter()
        set_lr(p.opt, lr_at(tc, world.size, prog.global_step, p.plan.steps_per_epoch))
        p.opt.zero_grad()  # Horovod's wrapper takes no arguments
        logits, loss = noise.forward_backward(p.model, p.loss_fn, batch, p.autocast,
                                              prog.global_step)
        comm_s = world.step_optimizer(p.opt, p.scaler)
        local_loss = float(loss.detach())
        local_acc = float((logits.detach().argmax(1) == batch.labels).float().mean())
        t_metric = time.perf_counter()
        time_vote = 0.0 if _time_left(p, prog) else 1.0
        signal_vote = 1.0 if p.stops is not None and p.stops.requested else 0.0
        g = world.allreduce_mean(torch.tensor([local_loss, local_acc, time_vote, signal_vote],
                                              dtype=torch.float64))
        noise_row = noise.record(prog.global_step, prog.epoch, float(g[0]))  # in comm_s
        t_end = time.perf_counter()
        comm_s += t_end - t_metric
        compute_s = (t_end - t_data) - comm_s
        steplog.log(time=time.time(), epoch=prog.epoch, rank=world.rank,
                    batchno=prog.step_in_epoch, data_size=batch.batch_size,
                    local_loss=local_loss, global_loss=float(g[0]), local_acc=local_acc,
                    global_acc=float(g[1]), data_s=t_data - t_prev, compute_s=compute_s,
                    comm_s=comm_s)
        p.tb.step(prog.global_step, loss=float(g[0]), acc=float(g[1]),
                  lr=p.opt.param_groups[0]["lr"], images=batch.batch_size * world.size,
                  step_s=t_end - t_prev, data_s=t_data - t_prev)
        if noise_row is not None:
            p.tb.scalars(prog.global_step, {f"noise/{k}": noise_row[k]
                                            for k in ("g2_est", "trace_est", "b_simple")})
        prog.step_times.append(t_end - t_prev)
        prog.train_time_s += t_end - t_prev
        prog.step_in_epoch += 1
        prog.global_step += 1
        p.progress.on_step(prog.global_step, loss=float(g[0]), acc=float(g[1]),
                           images=batch.batch_size * world.size, data_s=t_data - t_prev,
                           compute_s=compute_s, comm_s=comm_s)
        t_prev = time.perf_counter()
        prog.stop, prog.last_loss = _stop_reason(p, g), float(g[0])
        if prog.stop:  # any rank out of time, signalled, or a non-finite loss: all stop
            return prog.step_in_epoch >= p.plan.steps_per_epoch
        if _checkpoint_due(p, prog):
            _save(p, prog, steplog)
    return True


def _checkpoint_due(p: Parts, prog: Progress) -> bool:
    """Every ``checkpoint_every_steps`` steps, else every ``checkpoint_every_s`` seconds."""
    every = p.cfg.train.checkpoint_every_steps
    if every:
        return prog.global_step % every == 0
    return time.time() - prog.last_ckpt_time > p.cfg.train.checkpoint_every_s


def _evaluate(p: Parts, prog: Progress) -> np.ndarray:
    t0 = time.time()
    res = evaluate(p.model, p.eval_loader, p.world, p.loss_fn, p.autocast)
    prog.eval_s = time.time() - t0
    p.progress.on_eval(prog.eval_s)
    row = {"epoch": prog.epoch, "time": time.time(), **res.row()}
    prog.eval_rows = [r for r in prog.eval_rows if r["epoch"] != prog.epoch] + [row]
    if p.world.is_root:
        runlog.write_eval(p.run, prog.eval_rows)
        runlog.write_confusion(p.run, res.confusion)
        p.tb.evaluation(prog.global_step - 1, row)  # at the last step it evaluated
        log.info("eval epoch %d: loss %.4f accuracy %.3f on %d events", prog.epoch,
                 row["loss"], row["accuracy"], row["n_events"])
    return res.confusion


def fit(p: Parts, resume: dict | None) -> tuple[str, float]:
    """Train until ``epochs`` are done or the time limit.

    Returns the run status and the final parameter divergence between ranks (0.0
    when the distributed optimizer kept every rank identical, as it must).
    """
    prog = Progress()
    if resume is not None:
        checkpoint.restore_rng(resume)
        prog = Progress(epoch=resume["epoch"], step_in_epoch=resume["step_in_epoch"],
                        global_step=resume["global_step"], train_time_s=resume["train_time_s"],
                        eval_rows=resume["eval_rows"], saved_step=resume["global_step"])
        log.info("resuming at epoch %d step %d (global step %d)", prog.epoch,
                 prog.step_in_epoch, prog.global_step)
    steplog = runlog.StepLog(p.run, p.world.rank, keep_steps=prog.global_step,
                             flush_every=p.cfg.train.log_flush_steps)
    evaluated = False
    noise = NoiseMeter(p.cfg.train.noise_scale, p.cfg.train.noise_every_steps, p.world,
                       p.model, p.run, p.scaler, start_step=prog.global_step)
    try:
        while prog.epoch < p.cfg.train.epochs:
            if prog.step_in_epoch >= p.plan.steps_per_epoch:  # resumed at an epoch's end
                prog.epoch, prog.step_in_epoch = prog.epoch + 1, 0
                continue
            finished = train_one_epoch(p, prog, steplog, noise)
            evaluated = False
            if not finished or prog.stop == "diverged":
                break
            if (prog.epoch + 1) % p.cfg.train.eval_every_epochs == 0 \
                    or prog.epoch + 1 == p.cfg.train.epochs:
                _evaluate(p, prog)
                evaluated = True
            prog.epoch, prog.step_in_epoch = prog.epoch + 1, 0
            _save(p, prog, steplog)
            if prog.stop:
                break
    finally:
        p.progress.close()  # a terminal's bar ends before the closing log lines
    status = _finish(p, prog, steplog, evaluated)
    p.tb.close()
    noise.close()  # its gradient hooks go with the segment
    return status, p.world.param_divergence(unwrap_model(p.model))


def _finish(p: Parts, prog: Progress, steplog: runlog.StepLog, evaluated: bool) -> str:
    """End the segment: the run's status, evaluated and saved as that status needs."""
    done = prog.epoch >= p.cfg.train.epochs and prog.stop != "diverged"
    status = "completed" if done else prog.stop or "completed"
    if status == "diverged":
        steplog.flush()  # the non-finite rows stay visible; a resume cuts them off
        kept = f"checkpoint at global step {prog.saved_step} kept" if prog.saved_step >= 0 \
            else "no checkpoint yet"
        log.error("loss is not finite (%s) at epoch %d step %d with train.lr=%g: stopping, "
                  "status diverged (%s)", prog.last_loss, prog.epoch, prog.step_in_epoch - 1,
                  p.cfg.train.lr, kept)
    elif status == "preempted":
        # No evaluation: a scheduler's grace time is short; the next segment evaluates.
        if prog.saved_step != prog.global_step:
            _save(p, prog, steplog)
    else:
        if status == "time_limit":
            log.warning("time limit %.0f s near: stopping at epoch %d step %d",
                        p.cfg.train.time_limit_s, prog.epoch, prog.step_in_epoch)
        # A run stopped early (or between evaluations) still ends evaluated and saved; a
        # run that finished its epochs was both at its last epoch's end.
        if not evaluated and prog.global_step > 0:
            _evaluate(p, prog)
            _save(p, prog, steplog)
    steplog.flush()
    return status
