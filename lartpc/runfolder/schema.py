"""The run folder's vocabulary, one copy for training and analysis (torch-free)."""

from __future__ import annotations

from enum import Enum

from lartpc import CLASSES
from lartpc.errors import LartpcError

#: The files of a run folder (docs/run-folder.md).
RUN_JSON, EVAL_CSV, CONFUSION_CSV, NOISE_CSV = "run.json", "eval.csv", "confusion.csv", "noise.csv"
CHECKPOINT, LOCK = "checkpoint.pt", "run.lock"
#: TensorBoard's folder (train.tensorboard).
TB_DIR = "tb"

#: Columns of rank-NNN.csv (one row per optimizer step of that rank).
STEP_COLUMNS: tuple[str, ...] = (
    "time", "epoch", "rank", "batchno", "data_size", "local_loss", "global_loss",
    "local_acc", "global_acc", "data_s", "compute_s", "comm_s")
#: Columns of eval.csv (one row per evaluation) before issue 37: still read, without
#: the step and images an evaluation was taken at.
EVAL_COLUMNS_V1: tuple[str, ...] = (
    "epoch", "time", "loss", "accuracy", "n_events", *(f"acc_{c}" for c in CLASSES))
#: Columns of eval.csv: ``step`` is the global steps done when it was taken, ``images``
#: the training images all ranks had stepped on by then.
EVAL_COLUMNS: tuple[str, ...] = (*EVAL_COLUMNS_V1, "step", "images")


def eval_columns(classes: tuple[str, ...] = CLASSES) -> tuple[str, ...]:
    """Columns of eval.csv of a run on a store of ``classes`` (:data:`EVAL_COLUMNS` for
    the study's five)."""
    return (*EVAL_COLUMNS_V1[:5], *(f"acc_{c}" for c in classes), "step", "images")


#: Header of confusion.csv: rows true class, columns predicted.
CONFUSION_HEADER: tuple[str, ...] = ("true", *CLASSES)
#: Columns of noise.csv (one row per measured step).
NOISE_COLUMNS: tuple[str, ...] = (
    "step", "epoch", "loss", "batch_small", "batch_big", "g2_small", "g2_big", "g2_est",
    "trace_est", "b_simple")


def rank_csv_name(rank: int) -> str:
    """``rank-NNN.csv`` of ``rank``."""
    return f"rank-{rank:03d}.csv"


class RunFolderError(LartpcError, ValueError):
    """A run folder, or a file in it, cannot be used: it does not follow the run-folder
    contract, or it cannot be written (locked, disk full, inconsistent)."""


class Status(str, Enum):
    """``run.json``'s ``status``: every value a training writes (docs/run-folder.md)."""

    RUNNING = "running"  #: training, or killed without a chance to say so
    COMPLETED = "completed"  #: every configured epoch trained and evaluated
    TIME_LIMIT = "time_limit"  #: stopped near train.time_limit_s, checkpointed
    PREEMPTED = "preempted"  #: stopped by a signal, checkpointed
    DIVERGED = "diverged"  #: a non-finite loss; the last good checkpoint is kept
    FAILED = "failed"  #: an error, named in run.json's "error"


STATUSES: tuple[str, ...] = tuple(s.value for s in Status)
