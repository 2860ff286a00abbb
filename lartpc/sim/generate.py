"""Single-particle events and sharded datasets.

Event ``i`` of seed ``S`` uses ``np.random.default_rng([S, i])`` only, and its class is
``classes[i % len(classes)]`` (balanced, interleaved), so a dataset is identical
whatever the number of workers or the shard size.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lartpc import CLASSES, __version__
from lartpc.cliparse import check_positive, check_seed, geometry_of
from lartpc.data.staging import existing_shards, replace_store
from lartpc.data.store import SHARD_PATTERN, Event, write_shard
from lartpc.errors import LartpcError
from lartpc.geometry import ACTIVE_X_CM, ACTIVE_Y_CM, ACTIVE_Z_CM, Geometry
from lartpc.sim import materials as mat
from lartpc.sim import versions
from lartpc.sim.readout import ReadoutConfig, digitise
from lartpc.sim.tracks import inside, isotropic
from lartpc.sim.transport import transport

log = logging.getLogger(__name__)
# sim2: restricted dE/dx under delta rays, fluctuating e+-, readout time response and
# regions of interest, published hadronic inputs, K+ decay in flight, beam geometry,
# truth/visible_energy_mev. sim3: beam vertex spread, transverse diffusion shares charge
# among wires, thin-layer Landau straggling, t-slope kinks, measured drift velocity,
# electron restricted dE/dx, noise and ROIs from the noisy waveform everywhere. sim4
# (lartpc.sim.versions): e+- ranges from their own stopping power, protons interact as
# nucleons, positrons annihilate
GENERATOR_VERSION = f"{__version__}+{versions.LATEST}"  #: what a store of the latest physics says


def generator_version(physics: str | None = None) -> str:
    """A store's ``generator_version`` for events of physics version ``physics``."""
    return f"{__version__}+{versions.physics(physics).name}"

#: the momentum range of the study's events, GeV (simulate --momentum-gev)
MOMENTUM_GEV = (1.5, 4.5)
SOURCE_GEOMETRIES = ("isotropic", "beam")  #: simulate --source-geometry (draw_source)
#: beam-like gun: vertex uniform in this box (cm; x, y, z) and direction within
#: BEAM_HALF_ANGLE_DEG of +z. Why a box: a photon first deposits charge one conversion
#: length (9/7 X0 = 18 cm, mean) past its vertex, an electron at it, so with one fixed
#: vertex the first hit alone told e from gamma (81 % of photons started > 3 wires
#: downstream, no electron did). With the vertex uniform over L = 500 cm along the
#: beam the first-hit distributions of e and gamma differ by a total variation of
#: ~lambda / L = 0.036, so a cut on the first hit is right at most ~52 % of the time;
#: across the drift (x) and height the box is as wide as it can be while keeping 30 cm
#: from the faces. z ends at 510 cm so a beam-direction hadron still has >= 5 m of
#: argon (> 4 interaction lengths) ahead.
BEAM_VERTEX_BOX_CM = ((30.0, 226.0), (-86.5, 86.5), (10.0, 510.0))
BEAM_HALF_ANGLE_DEG = 5.0
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


def check_source_geometry(name: str) -> str:
    """``name`` if it is one of :data:`SOURCE_GEOMETRIES`, else a clear error."""
    if name not in SOURCE_GEOMETRIES:
        raise LartpcError(f"--source-geometry {name!r}: choose one of "
                          f"{', '.join(SOURCE_GEOMETRIES)}")
    return name


def draw_source(rng: np.random.Generator, source_geometry: str) -> tuple[np.ndarray, np.ndarray]:
    """(vertex cm, unit direction) of the primary.

    ``isotropic``: vertex uniform in the active volume, direction uniform on the sphere
    (the SPEC's generation). ``beam``: vertex uniform in :data:`BEAM_VERTEX_BOX_CM`,
    direction uniform in solid angle within :data:`BEAM_HALF_ANGLE_DEG` of the beam
    axis (+z).
    """
    if source_geometry == "beam":
        cos_min = np.cos(np.radians(BEAM_HALF_ANGLE_DEG))
        c = rng.uniform(cos_min, 1.0)
        phi = rng.uniform(0, 2 * np.pi)
        s = np.sqrt(1 - c * c)
        vertex = np.array([rng.uniform(lo, hi) for lo, hi in BEAM_VERTEX_BOX_CM])
        return vertex, np.array([s * np.cos(phi), s * np.sin(phi), c])
    vertex = np.array([rng.uniform(*ACTIVE_X_CM), rng.uniform(*ACTIVE_Y_CM),
                       rng.uniform(*ACTIVE_Z_CM)])
    return vertex, isotropic(rng)


def simulate_event(index: int, seed: int, geometry: Geometry,
                   classes: Sequence[str] | None = None,
                   momentum_gev: Sequence[float] = MOMENTUM_GEV,
                   source_geometry: str = "isotropic",
                   readout: ReadoutConfig | None = None,
                   physics: str | None = None) -> Event:
    """Generate event ``index`` of ``seed``.

    Parameters
    ----------
    index : event number; the class is ``classes[index % len(classes)]``.
    seed : dataset seed; the event depends on ``(seed, index)`` only.
    geometry : image geometry (``downsample`` bins the pixels).
    classes : class names to cycle through (default all five).
    momentum_gev : (low, high) of the uniform momentum distribution.
    source_geometry : ``"isotropic"`` or ``"beam"`` (see :func:`draw_source`).
    readout : detector response (default :class:`ReadoutConfig`).
    physics : the generator's physics version (default the latest:
        :mod:`lartpc.sim.versions`).

    Returns
    -------
    Event with sparse pixels, label and truth.
    """
    version = versions.physics(physics)
    classes = parse_classes(classes)
    lo, hi = _check_momentum(momentum_gev)
    check_source_geometry(source_geometry)
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
        vertex, d = draw_source(rng, source_geometry)
        deps, length, end = transport(kind, vertex, d, t, rng, version)
        a, b, e = deps.arrays()
        # the criterion must not depend on downsample, so it looks at energy, not pixels
        visible = float(e[inside(0.5 * (a + b))].sum())
        if visible >= MIN_VISIBLE_MEV:
            break
    row, col, charge = digitise(a, b, e, geometry, rng, readout)
    truth = {"pdg": mat.PDG_CODE[kind], "momentum_mev": p, "kinetic_energy_mev": t,
             "vertex_cm": vertex, "direction": d, "path_length_cm": length,
             "end_process": end, "visible_energy_mev": visible}
    return Event(row, col, charge, CLASSES.index(cls), truth, int(index))


def write_event_shard(job: tuple) -> str:
    """Events ``indices`` of dataset ``seed`` into the shard ``path`` (one job of a
    worker pool: ``(path, indices, seed, geometry, classes, momentum_gev, source,
    readout, physics)``); each event's ``event_id`` is its index in the full
    dataset."""
    path, indices, seed, geometry, classes, momentum_gev, source, readout, name = job
    events = [simulate_event(int(i), seed, geometry, classes, momentum_gev, source, readout,
                             name)
              for i in indices]
    attrs = {"source_geometry": source,
             "dead_wire_fraction": float((readout or ReadoutConfig()).dead_wire_fraction),
             "momentum_min_gev": float(momentum_gev[0]),
             "momentum_max_gev": float(momentum_gev[1]),
             "generated_classes": ",".join(parse_classes(classes))}
    write_shard(path, events, geometry, generator="lartpc.sim",
                generator_version=generator_version(name), seed=seed, attrs=attrs)
    return str(path)


def write_dataset(out_dir: str | os.PathLike, n_events: int, *, seed: int = 0,
                  downsample: int = 1, classes: Sequence[str] | str | None = None,
                  momentum_gev: Sequence[float] = MOMENTUM_GEV, workers: int = 1,
                  shard_size: int = 1000, progress: bool = False,
                  overwrite: bool = False, source_geometry: str = "isotropic",
                  readout: ReadoutConfig | None = None,
                  physics: str | None = None) -> list[Path]:
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
    overwrite : replace the shards in ``out_dir`` (once the new ones are all written).
    source_geometry : ``"isotropic"`` (default, as in the study) or ``"beam"``.
    readout : detector response (default :class:`ReadoutConfig`).
    physics : the generator's physics version (default the latest).

    Returns
    -------
    The shard paths, in order. The shards are written into a staging folder beside
    ``out_dir`` and moved in only when all are done: on any failure ``out_dir`` keeps
    what it held.
    """
    classes = parse_classes(classes)
    momentum_gev = _check_momentum(momentum_gev)
    check_source_geometry(source_geometry)
    name = versions.physics(physics).name
    for value, option in ((n_events, "--events"), (workers, "--workers"),
                          (shard_size, "--shard-size")):
        check_positive(value, option)
    check_seed(seed)
    geometry = geometry_of(downsample)
    out = Path(os.path.abspath(out_dir))  # names the new folder after the swap, as "." not
    with replace_store(out, overwrite) as stage:
        _simulate_into(stage, int(n_events), int(seed), geometry, classes, momentum_gev,
                       int(workers), int(shard_size), progress, source_geometry, readout, name)
    written = existing_shards(out)
    log.info("wrote %d events in %d shard(s) to %s", int(n_events), len(written), out)
    return written


def _simulate_into(out: Path, n: int, seed: int, geometry: Geometry, classes, momentum_gev,
                   workers: int, shard_size: int, progress: bool, source_geometry: str,
                   readout: ReadoutConfig | None, physics: str) -> None:
    """Every shard of the dataset into ``out`` (a staging folder)."""
    jobs = [(out / SHARD_PATTERN.format(j), range(a, min(n, a + shard_size)), seed, geometry,
             classes, momentum_gev, source_geometry, readout, physics)
            for j, a in enumerate(range(0, n, shard_size))]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="ev", desc="simulate")
    try:
        if workers == 1 or len(jobs) == 1:
            results = map(write_event_shard, jobs)
            pool = None
        else:
            pool = mp.get_context("spawn").Pool(min(workers, len(jobs)))
            results = pool.imap(write_event_shard, jobs)
        try:
            for job, _ in zip(jobs, results, strict=True):
                if bar:
                    bar.update(len(job[1]))
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    finally:
        if bar:
            bar.close()
