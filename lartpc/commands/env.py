"""``lartpc env``: one line per component, for bug reports and job logs."""

from __future__ import annotations

import argparse
import importlib
import platform


def _version(module: str) -> str:
    try:
        m = importlib.import_module(module)
    except Exception as e:  # report, never crash: this is a diagnostic command
        return f"not available ({type(e).__name__}: {e})".splitlines()[0]
    return str(getattr(m, "__version__", "unknown version"))


def horovod_lines() -> list[str]:
    """Horovod version and build (frameworks, controllers, tensor operations)."""
    try:
        import horovod
        import horovod.torch as hvd
    except Exception as e:
        return [f"horovod: not available ({type(e).__name__}: {e})".splitlines()[0]]
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    return [
        f"horovod: {horovod.__version__}",
        "horovod frameworks: PyTorch (horovod.torch imports)",
        f"horovod controllers: Gloo={yes(hvd.gloo_built())} MPI={yes(hvd.mpi_built())}",
        f"horovod tensor ops: NCCL={yes(hvd.nccl_built())} DDL={yes(hvd.ddl_built())} "
        f"CCL={yes(hvd.ccl_built())} Gloo={yes(hvd.gloo_built())} MPI={yes(hvd.mpi_built())}",
    ]


def env_lines() -> list[str]:
    import torch

    from lartpc import __version__

    cuda = torch.cuda.is_available()
    lines = [
        f"lartpc: {__version__}",
        f"python: {platform.python_version()} ({platform.machine()}, {platform.system()})",
        f"torch: {torch.__version__} (built with CUDA {torch.version.cuda or 'none'})",
        "cuda available: " + (f"yes, {torch.cuda.device_count()} device(s)" if cuda else "no"),
        "device: " + (_cuda_device(torch) if cuda else "cpu"),
    ]
    try:
        from lartpc.models.sparse_compat import import_spconv

        import_spconv()
        from spconv.cppconstants import CPU_ONLY_BUILD

        build = "CPU build" if CPU_ONLY_BUILD else "CUDA build"
        note = f" ({build})" if cuda else f" ({build}, stream fix applied)"
        lines.append(f"spconv: {_version('spconv')}{note}")
    except Exception as e:  # an ImportError, or a broken build failing at import
        lines.append(f"spconv: not available ({type(e).__name__}: {e})")
    lines += [
        f"blosc2: {_version('blosc2')}",
        f"h5py: {_version('h5py')} (HDF5 {_hdf5_version()})",
        f"numpy: {_version('numpy')}",
        # the fused JishNet stem's compiler (model.stem=auto uses it on CUDA)
        f"triton: {_version('triton')}",
        # larcv3 files (optional extra, jobs/env/install_larcv.sh)
        f"larcv: {_version('larcv')}",
    ]
    lines += horovod_lines()
    return lines


def _cuda_device(torch) -> str:
    """The first CUDA device: name, compute capability, memory."""
    prop = torch.cuda.get_device_properties(0)
    return (f"{prop.name} (compute capability {prop.major}.{prop.minor}, "
            f"{prop.total_memory / 2**30:.0f} GiB)")


def _hdf5_version() -> str:
    try:
        import h5py

        return h5py.version.hdf5_version
    except Exception:
        return "?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    for line in env_lines():
        print(line)
    return 0
