"""What ``run.json`` records about the software and machine of a run."""

from __future__ import annotations

import importlib
import platform
import socket
import subprocess
from pathlib import Path


def git_sha() -> str:
    """Commit of the lartpc checkout the code runs from, ``+dirty`` after it where
    tracked files differ from it; "unknown" where the package is not in its checkout
    (a pip install: the folder above it is not lartpc's, whatever git repository holds
    the environment)."""
    root = Path(__file__).resolve().parents[2]
    try:
        if 'name = "lartpc"' not in (root / "pyproject.toml").read_text():
            return "unknown"
        sha = _git(root, "rev-parse", "HEAD")
        if sha is None or _git(root, "rev-parse", "--show-toplevel") != str(root):
            return "unknown"
    except OSError:
        return "unknown"
    return sha + ("+dirty" if _git(root, "status", "--porcelain", "--untracked-files=no")
                  else "")


def _git(root: Path, *args: str) -> str | None:
    """``git -C root args``' output, None where it fails."""
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


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
