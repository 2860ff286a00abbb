"""Safe, durable writes into folders we may not own (run folders, report folders, a
sweep's output, the target of a conversion).

Every writer in the project goes through :func:`atomic_write`: the new content goes to a
temporary file that ``tempfile`` creates in the target folder with ``O_EXCL`` and an
unpredictable name (a file or symlink planted there in advance cannot be followed or
overwritten), is flushed and fsynced, gets its mode, and replaces the target by
``rename`` (which replaces a symlink at the target, never the file it points to). On
any failure the temporary file is removed and the target keeps its old content.

Temporary names end in :data:`TEMP_SUFFIX`, so a cleanup removes only what a lartpc
writer made (:func:`remove_stale_temporaries`). Files that grow in place (the rank
logs, the lock) are opened with :func:`open_nofollow`. Standard library only: the
torch-free analysis imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from lartpc.errors import LartpcError

TEMP_SUFFIX = ".lartpc-tmp"


class UnsafePathError(LartpcError):
    """A path we were to write is a symlink or not a regular file."""


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


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], object] | bytes | str,
                 mode: int = 0o644) -> Path:
    """Replace ``path`` with new content, never torn, never through a planted link.

    Parameters
    ----------
    path : the file to (re)write; its folder must exist.
    write : the content (``bytes`` or ``str``, UTF-8), or a function given the open
        binary temporary file (``torch.save``, ``savefig``, a CSV writer...).
    mode : permissions of the new file (set on the temporary file we created).

    Raises
    ------
    UnsafePathError
        When ``path`` is a folder or another non-regular file (a symlink is replaced,
        not followed).
    Exception
        Whatever ``write`` or the filesystem raised (disk full: ``OSError``, and
        ``RuntimeError`` from ``torch.save``); the temporary file is gone by then.
    """
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise UnsafePathError(f"{path}: exists and is not a regular file; not replaced")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(write):
                write(f)
            else:
                f.write(write.encode() if isinstance(write, str) else write)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(Path(tmp))
        raise
    fsync_dir(path.parent)
    return path


def open_nofollow(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symlink at ``path`` (``O_NOFOLLOW``) and anything but a
    regular file; the file descriptor.

    Raises
    ------
    UnsafePathError
        Naming the file, when it is a symlink or not a regular file.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{path}: is a symbolic link; refusing to write through "
                                  "it (remove it)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path}: is not a regular file; refusing to write it")
    return fd


def refuse_symlink(path: Path | str, what: str) -> None:
    """Raise :class:`UnsafePathError` when ``path`` is a symlink (a folder we would
    write into, such as ``tb/``)."""
    if os.path.islink(path):
        raise UnsafePathError(f"{path}: {what} is a symbolic link; refusing to write "
                              "through it (remove it)")


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files a killed lartpc writer left in ``folder``: regular
    files named ``.NAME.*`` + :data:`TEMP_SUFFIX`, nothing else (a user's own
    ``.draft.tmp`` stays). Only the folder's lock holder calls it, so no live writer
    owns them; they are partial copies of files rewritten whole."""
    gone = []
    for p in Path(folder).glob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(p).st_mode):
                os.unlink(p)
                gone.append(p)
    return gone


@contextlib.contextmanager
def atomic_path(path: Path | str, mode: int = 0o644):
    """For writers that need a file name (h5py): yields a fresh temporary path beside
    ``path`` (created empty with ``O_EXCL``, unpredictable name), which replaces ``path``
    when the block succeeds and is removed when it fails."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(Path(tmp))
        raise
    fsync_dir(path.parent)
