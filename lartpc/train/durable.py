"""The error training raises about its run folder (the safe writers themselves live in
the torch-free :mod:`lartpc.runfolder.durable`, shared with analysis)."""

from __future__ import annotations

from lartpc.errors import LartpcError


class RunFolderError(LartpcError):
    """The run folder cannot be used or written (locked, disk full, inconsistent)."""
