"""The run folder's vocabulary, one copy for training and analysis (torch-free)."""

from __future__ import annotations

from enum import Enum

from lartpc.errors import LartpcError


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
