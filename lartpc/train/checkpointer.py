"""When and how a training saves: flush every rank's logs, agree, rank 0 writes."""

from __future__ import annotations

import time

import torch

from lartpc.dist import World
from lartpc.runfolder.schema import CHECKPOINT, RunFolderError
from lartpc.train import checkpoint
from lartpc.train.sinks import Sink


class Checkpointer:
    """Saves ``checkpoint.pt`` every ``checkpoint_every_steps`` steps, else every
    ``checkpoint_every_s`` seconds, and at the points the loop asks for.

    Every log is on disk before the checkpoint that counts its rows, so a resume never
    finds a log behind its checkpoint; a rank that cannot write makes every rank raise
    (none waits for it in a collective forever).
    """

    def __init__(self, world: World, run, every_steps: int, every_s: float):
        self.world, self.run = world, run
        self.every_steps, self.every_s = every_steps, every_s
        self.last_time = time.time()

    def due(self, global_step: int) -> bool:
        """This rank's wish to save once ``global_step`` steps are done. The time rule
        reads this rank's clock: the loop votes on it with the step
        (:class:`~lartpc.train.trainer.StepVote`), never acts on it alone."""
        if self.every_steps:
            return global_step % self.every_steps == 0
        return time.time() - self.last_time > self.every_s

    def save(self, trainer, sinks: Sink) -> None:
        # counted after the write: a checkpoint holds the time of those before it
        t_start, error = time.perf_counter(), None
        try:
            sinks.flush()
        except RunFolderError as e:
            error = e
        self._agree(error, "its logs")
        if self.world.is_root:
            t0 = time.time()
            try:
                checkpoint.write(self.run, trainer.state_dict())
            except RunFolderError as e:
                error = e
            trainer.timing.checkpoint_s = time.time() - t0
        self._agree(error, CHECKPOINT)
        self.last_time = time.time()
        trainer.saved_step = trainer.state.global_step
        trainer.state.checkpoint_time_s += time.perf_counter() - t_start

    def _agree(self, error: RunFolderError | None, what: str) -> None:
        """Raise on every rank when any rank failed to write."""
        failed = self.world.allreduce_sum(torch.tensor([0.0 if error is None else 1.0]))
        if float(failed[0]) > 0:
            raise error or RunFolderError(f"{self.run}: another rank could not write {what}")
