"""A run folder as one training job holds it: taken, recorded segment by segment, let go.

Rank 0 takes the folder (:meth:`RunFolder.take`: refused unless it is new, empty or a
run folder; then its lock, and the temporary files of killed writers cleared), opens
this job's segment in ``run.json`` (:meth:`RunFolder.begin_segment`), adds what it
learns while the job runs (:meth:`RunFolder.update`), and marks how the segment ended
(:meth:`RunFolder.end_segment`) before it lets the lock go (:meth:`RunFolder.release`).
The rules are those of :mod:`.guard`, :mod:`.lock` and :mod:`.record`; this is the one
object training goes through. Standard library only, like the rest of the package.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from lartpc.fsutil import remove_stale_temporaries
from lartpc.runfolder import record
from lartpc.runfolder.guard import check_trainable
from lartpc.runfolder.lock import RunLock
from lartpc.runfolder.schema import RunFolderError, Status

log = logging.getLogger(__name__)


class RunFolder:
    """The run folder ``path`` and, on rank 0 once :meth:`begin_segment` ran, its record
    (``info``: what ``run.json`` holds)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.info: dict[str, Any] = {}
        self._lock: RunLock | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def take(self, process_start: float) -> RunFolder:
        """Check the folder may be trained into, make it and hold its lock (rank 0).

        Raises
        ------
        LartpcError, OSError
            A user's folder that is not a run folder, a lock held by another training, a
            folder that cannot be made.
        """
        check_trainable(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = RunLock(self.path, process_start).acquire()
        for p in remove_stale_temporaries(self.path):
            log.info("removed %s (left by a killed writer)", p)
        return self

    def release(self) -> None:
        """Let the lock go (a no-op on ranks that do not hold it)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def record(self) -> dict[str, Any]:
        """``run.json`` as it is on disk (:func:`lartpc.runfolder.record.read_record`)."""
        return record.read_record(self.path)

    def begin_segment(self, config: dict, resume_step: int | None, process_start: float,
                      store_id: dict, **fields: Any) -> dict[str, Any]:
        """Open this job's segment in ``run.json`` (status running) with ``fields``
        added to the run's record; the record."""
        self.info = record.begin_segment(config, self.path, resume_step, process_start,
                                         store_id)
        self.info.update(fields)
        record.end_segment(self.info, Status.RUNNING.value, None)
        record.write_record(self.path, self.info)
        return self.info

    def update(self, **fields: Any) -> None:
        """Add ``fields`` to the record and write it."""
        self.info.update(fields)
        record.write_record(self.path, self.info)

    def end_segment(self, status: str, error: str | None = None) -> None:
        """Mark the run's end; a disk that cannot take even this is logged, not raised."""
        record.end_segment(self.info, status, time.time(), error)
        try:
            record.write_record(self.path, self.info)
        except RunFolderError as e:
            log.error("%s", e)

    def mark_budget_spent(self, budget_s: float) -> None:
        """``run.json`` says the study's budget is spent (a budget lowered on resume, or
        a segment killed before it could say so); the job scripts requeue it no more."""
        info = record.read_record(self.path)
        if info.get("budget_spent") is not True or info.get("budget_s") != budget_s:
            info.update(budget_spent=True, budget_s=budget_s)
            record.write_record(self.path, info)
