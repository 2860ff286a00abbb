"""What ``run.json`` records about the software and machine of a run."""

from __future__ import annotations

import importlib
import platform
import socket
import subprocess
from pathlib import Path


def git_sha() -> str:
    """Commit of the lartpc checkout ("unknown" outside a git work tree)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def versions() -> dict[str, str]:
    v = {"python": platform.python_version()}
    for mod in ("lartpc", "torch", "numpy", "h5py", "blosc2", "spconv", "horovod", "triton"):
        try:
            v[mod] = str(getattr(importlib.import_module(mod), "__version__", "?"))
        except Exception:  # optional pieces may be absent; record that, don't fail
            v[mod] = "absent"
    import torch

    v["cuda"] = torch.version.cuda or "none"
    return v


def host() -> str:
    return socket.gethostname()
