"""The srun Horovod launcher's rendezvous address (lartpc.dist.srun_horovod): where a
node's own name resolves to a loopback address, the other nodes are given the address
this node reaches them from, not 127.0.1.1."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from lartpc.dist import srun_horovod


def _own_address() -> str | None:
    """A non-loopback IPv4 address of this machine, or None."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                         text=True).stdout
    found = [a for a in re.findall(r"inet ([\d.]+)/", out) if not a.startswith("127.")]
    return found[0] if found else None


def test_a_loopback_name_gives_the_address_towards_the_next_node(monkeypatch):
    own = _own_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address to route from")
    names = {"login-like": "127.0.1.1", "n2": own}  # as Debian's /etc/hosts would have it
    monkeypatch.setattr(socket, "gethostname", lambda: "login-like")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: names[name])
    assert srun_horovod.rendezvous_addr("login-like:2,n2:2") == own
    # one node: every rank is here, the loopback address serves
    assert srun_horovod.rendezvous_addr("login-like:4") == "127.0.1.1"
    # a name that resolves to a routable address is used as it is
    names["login-like"] = "10.1.2.3"
    assert srun_horovod.rendezvous_addr("login-like:2,n2:2") == "10.1.2.3"
    assert srun_horovod.iface_of(own)  # the interface found for the address given
