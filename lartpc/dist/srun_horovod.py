"""Horovod over Gloo across nodes without ssh: the batch step hosts Horovod's rendezvous
server and ``srun`` starts the ranks, each given the environment ``horovodrun`` would
give it.

``horovodrun`` reaches every node past the first by ssh, which many clusters forbid
inside jobs. Here the launcher is SLURM's own: ::

    python -m lartpc.dist.srun_horovod --hosts n1:2,n2:2 -- lartpc train ...

starts :class:`horovod.runner.http.http_server.RendezvousServer` with the slot plan of
those hosts, then runs ``srun --ntasks=4 --ntasks-per-node=2`` on this same module
(``task`` mode), which finds its slot from the node SLURM put it on and its local task
id, sets ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK`` ... and the
rendezvous address, and ``exec``s the command. ``HOROVOD_GLOO_IFACE`` is one name for
every node (Horovod's limit): the interface holding the rendezvous address on the
first node, or ``--iface``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys

ENV_PLAN = "LARTPC_HVD_HOSTS"  #: the host:slots plan, passed from the launcher to tasks


def _plan(hosts: str, np_: int):
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    return get_host_assignments(parse_hosts(hosts), np_)


def iface_of(addr: str) -> str:
    """The interface holding ``addr`` on this host (``ip -o addr``), the one the other
    nodes reach it through."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        m = re.match(r"\d+:\s+(\S+)\s+inet\s+([\d.]+)/", line)
        if m and m.group(2) == addr:
            return m.group(1)
    raise SystemExit(f"srun_horovod: no interface here holds {addr}: give --iface")


def rendezvous_addr(hosts: str) -> str:
    """The address the other nodes reach this one at: this host's name resolved, or,
    where that is a loopback address (Debian-style ``/etc/hosts`` maps a host's own name
    to 127.0.1.1) and other nodes take part, the address this host sends from towards
    the next host of ``hosts`` (``host:slots,...``; a UDP socket's connect sends
    nothing)."""
    addr = socket.gethostbyname(socket.gethostname())
    names = [h.rsplit(":", 1)[0] for h in hosts.split(",") if h]
    if not addr.startswith("127.") or len(names) < 2:
        return addr
    peer = socket.gethostbyname(names[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


def launch(args: argparse.Namespace) -> int:
    from horovod.runner.http.http_server import RendezvousServer

    plan = _plan(args.hosts, args.np)
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(plan)
    addr = args.addr or rendezvous_addr(args.hosts)
    iface = args.iface or iface_of(addr)
    per_node = max(s.local_size for s in plan)
    env = {**os.environ, ENV_PLAN: args.hosts, "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo",
           "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface}
    cmd = ["srun", f"--ntasks={args.np}", f"--ntasks-per-node={per_node}",
           "--kill-on-bad-exit=1", *args.srun_args, sys.executable, "-m", __spec__.name,
           "task", str(args.np), "--", *args.command]
    try:
        return subprocess.run(cmd, env=env).returncode
    finally:
        server.stop()


def task(args: argparse.Namespace) -> int:
    """In one srun task: take this node's slot for the local task id, then exec."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    local = int(os.environ.get("SLURM_LOCALID", "0"))
    plan = _plan(os.environ[ENV_PLAN], args.np)
    slot = next((s for s in plan if s.hostname == node and s.local_rank == local), None)
    if slot is None:
        raise SystemExit(f"srun_horovod: no slot for node {node} local task {local} in "
                         f"{os.environ[ENV_PLAN]}")
    os.environ.update({
        "HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size), "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size), "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size)})
    os.execvp(args.command[0], args.command)
    return 127  # not reached


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lartpc.dist.srun_horovod",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("launch", help="host the rendezvous and srun the ranks")
    p.add_argument("--hosts", required=True, help="host:slots,... in rank order")
    p.add_argument("--np", type=int, required=True, help="ranks")
    p.add_argument("--addr", help="rendezvous address the ranks connect to "
                   "(default: this host's name, resolved; if that is a loopback address, "
                   "the one this host reaches the next host from)")
    p.add_argument("--iface", help="network interface for Gloo on every node "
                   "(default: the one routing to --addr)")
    p.add_argument("--srun-arg", dest="srun_args", action="append", default=[],
                   help="extra srun option (repeatable)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    t = sub.add_parser("task", help="(internal) one rank under srun")
    t.add_argument("np", type=int)
    t.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        ap.error("no command after --")
    return launch(args) if args.mode == "launch" else task(args)


if __name__ == "__main__":
    sys.exit(main())
