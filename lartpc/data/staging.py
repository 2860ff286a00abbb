"""Write a store's shards beside the target folder and swap them in only on success,
so a failed or interrupted ``simulate`` / ``convert --overwrite`` never leaves the
folder emptied of the store it held."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lartpc.errors import LartpcError
from lartpc.runfolder.durable import TEMP_SUFFIX, fsync_dir

SHARD_NAME = re.compile(r"^events-\d{5}\.h5$")


def existing_shards(out: Path) -> list[Path]:
    """The event shards (``events-NNNNN.h5``) in ``out``, sorted."""
    return sorted(p for p in Path(out).iterdir() if SHARD_NAME.match(p.name))


def prepare_out(out: Path, overwrite: bool) -> Path:
    """Create ``out`` if needed; refuse one that holds shards unless ``overwrite``.

    Raises
    ------
    LartpcError
        Naming the folder: not creatable, not writable, or holding shards.
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LartpcError(f"--out {out}: cannot create folder ({e.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise LartpcError(f"--out {out}: folder is not writable")
    old = existing_shards(out)
    if old and not overwrite:
        raise LartpcError(f"--out {out}: already holds {len(old)} event shard(s); "
                          "choose an empty folder or overwrite")
    return out


@contextlib.contextmanager
def staged_shards(out: Path) -> Iterator[Path]:
    """A fresh folder beside ``out`` to write shards into. When the block succeeds,
    its shards replace ``out``'s (old shards beyond the new ones are removed); when it
    fails, the staging folder goes and ``out`` is as it was."""
    out = Path(out)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=TEMP_SUFFIX))
    try:
        yield stage
        new = existing_shards(stage)
        for p in new:
            os.replace(p, out / p.name)
        names = {p.name for p in new}
        for p in existing_shards(out):
            if p.name not in names:
                p.unlink()
        fsync_dir(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
