"""Replace an event store as a whole: one writer at a time, one atomic rename.

``simulate`` and ``convert`` write every shard into a staging folder beside ``--out``
(``.OUT.stage-XXXX.lartpc-tmp``) while holding the store's lock
(``.OUT.lartpc-lock`` beside it, removed on release). When all are written the staging
folder and ``--out`` swap names in one rename (``RENAME_EXCHANGE``; where the
filesystem cannot, the old folder is renamed aside and the new one in, so a reader
finds the old store, the new one, or none, never a mix). Anything in ``--out`` that
is not a shard moves over to the new folder; the old shards are removed.

A second writer is refused while the lock is held. The lock's next holder removes the
staging folders killed writers left (no live writer owns them: it would hold the lock),
and puts back an old store whose writer died between the two renames of the fallback.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from lartpc.errors import LartpcError
from lartpc.fsutil import TEMP_SUFFIX, exchange, fsync_dir, output_folder
from lartpc.runfolder.lock import FileLock

log = logging.getLogger(__name__)
SHARD_NAME = re.compile(r"^events-\d{5}\.h5$")
#: A shard's temporary file (:func:`lartpc.fsutil.atomic_path`).
_SHARD_TEMP = re.compile(r"^\.events-\d{5}\.h5\.\w+" + re.escape(TEMP_SUFFIX) + "$")


def existing_shards(out: Path) -> list[Path]:
    """The event shards (``events-NNNNN.h5``) in ``out``, sorted."""
    return sorted(p for p in Path(out).iterdir() if SHARD_NAME.match(p.name))


def store_lock(out: Path) -> FileLock:
    """The lock that one writer of the store ``out`` holds (not yet taken)."""
    return FileLock(out.parent / f".{out.name}.lartpc-lock", time.time(),
                    f"--out {out}: being written by another lartpc command", remove=True)


def _stages(out: Path) -> list[Path]:
    """The staging folders of ``out`` beside it: ours (``stage-``/``old-``), and those of
    earlier versions (``tempfile``'s 8 characters)."""
    pat = re.compile(rf"^\.{re.escape(out.name)}\.(?:stage-\w+|old-\w+|\w{{8}})"
                     rf"{re.escape(TEMP_SUFFIX)}$")
    return sorted(p for p in out.parent.iterdir() if pat.match(p.name))


def check_input_file(p: Path) -> None:
    """``p`` is a file to read (one line naming it otherwise).

    Raises
    ------
    LartpcError
        When it is a folder or missing.
    """
    if p.is_dir():
        raise LartpcError(f"{p}: is a folder; give the input files in it")
    if not p.is_file():
        raise LartpcError(f"{p}: no such input file")


@contextlib.contextmanager
def replace_store(out: Path, overwrite: bool, inputs: Sequence[Path] = ()) -> Iterator[Path]:
    """A fresh staging folder to write the store ``out`` into, under the store's lock.
    When the block succeeds the new store replaces ``out`` in one rename; when it fails
    (or is killed) ``out`` is as it was. ``inputs``: the files read while writing.

    Raises
    ------
    LartpcError
        Naming ``--out``: not creatable or writable, holding shards without
        ``overwrite``, or being written by another process (its pid and host); or naming
        an input that is one of ``out``'s shards (the new store would remove it).
    """
    out = output_folder(out)  # the folder a link of the user's names is the one swapped
    made = not os.path.lexists(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LartpcError(f"--out {out}: cannot create folder ({e.strerror})") from None
    try:
        lock = store_lock(out).acquire()
    except OSError as e:
        _remove_if_empty(out, made)
        raise LartpcError(f"--out {out}: cannot lock it beside it, in {out.parent}, where "
                          f"the new store is staged ({e.strerror})") from None
    try:
        _clean_up_after_dead_writers(out)
        try:
            _check_out(out, overwrite)
            _check_inputs(out, inputs)
        except LartpcError:
            _remove_if_empty(out, made)
            raise
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.stage-",
                                      suffix=TEMP_SUFFIX))
        try:
            yield stage
            os.chmod(stage, stat.S_IMODE(os.stat(out).st_mode))
        except BaseException:
            _remove_store_folder(stage)
            _remove_if_empty(out, made)  # failed or interrupted: no empty --out left
            raise
        _swap_in(stage, out)
    finally:
        lock.release()


def _remove_if_empty(out: Path, made: bool) -> None:
    """Remove ``out`` when this writer made it and it is still empty."""
    if made:
        with contextlib.suppress(OSError):
            os.rmdir(out)


def _check_out(out: Path, overwrite: bool) -> None:
    if not os.access(out, os.W_OK | os.X_OK):
        raise LartpcError(f"--out {out}: folder is not writable")
    old = existing_shards(out)
    if old and not overwrite:
        raise LartpcError(f"--out {out}: already holds {len(old)} event shard(s); "
                          "choose an empty folder or pass --overwrite")


def _check_inputs(out: Path, inputs: Sequence[Path]) -> None:
    """No input is one of ``out``'s shards, which the new store removes; none is given
    twice (:func:`check_distinct_inputs`)."""
    shards = existing_shards(out)
    for p in inputs:
        if any(os.path.samefile(p, s) for s in shards):
            raise LartpcError(f"{p}: is a shard of --out {out}, which the new store "
                              "replaces; write it into another folder")
    check_distinct_inputs(inputs)


def check_distinct_inputs(inputs: Sequence[Path]) -> None:
    """No input file is given twice: by the same or another name (a link), or as a
    byte-for-byte copy, whose events the store would hold twice (the same event in
    training and validation). Files are grouped by size, then by their first and last
    MiB; only files alike in both are compared whole (a copy to its end, another file
    to its first difference), so thousands of inputs cost one stat and at most 2 MiB
    each.

    Raises
    ------
    LartpcError
        Naming both inputs.
    """
    seen: dict[tuple[int, int], Path] = {}
    by_size: dict[int, list[Path]] = {}
    for p in inputs:
        st = os.stat(p)
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise LartpcError(f"{p}: given twice (as {seen[key]}); give each input file "
                              "once")
        seen[key] = p
        by_size.setdefault(st.st_size, []).append(p)
    for group in by_size.values():
        alike: dict[bytes, list[Path]] = {}
        for p in group if len(group) > 1 else ():
            alike.setdefault(_ends(p), []).append(p)
        for same in alike.values():
            for i, p in enumerate(same):
                q = next((q for q in same[:i] if filecmp.cmp(p, q, shallow=False)), None)
                if q is not None:
                    raise LartpcError(f"{p}: a copy of {q} (the same bytes): its events "
                                      "would be in the store twice; give each input file "
                                      "once")


def _ends(path: Path, size: int = 1 << 20) -> bytes:
    """The first and last ``size`` bytes of ``path``, hashed."""
    with open(path, "rb") as f:
        head = f.read(size)
        f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return hashlib.sha256(head + f.read(size)).digest()


def _swap_in(stage: Path, out: Path) -> None:
    """``stage`` becomes ``out`` in one rename; the old store goes."""
    if exchange(stage, out):
        old = stage
    else:
        old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}{TEMP_SUFFIX}"
        os.rename(out, old)
        os.rename(stage, out)  # a kill before this: the next writer puts the old back
    fsync_dir(out.parent)
    _carry_over(old, out)
    _remove_store_folder(old)


def _carry_over(old: Path, out: Path) -> None:
    """What the old folder held besides shards (a user's notes, a run folder) moves into
    the new one."""
    for p in old.iterdir():
        if not (SHARD_NAME.match(p.name) or _SHARD_TEMP.match(p.name)) \
                and not os.path.lexists(out / p.name):
            os.rename(p, out / p.name)


def _remove_store_folder(folder: Path) -> bool:
    """Delete a staging or old store folder: its shards and shard temporaries, then the
    folder if nothing else is left in it (we delete only what we made)."""
    for p in folder.iterdir():
        if SHARD_NAME.match(p.name) or _SHARD_TEMP.match(p.name):
            with contextlib.suppress(OSError):
                if not stat.S_ISDIR(os.lstat(p).st_mode):
                    os.unlink(p)
    try:
        folder.rmdir()
    except OSError:
        log.warning("%s: left in place: it holds files that are not shards", folder)
        return False
    return True


def _clean_up_after_dead_writers(out: Path) -> None:
    """Under the lock: a store renamed aside by a writer killed before it renamed the new
    one in goes back, and every staging folder of ``out`` goes (with what it carried
    over from ``out`` put back)."""
    for folder in _stages(out):
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            continue
        if folder.name.startswith(f".{out.name}.old-") and not existing_shards(out) \
                and not any(out.iterdir()):
            os.rename(folder, out)  # rename over the empty folder made above
            log.warning("%s: put back the store a killed writer had moved aside", out)
            continue
        _carry_over(folder, out)
        if _remove_store_folder(folder):
            log.warning("removed %s (left by a killed writer)", folder)
