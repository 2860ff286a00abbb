"""Where a training's numbers go: one small protocol, one class per destination.

Every sink takes :meth:`Sink.on_step` after each optimizer step and
:meth:`Sink.on_eval` after each evaluation; :meth:`Sink.flush` makes what it holds
durable (the checkpointer calls it before every checkpoint, so no log is behind the
checkpoint) and :meth:`Sink.close` ends the segment. The rank CSV is every rank's; the
evaluation files, TensorBoard and the console progress are rank 0's (the others get
:class:`Sink` itself, which does nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lartpc import CLASSES
from lartpc.runfolder import tables
from lartpc.train.progress import open_progress
from lartpc.train.tblog import open_tblog

if TYPE_CHECKING:
    from lartpc.train.segments import Segment

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimizer step as this rank saw it; the fields of its rank-CSV row carry the
    row's column names (docs/run-folder.md)."""

    global_step: int  #: counted from 0: the row index in the rank CSV
    epoch: int
    batchno: int  #: the step within its epoch, from 0
    rank: int
    data_size: int  #: this rank's events
    images: int  #: every rank's events
    local_loss: float
    local_acc: float
    global_loss: float  #: averaged over the ranks
    global_acc: float
    lr: float
    data_s: float  #: waiting for the batch
    compute_s: float
    #: gradient exchange, the stop vote, the noise-scale collective; with the torch
    #: backend on CUDA the exchange's part is the device's time (:mod:`lartpc.dist.spans`)
    comm_s: float
    time: float  #: ``time.time()`` at the step's end (sinks may get the record a step later)
    noise: dict | None = None  #: the noise.csv row written at this step, if any

    @property
    def step_s(self) -> float:
        return self.data_s + self.compute_s + self.comm_s


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """One evaluation: its eval.csv row (and every row so far), the confusion counts,
    its duration."""

    global_step: int  #: the last training step before it
    row: dict
    rows: list[dict]
    confusion: np.ndarray
    seconds: float
    classes: tuple[str, ...] = CLASSES  #: the store's classes (rows of confusion)


class Sink:
    """The protocol, and the sink that does nothing."""

    def on_step(self, rec: StepRecord) -> None:
        pass

    def on_eval(self, rec: EvalRecord) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class RankCSV(Sink):
    """``rank-NNN.csv``: one row per step (buffered; ``flush`` writes and fsyncs)."""

    def __init__(self, run: Path, rank: int, keep_steps: int, flush_every: int):
        self.log = tables.StepLog(run, rank, keep_steps=keep_steps, flush_every=flush_every)

    def on_step(self, rec: StepRecord) -> None:
        self.log.log(time=rec.time, epoch=rec.epoch, rank=rec.rank,
                     batchno=rec.batchno, data_size=rec.data_size,
                     local_loss=rec.local_loss, global_loss=rec.global_loss,
                     local_acc=rec.local_acc, global_acc=rec.global_acc, data_s=rec.data_s,
                     compute_s=rec.compute_s, comm_s=rec.comm_s)

    def flush(self) -> None:
        self.log.flush()


class EvalFiles(Sink):
    """``eval.csv`` (every evaluation so far) and ``confusion.csv`` (the last one)."""

    def __init__(self, run: Path):
        self.run = run

    def on_eval(self, rec: EvalRecord) -> None:
        tables.write_eval(self.run, rec.rows, rec.classes)
        tables.write_confusion(self.run, rec.confusion, rec.classes)
        log.info("eval epoch %d (step %d, %d images): loss %.4f accuracy %.3f on %d events",
                 rec.row["epoch"], rec.row["step"], rec.row["images"], rec.row["loss"],
                 rec.row["accuracy"], rec.row["n_events"])


class TensorBoard(Sink):
    """Scalars into ``tb/`` (see :mod:`lartpc.train.tblog`)."""

    def __init__(self, tb):
        self.tb = tb

    def on_step(self, rec: StepRecord) -> None:
        self.tb.step(rec.global_step, loss=rec.global_loss, acc=rec.global_acc, lr=rec.lr,
                     images=rec.images, step_s=rec.step_s, data_s=rec.data_s)
        if rec.noise is not None:
            self.tb.scalars(rec.global_step, {f"noise/{k}": rec.noise[k]
                                              for k in ("g2_est", "trace_est", "b_simple")})

    def on_eval(self, rec: EvalRecord) -> None:
        self.tb.evaluation(rec.global_step, rec.row)

    def flush(self) -> None:
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()


class Console(Sink):
    """Rank 0's progress lines (see :mod:`lartpc.train.progress`)."""

    def __init__(self, progress):
        self.progress = progress

    def on_step(self, rec: StepRecord) -> None:
        self.progress.on_step(rec.global_step + 1, loss=rec.global_loss, acc=rec.global_acc,
                              images=rec.images, data_s=rec.data_s,
                              compute_s=rec.compute_s, comm_s=rec.comm_s)

    def on_eval(self, rec: EvalRecord) -> None:
        self.progress.on_eval(rec.seconds)

    def close(self) -> None:
        self.progress.close()


class Sinks(Sink):
    """Several sinks as one, called in order."""

    def __init__(self, *sinks: Sink):
        self.sinks = sinks

    def on_step(self, rec: StepRecord) -> None:
        for s in self.sinks:
            s.on_step(rec)

    def on_eval(self, rec: EvalRecord) -> None:
        for s in self.sinks:
            s.on_eval(rec)

    def flush(self) -> None:
        for s in self.sinks:
            s.flush()

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def open_sinks(seg: Segment, start_step: int) -> Sinks:
    """A segment's sinks from ``start_step`` on: every rank's CSV; rank 0's console,
    evaluation files and TensorBoard."""
    cfg, run, world = seg.cfg, seg.run, seg.world
    tc = cfg.train
    csv = RankCSV(run, world.rank, start_step, tc.log_flush_steps)
    if not world.is_root:
        return Sinks(csv)
    return Sinks(Console(open_progress(cfg, True, seg.plan.steps_per_epoch, seg.process_start,
                                       start_step)),
                 csv, EvalFiles(run),
                 TensorBoard(open_tblog(tc.tensorboard, True, run, start_step)))
