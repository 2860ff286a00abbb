"""What the local jobs (``make demo``, the fidelity run) share: logging a step, running
a command, and making (or reusing) an event store."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lartpc.bench.train import LARTPC  # python -m lartpc: no console script needed

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The executable ``name`` of this environment (else the one on PATH)."""
    exe = BIN / name
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def say(tag: str, msg: str) -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(tag: str, cmd: list[str]) -> None:
    """Run ``cmd``; a failure ends the job with a line naming it.

    A SIGTERM to this job (``kill``, a scheduler) is passed on to ``cmd``, so a training
    checkpoints and stops (status preempted) instead of running on without its job; a
    Ctrl-C reaches ``cmd`` from the terminal itself, so it is only waited out. Either
    way the job then ends with 128 + the signal's number and a line saying that the same
    command resumes."""
    say(tag, "$ " + " ".join(cmd))
    got: list[int] = []
    procs: list[subprocess.Popen] = []

    def on_term(signum, frame) -> None:
        got.append(signum)
        for proc in procs:
            proc.send_signal(signum)

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_term),
                signal.SIGINT: signal.signal(signal.SIGINT, lambda s, f: got.append(s))}
    try:
        code = 0
        if not got:
            procs.append(subprocess.Popen(cmd))
            code = procs[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if got:
        name = signal.Signals(got[0]).name
        say(tag, f"stopped by {name} (exit code {code} from {Path(cmd[0]).name}); "
                 "run the same command again to go on")
        raise SystemExit(128 + got[0])
    if code != 0:
        raise SystemExit(f"{tag}: command failed with exit code {code}: {' '.join(cmd)}")


def events(tag: str, data: Path, n: int, *, downsample: int, seed: int, workers: int,
           extra: tuple[str, ...] = (), expect: dict | None = None,
           physics: str | None = None) -> Path:
    """``data`` holding ``n`` events from ``seed`` at ``downsample`` made with the
    generator's ``physics`` version (None: the latest): reused when the store there is
    exactly that (same generator version, and the file attributes in ``expect`` that
    ``extra`` simulate options set), else made again (``lartpc simulate`` builds beside
    it and swaps in only on success)."""
    from lartpc.data.store import EventStore, EventStoreError
    from lartpc.sim.generate import generator_version
    from lartpc.sim.versions import physics as version

    name = version(physics).name
    if data.exists():
        try:
            store = EventStore(data)
            want = {"seed": seed, "generator_version": generator_version(name),
                    **(expect or {})}
            same = (len(store) == n and store.geometry.downsample == downsample
                    and all(store.attrs.get(k) == v for k, v in want.items()))
        except EventStoreError:
            same = False
        if same:
            say(tag, f"reusing {n} events in {data}")
            return data
        say(tag, f"{data} holds other events; making new ones")
    run(tag, [*LARTPC, "simulate", "--out", str(data), "--events", str(n),
              "--downsample", str(downsample), "--seed", str(seed), "--workers", str(workers),
              "--overwrite", "--physics", name, *extra])
    return data
