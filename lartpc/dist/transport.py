"""Which network path the ranks' collectives took, for ``run.json``'s ``network``.

NCCL picks its transport at communicator set-up (InfiniBand verbs, a plugin such as
libfabric/OFI for Slingshot, or plain TCP sockets) and says so only in its INFO log.
The job scripts (jobs/slurm/env.sh) send that log, limited to set-up and network lines,
to ``NCCL_DEBUG_FILE`` (``%h``/``%p``: host and pid); this module reads this rank's
file after the first collectives. Gloo (CPU ranks, torch or Horovod) runs over TCP.
A run over several nodes whose NCCL fell back to sockets is what a scaling fit must
not take silently: :func:`describe` flags it and the caller logs a warning.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
from pathlib import Path

import torch

#: NCCL's "Using network IB" (2.x) or its "NET/Socket : Using ..." line (not a line such
#: as "NET/Plugin: Failed to find ...", which names no transport).
_USING = re.compile(r"NCCL INFO Using network (\S+)")
_NET = re.compile(r"NCCL INFO NET/(\w+)\s*: Using")
#: NCCL names -> what run.json says.
_SOCKETS = {"Socket", "socket"}


def nccl_version() -> str | None:
    """NCCL's version (``2.21.5``) as torch was built with it, None without CUDA."""
    if not torch.cuda.is_available():
        return None
    try:
        v = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def net_plugin() -> dict:
    """``NCCL_NET_PLUGIN`` and whether its library (``libnccl-net[-NAME].so``) loads."""
    name = os.environ.get("NCCL_NET_PLUGIN")
    lib = name if name and name.endswith(".so") else \
        f"libnccl-net-{name}.so" if name and name != "none" else "libnccl-net.so"
    try:
        ctypes.CDLL(lib)
        loadable = True
    except OSError:
        loadable = False
    return {"net_plugin": name, "net_plugin_library": lib, "net_plugin_loadable": loadable}


def debug_file(pattern: str | None = None) -> Path | None:
    """This process's NCCL_DEBUG_FILE, its ``%h`` and ``%p`` filled in."""
    pattern = pattern if pattern is not None else os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    return Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))


def nccl_transport(text: str) -> str | None:
    """The transport NCCL's INFO lines name (``IB``, ``Socket``, ``OFI``, ...), or None."""
    m = _USING.search(text) or _NET.search(text)
    return m.group(1) if m else None


def describe(library: str, nodes: int) -> dict:
    """The ``network`` record: collective library, NCCL version and plugin, transport.

    ``transport`` is None where it cannot be known (NCCL without its INFO file, MPI);
    ``sockets_across_nodes`` is True when several nodes talk over TCP sockets through
    NCCL, which a GPU cluster's fabric should never need.
    """
    out: dict = {"library": library, "nodes": nodes}
    if library == "gloo":
        out.update(transport="TCP", transport_source="Gloo runs over TCP")
    elif library == "nccl":
        out.update(nccl_version=nccl_version(), **net_plugin(),
                   nccl_ib_disable=os.environ.get("NCCL_IB_DISABLE"),
                   nccl_socket_ifname=os.environ.get("NCCL_SOCKET_IFNAME"))
        path = debug_file()
        text = ""
        if path is not None:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                text = ""
        transport = nccl_transport(text)
        out.update(transport=transport, transport_source=str(path) if transport else
                   "unknown: no NCCL_DEBUG=INFO file (NCCL_DEBUG_FILE)")
    else:
        out.update(transport=None, transport_source=f"{library}: not recorded")
    out["sockets_across_nodes"] = (library == "nccl" and nodes > 1
                                   and out.get("transport") in _SOCKETS)
    return out
