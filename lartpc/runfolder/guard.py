"""Whether a folder may be trained into: ours (a run folder), new, or empty; never a
user's folder that happens to be named by ``--out``."""

from __future__ import annotations

from pathlib import Path

from lartpc.fsutil import UnsafePathError, refuse_symlink
from lartpc.runfolder.schema import LOCK, RUN_JSON, TB_DIR

#: Present in a folder that a training has taken: the lock comes first, run.json next.
MARKERS = (RUN_JSON, LOCK)


def check_trainable(folder: Path) -> None:
    """Raise :class:`UnsafePathError` unless ``folder`` is missing, empty, or a run
    folder (holds ``run.json``, or ``run.lock`` from a training killed before writing
    it); also when its ``tb/`` is a symbolic link, which TensorBoard would follow.

    Without this, a folder of the user's given as ``--out`` would be taken over: its
    files named like run files overwritten, its temporary-looking files cleaned up.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return
    refuse_symlink(folder / TB_DIR, "the TensorBoard folder")
    if any((folder / m).exists() or (folder / m).is_symlink() for m in MARKERS):
        return
    if next(folder.iterdir(), None) is not None:
        raise UnsafePathError(f"--out {folder}: holds files but is not a run folder (no "
                              "run.json); training would overwrite them: use a new or "
                              "empty folder")
