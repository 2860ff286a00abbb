"""Safe, durable writes into folders we may not own (run folders, report folders, a
sweep's output, the target of a conversion). The ground floor: imports only `errors`.

The rule (docs/run-folder.md, "Writing safely"): below an output folder the user named,
no file is read or written through a symbolic link, at the file or at the folder it is
in; the project makes no links there, so any link found is someone else's. A command
resolves its output folder once (:func:`output_folder`, where the user's own link is
followed) and everything below goes through this module:

- :func:`atomic_write` (and :func:`atomic_path` for writers that need a file name) puts
  the new content in a temporary file created with ``O_EXCL`` and an unpredictable name
  in the target's folder, flushes and fsyncs it, gives it its mode and renames it over
  the target (which replaces a symlink there, never the file it points to). The folder
  is opened once with ``O_NOFOLLOW`` and the file made and renamed relative to it, so a
  folder swapped for a link is refused, also between a check and the write. On any
  failure the temporary file is removed and the target keeps its old content.
- :func:`open_nofollow` opens files that grow in place (the rank logs, the lock) the same
  way; :func:`read_nofollow` reads a file refusing a link at its name.
- :func:`subfolder` makes or checks a folder inside an output folder (``tb/``,
  ``confusion/``, a sweep's ``jobs/``), refusing a link there; :func:`held_folder`
  keeps one open for a library that writes by name (TensorBoard).
- :func:`plain_name` refuses input that is to become a file name but names a path.

Temporary names end in :data:`TEMP_SUFFIX`, so a cleanup removes only what a lartpc
writer made (:func:`remove_stale_temporaries`). Standard library only: the torch-free
analysis imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from lartpc.errors import LartpcError

TEMP_SUFFIX = ".lartpc-tmp"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_NOFOLLOW = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC
#: A name that is one plain path component: no separator or control character, not
#: hidden (so not '.' or '..' either).
_PLAIN = re.compile(r"^[^./\\\x00-\x1f][^/\\\x00-\x1f]{0,199}$")


class UnsafePathError(LartpcError):
    """A path we were to write is a symlink or not a regular file."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    _fsync_quietly(fd)
    os.close(fd)


def _fsync_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on directories
        os.fsync(fd)


def remove_quietly(path: Path) -> None:
    """Remove ``path`` if it exists, ignoring errors (cleanup after a failed write)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def output_folder(path: Path | str) -> Path:
    """The output folder the user named, with the user's own links resolved: the one
    place a link is followed; every file and folder below it is checked."""
    return Path(os.path.realpath(path))


def output_file(path: Path | str) -> Path:
    """An output file the user named, in its folder with the user's links resolved (see
    :func:`output_folder`)."""
    path = Path(path)
    return output_folder(path.parent) / path.name


def _link_refused(path: Path | str, what: str = "", verb: str = "write") -> UnsafePathError:
    what = f"{what} is" if what else "is"
    return UnsafePathError(f"{path}: {what} a symbolic link; refusing to {verb} through "
                           "it (remove it)")


def open_folder(path: Path | str, what: str = "") -> int:
    """A folder opened without following a link at its name (a descriptor to work
    relative to: ``dir_fd=``); the caller closes it.

    Raises
    ------
    UnsafePathError
        When ``path`` is a symbolic link or not a folder.
    OSError
        When it does not exist or cannot be opened.
    """
    try:
        return os.open(path, _DIR_NOFOLLOW)
    except OSError as e:
        if os.path.islink(path):
            raise _link_refused(path, what) from None
        if e.errno == errno.ENOTDIR:
            raise UnsafePathError(f"{path}: is not a folder; refusing to write into it") \
                from None
        raise


@contextlib.contextmanager
def _in_folder(path: Path) -> Iterator[int]:
    fd = open_folder(path.parent, "the folder")
    try:
        yield fd
    finally:
        os.close(fd)


def _temporary(folder: int, name: str, path: Path | None = None) -> tuple[int, str]:
    """A new, empty temporary file beside ``name`` in the open ``folder``: its
    descriptor and name (unpredictable, created with O_EXCL: never a planted file). An
    error creating it (a folder that is not writable) names ``path``, the file the
    caller writes, not the temporary one."""
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(6)}{TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC,
                         0o600, dir_fd=folder)
        except FileExistsError:
            continue
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(path or name)) from None
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def _unlink_quietly(name: str, folder: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder)


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
        not followed), or its folder is a symbolic link.
    Exception
        Whatever ``write`` or the filesystem raised (disk full: ``OSError``, and
        ``RuntimeError`` from ``torch.save``); the temporary file is gone by then.
    """
    path = Path(path)
    with _in_folder(path) as folder:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise UnsafePathError(f"{path}: exists and is not a regular file; not replaced")
        fd, tmp = _temporary(folder, path.name, path)
        try:
            with os.fdopen(fd, "wb") as f:
                if callable(write):
                    write(f)
                else:
                    f.write(write.encode() if isinstance(write, str) else write)
                f.flush()
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), mode)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            _unlink_quietly(tmp, folder)
            raise
        _fsync_quietly(folder)
    return path


@contextlib.contextmanager
def atomic_path(path: Path | str, mode: int = 0o644) -> Iterator[Path]:
    """For writers that need a file name (h5py): yields a fresh temporary path beside
    ``path`` (created empty with ``O_EXCL``, unpredictable name), which replaces ``path``
    when the block succeeds and is removed when it fails."""
    path = Path(path)
    with _in_folder(path) as folder:
        fd, tmp = _temporary(folder, path.name, path)
        os.close(fd)
        try:
            yield path.parent / tmp
            os.chmod(tmp, mode, dir_fd=folder, follow_symlinks=False)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            _unlink_quietly(tmp, folder)
            raise
        _fsync_quietly(folder)


def open_nofollow(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symlink at ``path`` or at its folder, and anything
    but a regular file; the file descriptor.

    Raises
    ------
    UnsafePathError
        Naming the file (or folder), when it is a symlink or not a regular file.
    """
    path = Path(path)
    with _in_folder(path) as folder:
        fd = _open_at(path, flags | os.O_NOFOLLOW | _CLOEXEC, mode, folder)
    return _regular(fd, path)


def _open_at(path: Path, flags: int, mode: int, folder: int | None, verb: str = "write"
             ) -> int:
    try:
        if folder is None:
            return os.open(path, flags, mode)
        return os.open(path.name, flags, mode, dir_fd=folder)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_refused(path, verb=verb) from None
        raise


def _regular(fd: int, path: Path) -> int:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path}: is not a regular file; refusing to use it")
    return fd


def read_nofollow(path: Path | str) -> bytes:
    """The content of ``path``, refusing a symbolic link there (a run file replaced by a
    link to someone's file must not be copied into the run folder).

    Raises
    ------
    UnsafePathError
        When ``path`` is a symbolic link or not a regular file.
    OSError
        When it is missing or cannot be read.
    """
    path = Path(path)
    fd = _regular(_open_at(path, os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC, 0, None, "read"),
                  path)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def check_replaceable(path: Path | str, option: str, kind: str,
                      is_kind: Callable[[bytes], bool]) -> None:
    """Refuse to write ``path`` (``option``'s file) over an existing file that is not
    a ``kind`` (what the option writes, told by ``is_kind`` of its bytes): writing a new
    result over an old one is asked for by naming it; a checkpoint, a shard or a user's
    own file named by mistake is never replaced.

    Raises
    ------
    LartpcError
        Naming ``option`` and ``path``: a folder, or a file that is not a ``kind``.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_dir():
        raise LartpcError(f"{option} {path}: is a folder; name a file")
    try:
        ok = is_kind(read_nofollow(path))
    except OSError as e:
        raise LartpcError(f"{option} {path}: exists and cannot be read ({e.strerror or e})"
                          ) from None
    if not ok:
        raise LartpcError(f"{option} {path}: exists and is not a {kind}; refusing to replace "
                          "it (choose another name)")


def refuse_symlink(path: Path | str, what: str) -> None:
    """Raise :class:`UnsafePathError` when ``path`` is a symlink (a folder we would
    write into, such as ``tb/``)."""
    if os.path.islink(path):
        raise _link_refused(path, what)


def subfolder(parent: Path | str, name: str, what: str) -> Path:
    """``parent/name``, a folder inside an output folder: made (mode 0755 at most) when
    missing; refused when it is a symbolic link or not a folder.

    Raises
    ------
    UnsafePathError
        Naming the folder and ``what`` it is for.
    """
    path = Path(parent) / plain_name(name, what)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)
    os.close(open_folder(path, what))
    return path


def held_folder(parent: Path | str, name: str, what: str) -> tuple[int, str]:
    """:func:`subfolder` held open, for a library that opens files by name, again and
    again (TensorBoard reopens its event file for every write): the descriptor (the
    caller closes it) and a name for the folder that keeps naming the folder we checked
    even if ``parent/name`` is later swapped for a link (``/proc/self/fd/N``, Linux);
    where there is no such name, the path itself, checked once here.
    """
    path = subfolder(parent, name, what)
    fd = open_folder(path, what)
    held = f"/proc/self/fd/{fd}"
    with contextlib.suppress(OSError):
        a, b = os.stat(held), os.fstat(fd)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return fd, held
    return fd, str(path)


def plain_name(name: str, what: str) -> str:
    """``name`` when it can be a file name inside an output folder as it is: one path
    component (no ``/`` or ``\\``, no control character), not hidden (so not ``..``), at
    most 200 characters.

    Raises
    ------
    UnsafePathError
        Naming ``what`` the name is and the name.
    """
    if not isinstance(name, str) or not _PLAIN.match(name):
        raise UnsafePathError(f"{what} {name!r}: names a file to write, so it must be a "
                              "plain name (no folder part, no leading dot)")
    return name


def exchange(a: Path | str, b: Path | str) -> bool:
    """Swap two paths in one atomic rename (Linux ``renameat2(RENAME_EXCHANGE)``): a
    reader sees the one or the other at each name, never neither. False, with nothing
    done, where the system or filesystem cannot.

    Raises
    ------
    OSError
        When the swap was possible but failed (a path missing, no permission).
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # a C library older than glibc 2.28
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint)
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


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
