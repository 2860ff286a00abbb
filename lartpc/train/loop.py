"""The training loop: the paper's protocol, one process per rank.

Epochs of steps, an evaluation at every ``eval_every_epochs`` epoch end (or after the
step that reaches each multiple of ``eval_every_images`` images or ``eval_every_steps``
steps, and at the end), a checkpoint at every epoch end and whenever the checkpointer
says so, until the epochs are done or every rank agrees to stop (time limit, signal,
non-finite loss). The parts it drives:
:class:`~lartpc.train.trainer.Trainer`, :class:`~lartpc.train.checkpoint.Checkpointer`
and the :mod:`sinks <lartpc.train.sinks>`.
"""

from __future__ import annotations

import logging

from lartpc.train.checkpoint import Checkpointer
from lartpc.train.sinks import Sink
from lartpc.train.trainer import Trainer

log = logging.getLogger(__name__)


def fit(t: Trainer, ckpt: Checkpointer, sinks: Sink) -> str:
    """Train this segment; the run's status."""
    s, evaluated = t.state, False
    if t.by_count and t.count_due() and not t.evaluated_now():
        # a stop (preempted) on a step that reached the cadence saved before evaluating:
        # the evaluation an uninterrupted run made there is made up first
        sinks.on_eval(t.evaluate())
        evaluated = True
    while s.epoch < t.cfg.train.epochs:
        # A checkpoint at an epoch's end is a step checkpoint written before that
        # epoch's evaluation (the epoch-end one is saved after next_epoch): a job killed
        # between the two resumes here, and the evaluation is made up below.
        if s.step_in_epoch < t.plan.steps_per_epoch:
            finished = run_epoch(t, ckpt, sinks)
            evaluated = False
            # a signal on the epoch's last step saves first (finish): the epoch-end
            # evaluation could outlast the scheduler's grace time; the resume makes it up
            if not finished or t.stop in ("diverged", "preempted"):
                break
        if t.eval_due():
            sinks.on_eval(t.evaluate())
            evaluated = True
        s.next_epoch()
        ckpt.save(t, sinks)
        if t.stop:
            break
    return finish(t, ckpt, sinks, evaluated)


def run_epoch(t: Trainer, ckpt: Checkpointer, sinks: Sink) -> bool:
    """The rest of the current epoch; False when a stop cut it short (``t.stop`` is
    also set when the stop came on its last step)."""
    for batch, data_s in t.batches():
        # whether to save is voted with the step: the checkpoint holds collectives, and
        # ranks reading their own clocks could otherwise enter them a step apart. The
        # step hands back the records whose numbers came back (mostly the previous one's)
        for rec in t.step(batch, data_s, save_wanted=ckpt.due(t.state.global_step + 1)):
            sinks.on_step(rec)
        if t.stop:  # any rank out of time, signalled, or a non-finite loss: all stop
            return t.state.step_in_epoch >= t.plan.steps_per_epoch
        if t.count_due():  # before a checkpoint of this step, which then holds its row
            sinks.on_eval(t.evaluate())
        if t.save_due:
            ckpt.save(t, sinks)
    return True


def finish(t: Trainer, ckpt: Checkpointer, sinks: Sink, evaluated: bool) -> str:
    """End the segment: the status, evaluated and saved as that status needs."""
    s = t.state
    done = s.epoch >= t.cfg.train.epochs and t.stop != "diverged"
    status = "completed" if done else t.stop or "completed"
    if status == "diverged":
        # the non-finite rows stay visible (flushed below); a resume cuts them off
        kept = f"checkpoint at global step {t.saved_step} kept" if t.saved_step >= 0 \
            else "no checkpoint yet"
        log.error("loss is not finite (%s) at epoch %d step %d with train.lr=%g: stopping, "
                  "status diverged (%s)", t.last_loss, *t.last_loss_at,
                  t.cfg.train.lr, kept)
    elif status == "preempted":
        # No evaluation: a scheduler's grace time is short; the next segment evaluates.
        if t.saved_step != s.global_step:
            ckpt.save(t, sinks)
    else:
        if status == "time_limit" and t.budget_spent:
            log.warning("study budget reached (%.1f s of training, train.budget_s=%g): "
                        "stopping at epoch %d step %d", s.train_time_s,
                        t.cfg.train.budget_s, s.epoch, s.step_in_epoch)
        elif status == "time_limit":
            log.warning("time limit %.0f s near: stopping at epoch %d step %d",
                        t.cfg.train.time_limit_s, s.epoch, s.step_in_epoch)
        # A run stopped early (or between evaluations) still ends evaluated and saved; a
        # run that finished its epochs was both at its last epoch's end.
        if not (evaluated or t.evaluated_now()) and s.global_step > 0:
            sinks.on_eval(t.evaluate())
            ckpt.save(t, sinks)
    sinks.flush()
    return status
