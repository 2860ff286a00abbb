"""What a training prints while it runs: one progress line from rank 0.

Every ``train.progress_every_s`` seconds and at every epoch end, rank 0 logs one line
(INFO, logger ``lartpc.train.progress``) such as::

    step 137/500  epoch 1.37/5  loss 1.2345  acc 0.412  89.3 images/s  step 0.157 s =
    data 0.012 (8%) + compute 0.131 + comm 0.014  time left 3:58:12  finish in 0:01:00

(one line in the log). Loss and accuracy are the global ones averaged over the last
:data:`WINDOW` steps; images/s counts every rank's events (world size x minibatch per
step time); the step time is split as the rank CSVs split it; "time left" is this
segment's ``train.time_limit_s`` minus the time since its process started (the loop
stops a little earlier, to evaluate and checkpoint in time); "finish in" is the time the
configured epochs still need (steps at the recent step time, plus evaluations at the last
one's duration). When stderr is a terminal a tqdm bar also shows the steps; in job logs
(stderr a file) there is no bar. Other ranks get :class:`NoProgress`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import deque
from contextlib import ExitStack

log = logging.getLogger(__name__)
WINDOW = 20  #: steps averaged for loss, accuracy, images/s and the step time split


def duration(s: float) -> str:
    """``H:MM:SS`` of ``s`` seconds (``-`` for a negative or infinite time)."""
    if not math.isfinite(s) or s < 0:
        return "-"
    m, sec = divmod(int(round(s)), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}"


class NoProgress:
    """The progress sink of ranks other than 0: prints nothing."""

    def on_step(self, step: int, **values: float) -> None:
        pass

    def on_eval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


class ConsoleProgress:
    """Rank 0's progress lines (and, on a terminal, a bar).

    Parameters
    ----------
    every_s : float
        Seconds between lines; 0 prints only at epoch ends.
    steps_per_epoch, epochs : int
        The run's plan: ``steps_per_epoch * epochs`` steps in all.
    time_limit_s : float
        This segment's limit, counted from ``process_start`` (may be ``inf``).
    process_start : float
        ``time.time()`` when this segment's process started.
    start_step : int
        Global steps already done (a resumed run).
    eval_every_epochs : int
        Evaluation interval, for the time the remaining evaluations take.
    eval_every_images, eval_every_steps : int
        The cadence by images or steps instead, when one is not 0.
    bar : bool | None
        Show a tqdm bar; None: when stderr is a terminal.
    clock : callable
        Wall clock (tests give a fake one).
    """

    def __init__(self, *, every_s: float, steps_per_epoch: int, epochs: int,
                 time_limit_s: float, process_start: float, start_step: int = 0,
                 eval_every_epochs: int = 1, eval_every_images: int = 0,
                 eval_every_steps: int = 0, bar: bool | None = None, clock=time.time):
        self.every_s, self.spe, self.epochs = every_s, steps_per_epoch, epochs
        self.time_limit_s, self.process_start = time_limit_s, process_start
        self.start_step, self.eval_every = start_step, eval_every_epochs
        self.every_images, self.every_steps = eval_every_images, eval_every_steps
        self.clock = clock
        self.window: deque[tuple[float, ...]] = deque(maxlen=WINDOW)
        self.eval_s: float | None = None
        self.last_line = clock()
        self.step = start_step
        self.want_bar = sys.stderr.isatty() if bar is None else bar
        self.bar = None
        self._stack = ExitStack()

    def on_step(self, step: int, *, loss: float, acc: float, images: int, data_s: float,
                compute_s: float, comm_s: float) -> None:
        """One finished step; ``step`` counts the global steps done, this one included.

        ``images`` are the events of this step over all ranks; the times are rank 0's
        (the same split as its CSV row).
        """
        self.step = step
        self.window.append((loss, acc, images, data_s, compute_s, comm_s))
        if self.want_bar:
            self._update_bar()
        now = self.clock()
        epoch_end = step % self.spe == 0
        if epoch_end or (self.every_s > 0 and now - self.last_line >= self.every_s):
            self.last_line = now
            log.info("%s", self.line(now))

    def on_eval(self, seconds: float) -> None:
        """An evaluation took ``seconds`` (counted into "finish in" for those left)."""
        self.eval_s = seconds

    def stats(self, now: float) -> dict[str, float]:
        """The numbers of the line: smoothed over the window, at time ``now``."""
        rows = list(self.window)
        n = len(rows)
        data, compute, comm = (sum(r[i] for r in rows) / n for i in (3, 4, 5))
        step_s = data + compute + comm
        total = self.spe * self.epochs
        evals_left = self.evals_left(total - self.step, sum(r[2] for r in rows) / n)
        return {
            "step": self.step, "steps": total, "epoch": self.step / self.spe,
            "loss": sum(r[0] for r in rows) / n, "acc": sum(r[1] for r in rows) / n,
            "images_s": sum(r[2] for r in rows) / max(n * step_s, 1e-12),
            "step_s": step_s, "data_s": data, "compute_s": compute, "comm_s": comm,
            "data_share": data / step_s if step_s > 0 else 0.0,
            "time_left_s": self.time_limit_s - (now - self.process_start),
            "finish_s": (total - self.step) * step_s + evals_left * (self.eval_s or 0.0),
        }

    def evals_left(self, steps_left: int, images_per_step: float) -> int:
        """Evaluations still to come in ``steps_left`` steps (the last one included)."""
        if self.every_steps:
            return steps_left // self.every_steps + 1
        if self.every_images:
            return int(steps_left * images_per_step // self.every_images) + 1
        return sum(1 for e in range(self.step // self.spe, self.epochs)
                   if (e + 1) % self.eval_every == 0 or e + 1 == self.epochs)

    def line(self, now: float) -> str:
        """The progress line at time ``now`` (after at least one step)."""
        s = self.stats(now)
        left = "no limit" if math.isinf(s["time_left_s"]) else duration(s["time_left_s"])
        late = "" if s["finish_s"] <= s["time_left_s"] else " (past this segment's limit)"
        return (f"step {s['step']}/{s['steps']}  epoch {s['epoch']:.2f}/{self.epochs}  "
                f"loss {s['loss']:.4f}  acc {s['acc']:.3f}  {s['images_s']:.1f} images/s  "
                f"step {s['step_s']:.3f} s = data {s['data_s']:.3f} ({s['data_share']:.0%}) "
                f"+ compute {s['compute_s']:.3f} + comm {s['comm_s']:.3f}  "
                f"time left {left}  finish in {duration(s['finish_s'])}{late}")

    def _update_bar(self) -> None:
        if self.bar is None:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # log lines go through tqdm.write, above the bar instead of through it
            self._stack.enter_context(logging_redirect_tqdm(
                [logging.getLogger("lartpc")]))
            self.bar = self._stack.enter_context(tqdm(
                total=self.spe * self.epochs, initial=self.start_step, unit="step",
                desc="train", dynamic_ncols=True, file=sys.stderr))
        self.bar.update(self.step - self.bar.n)
        loss, acc = self.window[-1][:2]
        self.bar.set_postfix_str(f"epoch {self.step / self.spe:.2f}/{self.epochs} "
                                 f"loss {loss:.4f} acc {acc:.3f}", refresh=False)

    def close(self) -> None:
        """Close the bar (if any) and give the log handlers back."""
        self._stack.close()
        self.bar = None


def open_progress(cfg, is_root: bool, steps_per_epoch: int, process_start: float,
                  start_step: int) -> ConsoleProgress | NoProgress:
    """Rank 0's :class:`ConsoleProgress` for ``cfg`` (a :class:`~lartpc.config.Config`);
    :class:`NoProgress` on every other rank."""
    if not is_root:
        return NoProgress()
    tc = cfg.train
    return ConsoleProgress(every_s=tc.progress_every_s, steps_per_epoch=steps_per_epoch,
                           epochs=tc.epochs, time_limit_s=tc.time_limit_s,
                           process_start=process_start, start_step=start_step,
                           eval_every_epochs=tc.eval_every_epochs,
                           eval_every_images=tc.eval_every_images,
                           eval_every_steps=tc.eval_every_steps)
