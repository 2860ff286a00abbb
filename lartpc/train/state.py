"""Where a run stands and what its ranks agree on after a step: the counters a
checkpoint restores (:class:`TrainState`), the step's vote (:class:`StepVote`), and
the recent durations the time-limit check reserves (:class:`Timing`). Used by
:class:`~lartpc.train.trainer.Trainer`."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class TrainState:
    """Where the run stands: what a checkpoint restores besides the weights."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    train_time_s: float = 0.0  #: the steps' own time (data, compute, comm), all segments
    eval_time_s: float = 0.0  #: evaluations' time, all segments
    checkpoint_time_s: float = 0.0  #: checkpoints' time (flush, write, agree), all segments
    eval_rows: list[dict] = field(default_factory=list)

    def next_epoch(self) -> None:
        self.epoch, self.step_in_epoch = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step, "train_time_s": self.train_time_s,
                "eval_time_s": self.eval_time_s, "checkpoint_time_s": self.checkpoint_time_s,
                "eval_rows": self.eval_rows}

    @classmethod
    def from_checkpoint(cls, state: dict) -> TrainState:
        # Compatibility reader: checkpoints written before issue 37 have no eval or
        # checkpoint time (their segments' share is unknown and counts as 0).
        return cls(epoch=state["epoch"], step_in_epoch=state["step_in_epoch"],
                   global_step=state["global_step"], train_time_s=state["train_time_s"],
                   eval_time_s=float(state.get("eval_time_s", 0.0)),
                   checkpoint_time_s=float(state.get("checkpoint_time_s", 0.0)),
                   eval_rows=state["eval_rows"])


@dataclass(frozen=True, slots=True)
class StepVote:
    """What every rank agrees on after a step (the flags averaged over the ranks in the
    step's one allreduce, :meth:`Trainer._agree`): a flag above 0 means some rank
    raised it."""

    loss: float  #: the agreed loss judged (:func:`judged`)
    out_of_time: float  #: 1 on a rank whose next step, evaluation and checkpoint won't fit
    signalled: float  #: 1 on a rank that got a stop signal (lartpc.stopsignals)
    #: 1 on a rank whose checkpoint interval has passed. Each rank reads its own clock,
    #: so ranks may disagree by a step; saving when any rank asks keeps every rank in
    #: the checkpoint's collectives together.
    save: float = 0.0
    #: 1 on rank 0 when its training time with this step has reached train.budget_s (its
    #: time is the one the checkpoint holds, which a rerun tests)
    over_budget: float = 0.0

    @property
    def stop(self) -> str | None:
        """Why every rank stops after this step (on an agreed vote), or None."""
        if not math.isfinite(self.loss):
            return "diverged"
        if self.signalled > 0:
            return "preempted"
        if self.out_of_time > 0 or self.over_budget > 0:
            return "time_limit"
        return None


def judged(done: list[tuple]) -> int | None:
    """Which of the steps just read the stop vote judges: the first whose agreed loss
    is not finite, else the last; None when none was read."""
    if not done:
        return None
    return next((i for i, d in enumerate(done) if not math.isfinite(d[2])), len(done) - 1)


#: how many of the last steps the time-limit check looks at
RECENT_STEPS = 20


@dataclass
class Timing:
    """Recent durations the time-limit check needs: the slowest of each, as a loaded
    host (a busy node, a file system that stalls) slows one step or save now and then,
    and the limit is a hard one."""

    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    eval_s: float = 0.0  #: the slowest evaluation so far (0: none yet)
    checkpoint_s: float = 0.0  #: the slowest save of this segment (0: none yet)

    def evaluated(self, seconds: float) -> None:
        self.eval_s = max(self.eval_s, seconds)

    def saved(self, seconds: float) -> None:
        self.checkpoint_s = max(self.checkpoint_s, seconds)
