"""Import spconv, with a narrow fix for its CPU backward pass.

spconv 2.3.x asks ``torch.cuda.current_stream()`` for a stream handle in every
kernel call, including CPU ones; on a CPU-only torch that raises. The CPU kernels
ignore the stream, so where CUDA is unavailable we hand them stream 0. On a CUDA
host nothing is changed.
"""

from __future__ import annotations

import importlib
import logging
import warnings

log = logging.getLogger(__name__)
_PATCHED_MODULES = ("spconv.pytorch.ops", "spconv.pytorch.hash")
_patched = False


def _null_stream() -> int:
    return 0


def import_spconv():
    """Return ``spconv.pytorch``, patched for CPU use when CUDA is unavailable.

    Raises
    ------
    ImportError
        With an install hint when spconv is missing.
    """
    global _patched
    import torch

    try:
        spconv = importlib.import_module("spconv.pytorch")
    except ImportError as e:
        raise ImportError(
            "spconv is not installed: run `make install` (CPU build `spconv`) or, on a "
            "CUDA host, `pip install spconv-cu120` matching your CUDA version"
        ) from e
    # spconv indexes with a list of slices, which torch >= 2.9 warns about on every call.
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional",
                            category=UserWarning, module="spconv")
    if not _patched and not torch.cuda.is_available():
        for name in _PATCHED_MODULES:
            mod = importlib.import_module(name)
            if hasattr(mod, "get_current_stream"):
                mod.get_current_stream = _null_stream
        _patched = True
        log.debug("spconv: CUDA unavailable, CPU stream fix applied")
    return spconv
