"""Logging setup: rank in every line, INFO on rank 0 only."""

from __future__ import annotations

import logging
import os
import sys


def rank_from_env() -> int:
    """Best guess of this process's global rank from any launcher's environment."""
    for var in ("HOROVOD_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if var in os.environ:
            try:
                return int(os.environ[var])
            except ValueError:
                pass
    return 0


def setup_logging(verbose: bool = False, rank: int | None = None) -> None:
    """Configure the ``lartpc`` logger (every module of the package, analysis included)."""
    rank = rank_from_env() if rank is None else rank
    level = logging.DEBUG if verbose else (logging.INFO if rank == 0 else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    lg = logging.getLogger("lartpc")
    lg.handlers[:] = [handler]
    lg.setLevel(level)
    lg.propagate = False
