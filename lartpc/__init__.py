"""lartpc: a sparse-versus-dense CNN scaling study on LArTPC event images."""

from pathlib import Path as _Path

__version__ = "0.1.0"


def _map_source_tree() -> None:
    """Let ``lartpc.analysis`` and ``lartpc.jobs`` import from a source checkout on
    PYTHONPATH (the offline GPU host of the README), where no install maps the
    checkout's ``analysis/`` and ``jobs/`` into the package: the checkout's root joins
    the package's path, so both resolve to the same files an install would use."""
    root = _Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and all(
            (root / sub / "__init__.py").is_file() for sub in ("analysis", "jobs")):
        if str(root) not in __path__:
            __path__.append(str(root))


_map_source_tree()

#: Class names in the index order used everywhere (logs, confusion matrices, reports).
CLASSES: tuple[str, ...] = ("gamma", "electron", "muon", "pion", "kaon")
NUM_CLASSES = len(CLASSES)
#: The largest seed (train.seed, simulate --seed): seeds are stored as int64 (HDF5
#: attributes, TOML integers) and torch.manual_seed takes no more.
MAX_SEED = 2 ** 63 - 1
