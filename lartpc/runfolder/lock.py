"""One training at a time per run folder: an OS lock on ``<run>/run.lock`` (torch-free);
the same lock keeps one writer at a time on an event store (:class:`FileLock`).

The lock is ``fcntl.flock`` on an open file, so the kernel releases it when the
holder exits or dies (kill -9, node crash on local disks); nothing needs cleaning up.
The file records who holds it (host, pid, job id, start time) so a refused second
training can name the holder. The file itself stays in the folder between runs.

Filesystems without ``flock`` (some NFS or Lustre mounts without the ``flock``
option) raise ENOLCK/EOPNOTSUPP. Then the recorded holder decides: a live process
of this host refuses the folder (unless it started after the record was written: the
holder's pid reused by another process), anything else is taken over with a warning, since
a process on another host cannot be checked (two jobs on two hosts are then not
prevented; mount with ``flock`` to get that guarantee).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from lartpc.fsutil import open_nofollow
from lartpc.runfolder.schema import LOCK, RunFolderError

log = logging.getLogger(__name__)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}


def job_id() -> str | None:
    """The scheduler's job id (SLURM or LSF), if any."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("LSB_JOBID")


def holder_text(info: dict) -> str:
    """``pid 123 on host n1 (job 42) since <time>`` from a lock file's record."""
    import time

    if not info:
        return "another process (no holder recorded)"
    job = f" (job {info['job_id']})" if info.get("job_id") else ""
    since = info.get("start_time")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) \
        if isinstance(since, int | float) else ""
    return f"pid {info.get('pid')} on host {info.get('host')}{job}{when}"


class FileLock:
    """Exclusive hold on ``path`` (a lock file) for the life of this object (or process).

    Parameters
    ----------
    path : the lock file (created; never through a link).
    start_time : recorded with the holder, for the refusal message.
    busy : what a refused caller is told, before the holder (``X: in use by ...``).
    remove : remove the file on :meth:`release` (a lock beside a folder, not in it). A
        taker then checks that the file it locked is still the one at ``path``, as a
        process that opened it before the removal holds a lock nobody else sees.
    """

    def __init__(self, path: Path, start_time: float, busy: str, remove: bool = False):
        self.path = Path(path)
        self.busy = busy
        self.remove = remove
        self.info = {"host": socket.gethostname(), "pid": os.getpid(), "job_id": job_id(),
                     "start_time": start_time}
        self._fd: int | None = None

    def acquire(self):
        """Take the lock or raise :class:`RunFolderError` naming the holder."""
        while True:
            fd = self._lock_once()
            if not self.remove or _same_file(fd, self.path):
                break
            os.close(fd)  # locked a file its holder removed on release: take the new one
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(self.info) + "\n").encode(), 0)
        os.fsync(fd)
        return self

    def _lock_once(self) -> int:
        # never through a planted link: the lock file is truncated and rewritten
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderError(f"{self.busy}, {holder_text(read_holder(self.path))}"
                                 ) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            self._check_without_flock(fd)
        return fd

    def _check_without_flock(self, fd: int) -> None:
        """The documented fallback where the filesystem has no flock."""
        held = read_holder(self.path)
        if held.get("host") == self.info["host"] and _holds(held):
            os.close(fd)
            raise RunFolderError(f"{self.busy}, {holder_text(held)} (no flock on this "
                                 "filesystem)")
        log.warning("%s: this filesystem has no flock; the folder is not protected "
                    "against a second writer on another host", self.path)

    def release(self) -> None:
        """Let the next one have it (also happens when the process ends)."""
        if self._fd is not None:
            if self.remove:  # while still held, so nobody takes the name in between
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(self._fd)
            self._fd = None


class RunLock(FileLock):
    """One training at a time in a run folder: ``<run>/run.lock``, which stays."""

    def __init__(self, run: Path, start_time: float):
        super().__init__(Path(run) / LOCK, start_time,
                         f"{Path(run)}: in use by another training")


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def read_holder(path: Path) -> dict:
    """The record in a lock file ({} when empty or unreadable)."""
    try:
        info = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def holder_gone(path: Path) -> bool:
    """Whether the lock file at ``path`` names a process of this host that is gone, and
    nothing here holds the lock: a training killed (SIGKILL, out of memory) before it
    could write its status. False where the holder runs, is on another host (which this
    host cannot check), or is not recorded."""
    held = read_holder(path)
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    if held["pid"] == os.getpid() or _holds(held):
        return False
    return _locked_here(Path(path)) is False


def _locked_here(path: Path) -> bool | None:
    """Whether a process of this host holds a lock on ``path`` (``/proc/locks``); None
    where that cannot be read."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            table = f.read()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(len(f := line.split()) > 5 and f[5] == dev
               for line in table.splitlines())


def _holds(held: dict) -> bool:
    """Whether the process a lock record of this host names may still be its holder:
    alive, and not started after the record's ``start_time`` (then its pid was reused)."""
    pid, since = held.get("pid"), held.get("start_time")
    if not _alive(pid):
        return False
    started = _process_start(pid)
    return started is None or not isinstance(since, int | float) or started <= since + 2.0


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, to the second: /proc's boot time
    plus its start in clock ticks), None where /proc cannot say."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
