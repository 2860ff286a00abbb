"""Import spconv, with two narrow fixes for its CPU kernels.

* spconv 2.3.x asks ``torch.cuda.current_stream()`` for a stream handle in every
  kernel call, including CPU ones; on a CPU-only torch that raises (the backward
  pass crashes). The CPU kernels ignore the stream, so where CUDA is unavailable we
  hand them stream 0. On a CUDA host nothing is changed.
* Its CPU ``scatter_add`` races between OpenMP threads (see
  :func:`fix_cpu_scatter_add`); CPU tensors take that path on any host, so that fix
  is always applied.
"""

from __future__ import annotations

import importlib
import logging
import warnings

from lartpc.errors import MissingPackage

log = logging.getLogger(__name__)
_PATCHED_MODULES = ("spconv.pytorch.ops", "spconv.pytorch.hash")
_patched = False


def _null_stream() -> int:
    return 0


_scatter_fixed = False


def fix_cpu_scatter_add(spconv_ops=None) -> None:
    """Replace spconv 2.3.x's CPU ``scatter_add`` with a race-free torch ``index_add_``.

    spconv's CPU kernel (``csrc/sparse/gather.py``) declares its row pointers outside
    the parallel loop and shares them between threads, so with more than one OpenMP
    thread convolution outputs are silently wrong (up to ~0.7 absolute on unit
    inputs; ``tests/test_scnet_reference.py`` catches it). Inside a kernel offset
    the target rows are distinct, so an ``index_add_`` gives the same sums.
    """
    global _scatter_fixed
    if _scatter_fixed:
        return
    import torch

    if spconv_ops is None:
        import spconv.pytorch.ops as spconv_ops
    ops_cls = spconv_ops.SpconvOps

    class _Ops(ops_cls):  # type: ignore[misc, valid-type]
        @staticmethod
        def scatter_add_cpu(out, buf, inds) -> None:
            idx = torch.from_numpy(inds.numpy_view()).long()
            src = torch.from_numpy(buf.numpy_view())[: idx.shape[0]]
            torch.from_numpy(out.numpy_view()).index_add_(0, idx, src)

    spconv_ops.SpconvOps = _Ops
    _scatter_fixed = True


def import_spconv():
    """Return ``spconv.pytorch``, patched for CPU use when CUDA is unavailable.

    Raises
    ------
    MissingPackage
        (an ImportError) with an install hint when spconv is missing.
    """
    global _patched
    import torch

    try:
        with warnings.catch_warnings():
            # spconv's build helper (ccimport) calls locale.getdefaultlocale at import,
            # deprecated since Python 3.11: every SCNet run printed it.
            warnings.filterwarnings("ignore", message=".*getdefaultlocale",
                                    category=DeprecationWarning)
            spconv = importlib.import_module("spconv.pytorch")
    except ImportError as e:
        raise MissingPackage(
            "spconv is not installed (SCNet's default layers need it; "
            "--set model.sparse=torch runs without it): `make install` in a checkout picks "
            "the build matching torch; in a pip install, `pip install 'lartpc[sparse]'` "
            "for the CPU build, or spconv-cu12X matching torch's CUDA 12.X (e.g. "
            "spconv-cu126; jobs/env/install_spconv.sh picks it)"
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
    fix_cpu_scatter_add()
    return spconv
