"""What the local jobs (``make demo``, the fidelity run) share: logging a step, running
a command, and making (or reusing) an event store."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The executable ``name`` of this environment (else the one on PATH)."""
    exe = BIN / name
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def say(tag: str, msg: str) -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(tag: str, cmd: list[str]) -> None:
    """Run ``cmd``; a failure ends the job with a line naming it."""
    say(tag, "$ " + " ".join(cmd))
    r = subprocess.run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"{tag}: command failed with exit code {r.returncode}: "
                         f"{' '.join(cmd)}")


def events(tag: str, data: Path, n: int, *, downsample: int, seed: int, workers: int,
           extra: tuple[str, ...] = (), expect: dict | None = None) -> Path:
    """``data`` holding ``n`` events from ``seed`` at ``downsample``: reused when the
    store there is exactly that (same generator version, and the file attributes in
    ``expect`` that ``extra`` simulate options set), else made again (``lartpc simulate``
    builds beside it and swaps in only on success)."""
    from lartpc.data.store import EventStore, EventStoreError
    from lartpc.sim.generate import GENERATOR_VERSION

    if data.exists():
        try:
            store = EventStore(data)
            want = {"seed": seed, "generator_version": GENERATOR_VERSION, **(expect or {})}
            same = (len(store) == n and store.geometry.downsample == downsample
                    and all(store.attrs.get(k) == v for k, v in want.items()))
        except EventStoreError:
            same = False
        if same:
            say(tag, f"reusing {n} events in {data}")
            return data
        say(tag, f"{data} holds other events; making new ones")
    run(tag, [tool("lartpc"), "simulate", "--out", str(data), "--events", str(n),
              "--downsample", str(downsample), "--seed", str(seed), "--workers", str(workers),
              "--overwrite", *extra])
    return data
