"""Per-event particle transport: the primary, then a queue of secondaries."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from lartpc.sim import hadrons
from lartpc.sim.showers import Cascade
from lartpc.sim.tracks import Deposits
from lartpc.sim.versions import Physics, physics

MAX_PARTICLES = 4000  # hard stop on queue length (a safety net; 4.5 GeV showers use ~700)


@dataclass
class Context:
    rng: np.random.Generator
    deps: Deposits = field(default_factory=Deposits)
    queue: deque = field(default_factory=deque)
    hadronic_budget: int = 12
    physics: Physics = field(default_factory=physics)
    cascade: Cascade | None = None

    def __post_init__(self) -> None:
        self.cascade = Cascade(self.deps, self.queue, self.rng, self.physics)


def _one(ctx: Context, kind: str, pos, d, t: float) -> tuple[float, str]:
    if kind in ("e-", "e+"):
        length = ctx.cascade.electron(pos, d, t, kind)
        return length, "stop"
    if kind == "gamma":
        return ctx.cascade.photon(pos, d, t)
    if kind == "pi0":
        hadrons.pi0(ctx, pos, d, t)
        return 0.0, "decay"
    tr = hadrons.hadron(ctx, kind, pos, d, t)
    return tr.length_cm, tr.end


def transport(kind: str, pos: np.ndarray, d: np.ndarray, t_mev: float,
              rng: np.random.Generator, version: Physics | None = None
              ) -> tuple[Deposits, float, str]:
    """Transport a primary and everything it makes, with the physics of generator
    ``version`` (default the latest: :mod:`lartpc.sim.versions`).

    Returns
    -------
    (deposits, primary path length in cm, primary end process)
    """
    ctx = Context(rng, physics=version or physics())
    length, end = _one(ctx, kind, np.asarray(pos, float), np.asarray(d, float), float(t_mev))
    n = 0
    while ctx.queue and n < MAX_PARTICLES:
        k, p, dd, t = ctx.queue.popleft()
        _one(ctx, k, p, dd, t)
        n += 1
    ctx.cascade.flush()
    return ctx.deps, length, end
