"""Durable file operations for the run folder and the error they raise."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from lartpc.errors import LartpcError


class RunFolderError(LartpcError):
    """The run folder cannot be used or written (locked, disk full, inconsistent)."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    """Remove ``path`` if it exists, ignoring errors (cleanup after a failed write)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def remove_stale_temporaries(run: Path) -> list[Path]:
    """Delete the temporary files (``.NAME.PID.tmp``) a killed writer left in ``run``.

    Only called by the lock holder, so no live writer owns them; they are partial
    copies of files that are rewritten whole, never the only copy of anything.
    """
    gone = []
    for p in Path(run).glob(".*.tmp"):
        remove_quietly(p)
        gone.append(p)
    return gone
