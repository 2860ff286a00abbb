"""A run folder as one training job holds it: taken, recorded segment by segment, let go.

Rank 0 takes the folder (:meth:`RunFolder.take`: refused unless it is new, empty or a
run folder; then its lock, the temporary files of killed writers cleared, ``run.json``
checked, and on a start from step 0 an earlier attempt's leftovers moved away), opens
this job's segment in ``run.json`` (:meth:`RunFolder.begin_segment`), adds what it
learns while the job runs (:meth:`RunFolder.update`), and marks how the segment ended
(:meth:`RunFolder.end_segment`) before it lets the lock go (:meth:`RunFolder.release`).
The rules are those of :mod:`.guard`, :mod:`.lock` and :mod:`.record`; this is the one
object training goes through. Standard library only, like the rest of the package.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from lartpc.fsutil import remove_stale_temporaries
from lartpc.runfolder import record
from lartpc.runfolder.guard import check_trainable
from lartpc.runfolder.lock import RunLock
from lartpc.runfolder.schema import (
    CHECKPOINT,
    CONFUSION_CSV,
    EVAL_CSV,
    NOISE_CSV,
    TB_DIR,
    RunFolderError,
    Status,
)

log = logging.getLogger(__name__)
#: What an attempt writes that a start from step 0 may never rewrite (killed before its
#: first evaluation, the noise scale or TensorBoard off); rank logs beyond its ranks too.
EARLIER_ATTEMPT = (EVAL_CSV, CONFUSION_CSV, NOISE_CSV, TB_DIR)
_RANK_LOG = re.compile(r"rank-(\d{3,})\.csv")


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

    def take(self, process_start: float, world_size: int) -> RunFolder:
        """Check the folder may be trained into, make it and hold its lock (rank 0).

        Then ``run.json`` is checked to be one this job can continue
        (:func:`~lartpc.runfolder.record.check_continuable`); on a start from step 0 (no
        checkpoint) what an earlier attempt left and this one may never rewrite is moved
        away (:meth:`_discard_earlier_attempt`). ``world_size`` is this job's.

        Raises
        ------
        LartpcError, OSError
            A user's folder that is not a run folder, a lock held by another training, a
            folder that cannot be made, a ``run.json`` that cannot be continued.
        """
        check_trainable(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = RunLock(self.path, process_start).acquire()
        try:
            for p in remove_stale_temporaries(self.path):
                log.info("removed %s (left by a killed writer)", p)
            resume = os.path.lexists(self.path / CHECKPOINT)
            record.check_continuable(self.path, resume)
            if not resume:
                self._discard_earlier_attempt(world_size, process_start)
        except BaseException:
            self.release()  # a refused job holds nothing
            raise
        return self

    def _discard_earlier_attempt(self, world_size: int, process_start: float) -> None:
        """Move what an earlier attempt wrote and this start from step 0 may never
        rewrite into ``discarded-<time>/``: rank logs of ranks this job does not have,
        and evaluations, noise scale and TensorBoard scalars, which it writes later or
        not at all. Left in place, they would be read as this attempt's (times before its
        start, ranks beyond its world size). Moved, not deleted: they are the user's."""
        old = sorted(p for p in self.path.iterdir()
                     if p.name in EARLIER_ATTEMPT or ((m := _RANK_LOG.fullmatch(p.name))
                                                       and int(m.group(1)) >= world_size))
        if not old:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(process_start))
        dest = self.path / f"discarded-{stamp}"
        try:
            for i in itertools.count(2):  # two restarts within a second: a second folder
                try:
                    dest.mkdir()
                    break
                except FileExistsError:
                    dest = self.path / f"discarded-{stamp}-{i}"
            for p in old:
                p.rename(dest / p.name)  # a link moves as the link, never followed
        except OSError as e:
            raise RunFolderError(f"{self.path}: cannot move an earlier attempt's files "
                                 f"to {dest} ({e.strerror or e})") from None
        log.warning("%s: moved %s of an earlier attempt to %s/ (this start from step 0 "
                    "would not rewrite them)", self.path, ", ".join(p.name for p in old),
                    dest.name)

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

    def mark_completed(self, **fields: Any) -> None:
        """``run.json`` says completed, with ``fields`` (the checkpoint's clock): a job
        killed between its last checkpoint and marking the run left another status, and
        the job scripts would count it failed or requeue it for ever."""
        info = record.read_record(self.path)
        if info.get("status") != Status.COMPLETED.value:
            log.warning("%s: run.json said %r: marked completed", self.path,
                        info.get("status"))
            info.update(fields)
            record.end_segment(info, Status.COMPLETED.value, time.time())
            record.write_record(self.path, info)

    def mark_budget_spent(self, budget_s: float) -> None:
        """``run.json`` says the study's budget is spent (a budget lowered on resume, or
        a segment killed before it could say so); the job scripts requeue it no more."""
        info = record.read_record(self.path)
        if info.get("budget_spent") is not True or info.get("budget_s") != budget_s:
            info.update(budget_spent=True, budget_s=budget_s)
            record.write_record(self.path, info)
