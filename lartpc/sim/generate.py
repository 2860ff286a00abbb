"""Single-particle events and sharded datasets.

Event ``i`` of seed ``S`` uses ``np.random.default_rng([S, i])`` only, and its class is
``classes[i % len(classes)]`` (balanced, interleaved), so a dataset is identical
whatever the number of workers or the shard size.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lartpc import CLASSES, __version__
from lartpc.data.store import SHARD_PATTERN, Event, write_shard
from lartpc.errors import LartpcError
from lartpc.geometry import ACTIVE_X_CM, ACTIVE_Y_CM, ACTIVE_Z_CM, Geometry
from lartpc.sim import materials as mat
from lartpc.sim.readout import digitise
from lartpc.sim.tracks import inside, isotropic
from lartpc.sim.transport import transport

log = logging.getLogger(__name__)
GENERATOR_VERSION = f"{__version__}+sim1"
MIN_VISIBLE_MEV = 10.0  # an event must deposit at least this in the active volume
MAX_TRIES = 20
_MASS = {"gamma": 0.0, "e-": mat.ME_MEV, "e+": mat.ME_MEV, "mu+": mat.MASS_MEV["mu"],
         "pi+": mat.MASS_MEV["pi"], "K+": mat.MASS_MEV["K"]}


def parse_classes(classes: Sequence[str] | str | None) -> tuple[str, ...]:
    """Validated class names (default: all five, in SPEC order)."""
    if classes is None:
        return CLASSES
    if isinstance(classes, str):
        classes = [c.strip() for c in classes.split(",") if c.strip()]
    bad = [c for c in classes if c not in CLASSES]
    if bad or not classes:
        raise LartpcError(f"--classes: unknown class {', '.join(map(repr, bad)) or '(none given)'};"
                          f" choose from {', '.join(CLASSES)}")
    return tuple(classes)


def _check_momentum(momentum_gev: Sequence[float]) -> tuple[float, float]:
    lo, hi = (float(v) for v in momentum_gev)
    if not (0 < lo <= hi) or not np.isfinite(hi):
        raise LartpcError(f"--momentum-gev: need 0 < low <= high, got {lo}:{hi}")
    return lo, hi


def simulate_event(index: int, seed: int, geometry: Geometry,
                   classes: Sequence[str] | None = None,
                   momentum_gev: Sequence[float] = (1.5, 4.5)) -> Event:
    """Generate event ``index`` of ``seed``.

    Parameters
    ----------
    index : event number; the class is ``classes[index % len(classes)]``.
    seed : dataset seed; the event depends on ``(seed, index)`` only.
    geometry : image geometry (``downsample`` bins the pixels).
    classes : class names to cycle through (default all five).
    momentum_gev : (low, high) of the uniform momentum distribution.

    Returns
    -------
    Event with sparse pixels, label and truth.
    """
    classes = parse_classes(classes)
    lo, hi = _check_momentum(momentum_gev)
    rng = np.random.default_rng([int(seed), int(index)])
    cls = classes[index % len(classes)]
    kind = {"gamma": "gamma", "muon": "mu+", "pion": "pi+", "kaon": "K+"}.get(cls)
    if kind is None:
        kind = "e-" if rng.random() < 0.5 else "e+"
    p = rng.uniform(lo, hi) * 1000.0
    t = float(mat.kinetic(p, _MASS[kind]))
    # A photon can leave before converting (or a particle graze a corner) and leave an
    # empty image; like a trigger requirement, such draws are repeated with a new vertex
    # and direction (same random stream, so still deterministic in (seed, index)).
    for _ in range(MAX_TRIES):
        vertex = np.array([rng.uniform(*ACTIVE_X_CM), rng.uniform(*ACTIVE_Y_CM),
                           rng.uniform(*ACTIVE_Z_CM)])
        d = isotropic(rng)
        deps, length, end = transport(kind, vertex, d, t, rng)
        a, b, e = deps.arrays()
        # the criterion must not depend on downsample, so it looks at energy, not pixels
        if e[inside(0.5 * (a + b))].sum() >= MIN_VISIBLE_MEV:
            break
    row, col, charge = digitise(a, b, e, geometry, rng)
    truth = {"pdg": mat.PDG_CODE[kind], "momentum_mev": p, "kinetic_energy_mev": t,
             "vertex_cm": vertex, "direction": d, "path_length_cm": length,
             "end_process": end}
    return Event(row, col, charge, CLASSES.index(cls), truth, int(index))


def _make_shard(job: tuple) -> str:
    path, start, stop, seed, geometry, classes, momentum_gev = job
    events = [simulate_event(i, seed, geometry, classes, momentum_gev) for i in range(start, stop)]
    write_shard(path, events, geometry, generator="lartpc.sim",
                generator_version=GENERATOR_VERSION, seed=seed)
    return str(path)


def write_dataset(out_dir: str | os.PathLike, n_events: int, *, seed: int = 0,
                  downsample: int = 1, classes: Sequence[str] | str | None = None,
                  momentum_gev: Sequence[float] = (1.5, 4.5), workers: int = 1,
                  shard_size: int = 1000, progress: bool = False,
                  overwrite: bool = False) -> list[Path]:
    """Generate ``n_events`` events into ``out_dir/events-00000.h5, ...``.

    Parameters
    ----------
    out_dir : folder (created if missing); must not already hold shards unless
        ``overwrite``.
    n_events : number of events (> 0).
    seed : dataset seed.
    downsample : image bin factor K (a divisor of 3600).
    classes : class names (comma string or sequence), cycled for balance.
    momentum_gev : (low, high) momentum range.
    workers : processes (spawned); the output does not depend on it.
    shard_size : events per file; the output events do not depend on it.
    progress : show a progress bar.
    overwrite : delete existing shards in ``out_dir`` first.

    Returns
    -------
    The shard paths, in order. On any failure the shards written by this call are
    removed (each shard is itself written atomically).
    """
    classes = parse_classes(classes)
    momentum_gev = _check_momentum(momentum_gev)
    if int(n_events) <= 0:
        raise LartpcError(f"--events: must be positive, got {n_events}")
    if int(workers) <= 0:
        raise LartpcError(f"--workers: must be positive, got {workers}")
    if int(shard_size) <= 0:
        raise LartpcError(f"--shard-size: must be positive, got {shard_size}")
    try:
        geometry = Geometry(downsample=int(downsample))
    except ValueError as e:
        raise LartpcError(f"--downsample: {e}") from None
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LartpcError(f"--out {out}: cannot create folder ({e.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise LartpcError(f"--out {out}: folder is not writable")
    old = sorted(p for p in out.iterdir() if re.match(r"^events-\d{5}\.h5$", p.name))
    if old and not overwrite:
        raise LartpcError(f"--out {out}: already holds {len(old)} event shard(s); "
                          "choose an empty folder or overwrite")
    for p in old:
        p.unlink()
    n = int(n_events)
    jobs = [(out / SHARD_PATTERN.format(j), a, min(n, a + shard_size), int(seed), geometry,
             classes, momentum_gev) for j, a in enumerate(range(0, n, shard_size))]
    written: list[Path] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="ev", desc="simulate")
    try:
        if workers == 1 or len(jobs) == 1:
            results = map(_make_shard, jobs)
            pool = None
        else:
            pool = mp.get_context("spawn").Pool(min(workers, len(jobs)))
            results = pool.imap(_make_shard, jobs)
        try:
            for job, path in zip(jobs, results, strict=True):
                written.append(Path(path))
                if bar:
                    bar.update(job[2] - job[1])
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    except BaseException:
        for j in jobs:  # also shards a worker finished after the failure was raised
            j[0].unlink(missing_ok=True)
        raise
    finally:
        if bar:
            bar.close()
    log.info("wrote %d events in %d shard(s) to %s", n, len(written), out)
    return written
