"""Charged-particle tracks: CSDA energy loss, Highland multiple scattering, delta rays.

A track is stepped in one vectorised pass: the kinetic energy at each step follows from
the CSDA residual range, scattering kicks are drawn for all steps at once and
accumulated in short chunks (small-angle rotations about the chunk's start direction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lartpc.geometry import ACTIVE_X_CM, ACTIVE_Y_CM, ACTIVE_Z_CM
from lartpc.sim import materials as mat
from lartpc.sim.straggling import fluctuate

STEP_CM = 0.3
DELTA_CUT_MEV = 3.0  # delta electrons above this are tracked; below they are local dE/dx
SUBSTEPS = 3  # straggling pieces per step (0.1 cm each at the 0.3 cm step)
_LO = np.array([ACTIVE_X_CM[0], ACTIVE_Y_CM[0], ACTIVE_Z_CM[0]])
_HI = np.array([ACTIVE_X_CM[1], ACTIVE_Y_CM[1], ACTIVE_Z_CM[1]])


class Deposits:
    """Energy deposited on straight segments (start, end, MeV), collected per event."""

    def __init__(self) -> None:
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.energy: list[np.ndarray] = []

    def add_polyline(self, points: np.ndarray, de_mev: np.ndarray) -> None:
        if len(de_mev):
            self.starts.append(points[:-1])
            self.ends.append(points[1:])
            self.energy.append(np.asarray(de_mev, float))

    def add_segments(self, a: np.ndarray, b: np.ndarray, de_mev: np.ndarray) -> None:
        if len(de_mev):
            self.starts.append(a)
            self.ends.append(b)
            self.energy.append(np.asarray(de_mev, float))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.energy:
            z = np.zeros((0, 3))
            return z, z, np.zeros(0)
        return (np.concatenate(self.starts), np.concatenate(self.ends),
                np.concatenate(self.energy))


def inside(p: np.ndarray) -> np.ndarray:
    """True where points (..., 3) lie in the active volume."""
    return np.all((p >= _LO) & (p <= _HI), axis=-1)


def isotropic(rng: np.random.Generator, n: int | None = None) -> np.ndarray:
    """Unit vector(s) uniform on the sphere."""
    shape = (3,) if n is None else (n, 3)
    v = rng.normal(size=shape)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def perp_basis(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors orthogonal to unit vector ``d`` and to each other."""
    # written out by hand: np.cross/np.linalg.norm cost ~20 us each on 3-vectors and
    # this runs thousands of times per shower
    x, y, z = float(d[0]), float(d[1]), float(d[2])
    if abs(x) < 0.9:  # u = d x (1, 0, 0)
        u = (0.0, z, -y)
    else:  # u = d x (0, 1, 0)
        u = (-z, 0.0, x)
    n = (u[0] * u[0] + u[1] * u[1] + u[2] * u[2]) ** 0.5
    u = (u[0] / n, u[1] / n, u[2] / n)
    v = (y * u[2] - z * u[1], z * u[0] - x * u[2], x * u[1] - y * u[0])
    return np.array(u), np.array(v)


def rotate(d: np.ndarray, theta: float, phi: float) -> np.ndarray:
    """``d`` turned by polar angle ``theta`` at azimuth ``phi``."""
    u, v = perp_basis(d)
    st = np.sin(theta)
    out = np.cos(theta) * d + (st * np.cos(phi)) * u + (st * np.sin(phi)) * v
    return out / np.sqrt(out @ out)


def trajectory(start: np.ndarray, direction: np.ndarray, t_mev: np.ndarray, mass_mev: float,
               ds: float, rng: np.random.Generator, chunk: int = 48
               ) -> tuple[np.ndarray, np.ndarray]:
    """Points of a scattered track given the kinetic energy at each step boundary.

    Returns ``(points (n+1, 3), direction at the last step)``; ``t_mev`` has n+1 entries.
    """
    n = len(t_mev) - 1
    if n < 1:
        return start[None, :].copy(), direction
    tm = 0.5 * (t_mev[1:] + t_mev[:-1])
    p = mat.momentum(np.maximum(tm, 1e-3), mass_mev)
    beta = p / (tm + mass_mev)
    # Highland per step with its log term evaluated at one X0 (the segment length it is
    # usually quoted for), so the RMS after n steps is independent of the step size;
    # capped so very soft particles curl rather than flip
    th = np.minimum(mat.highland_theta0(p, beta, mat.X0_CM) * np.sqrt(ds / mat.X0_CM), 0.6)
    kicks = rng.normal(size=(n, 2)) * th[:, None]
    dirs = np.empty((n, 3))
    d = direction
    for c in range(0, n, chunk):
        k = np.cumsum(kicks[c:c + chunk], axis=0)
        u, v = perp_basis(d)
        dd = d + k[:, :1] * u + k[:, 1:] * v
        dd /= np.linalg.norm(dd, axis=1, keepdims=True)
        dirs[c:c + chunk] = dd
        d = dd[-1]
    pts = np.empty((n + 1, 3))
    pts[0] = start
    np.cumsum(dirs * ds, axis=0, out=pts[1:])
    pts[1:] += start
    return pts, d


@dataclass(slots=True)
class Track:
    """A stepped track: points, energy at each point, and how it ended."""

    points: np.ndarray
    t_mev: np.ndarray
    end: str  # stop | exit | interact
    direction: np.ndarray

    @property
    def length_cm(self) -> float:
        return float(np.linalg.norm(np.diff(self.points, axis=0), axis=1).sum())


def heavy_track(start, direction, t0_mev: float, mass_mev: float, rng: np.random.Generator,
                deps: Deposits, queue: list, max_len_cm: float = np.inf,
                step_cm: float = STEP_CM) -> Track:
    """Propagate a muon/pion/kaon/proton until it stops, interacts or leaves the volume.

    Deposits the restricted ionisation loss (with thin-layer Landau straggling) into ``deps``
    and appends delta electrons above ``DELTA_CUT_MEV`` to ``queue`` as
    ``("e-", pos, dir, T)``.
    """
    r0 = float(mat.csda_range_cm(t0_mev, mass_mev))
    length = min(r0, max_len_cm)
    n = max(1, int(np.ceil(length / step_cm)))
    ds = length / n
    s = np.arange(n + 1) * ds
    t = mat.energy_at_range(np.maximum(r0 - s, 0.0), mass_mev)
    t[0] = t0_mev
    if length >= r0:
        t[-1] = 0.0
    pts, dlast = trajectory(np.asarray(start, float), direction, t, mass_mev, ds, rng)
    end = "stop" if length >= r0 else "interact"
    ok = inside(pts)
    if not ok.all():
        k = int(np.argmin(ok))  # first point outside: keep the crossing segment
        pts, t = pts[:k + 1], t[:k + 1]
        end = "exit"
        dlast = (pts[-1] - pts[-2]) / max(np.linalg.norm(pts[-1] - pts[-2]), 1e-9) \
            if len(pts) > 1 else direction
    de = -np.diff(t)
    if len(de):
        deps.add_polyline(*deposit_restricted(pts, t, mass_mev, de, rng, queue))
    return Track(pts, t, end, dlast)


def delta_tmax_mev(t_mev: np.ndarray, mass_mev: float, kind: str = "") -> np.ndarray:
    """Largest kinetic energy a delta electron can take from a particle of ``t_mev``.

    Heavy particles: the PDG kinematic maximum. Electrons (Moller, identical particles):
    half the kinetic energy. Positrons (Bhabha): all of it.
    """
    if kind == "e-":
        return 0.5 * t_mev
    if kind == "e+":
        return np.asarray(t_mev, float)
    gamma = 1 + t_mev / mass_mev
    r = mat.ME_MEV / mass_mev
    return 2 * mat.ME_MEV * (gamma**2 - 1) / (1 + 2 * gamma * r + r * r)


def delta_rays_above_per_cm(t_mev: np.ndarray, mass_mev: float, above_mev: float,
                            kind: str = "") -> np.ndarray:
    """Delta electrons per cm above ``above_mev`` from a particle of ``t_mev``: the
    1/T^2 envelope the generator draws from, before its 1 - beta^2 T / Tmax thinning
    (so at least as many as it makes); 0 where Tmax does not reach ``above_mev``."""
    tmax = np.maximum(delta_tmax_mev(t_mev, mass_mev, kind), above_mev)
    return _delta_prefactor(_beta2(t_mev, mass_mev)) * (1 / above_mev - 1 / tmax)


def _beta2(t_mev: np.ndarray, mass_mev: float) -> np.ndarray:
    gamma = 1 + t_mev / mass_mev
    return 1 - 1 / gamma**2


def _delta_prefactor(beta2: np.ndarray) -> np.ndarray:
    # K/2 Z/A rho / beta^2: dN/dT dx = this / T^2 (1 - beta^2 T / Tmax), spin-0 form
    return 0.5 * mat.K_MEV_CM2_MOL * mat.Z_OVER_A * mat.DENSITY_G_CM3 / beta2


def delta_loss_mev_cm(t_mev: np.ndarray, mass_mev: float, kind: str = "") -> np.ndarray:
    """Mean energy loss per cm into delta electrons above ``DELTA_CUT_MEV``.

    The integral of T dN/dT dx from the cut to Tmax; the Bethe mean loss minus this is
    the restricted loss (PDG review, "Passage of particles through matter", the
    restricted energy loss formula).
    """
    t_mev = np.asarray(t_mev, float)
    tmax = delta_tmax_mev(t_mev, mass_mev, kind)
    beta2 = _beta2(t_mev, mass_mev)
    w = np.maximum(tmax, DELTA_CUT_MEV)
    val = _delta_prefactor(beta2) * (np.log(w / DELTA_CUT_MEV) - beta2 * (1 - DELTA_CUT_MEV / w))
    return np.where(tmax > DELTA_CUT_MEV, np.maximum(val, 0.0), 0.0)


def deposit_restricted(pts: np.ndarray, t: np.ndarray, mass_mev: float, de: np.ndarray,
                       rng: np.random.Generator, queue, kind: str = "",
                       dedx_mev_cm: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Visible ionisation along a track: the restricted loss, straggled, plus sampled
    deltas.

    Parameters
    ----------
    pts : (n+1, 3) step points.
    t : (n+1,) kinetic energy at the points.
    mass_mev : particle mass.
    de : (n,) mean collision loss per step (MeV).
    rng, queue : random stream; tracked delta electrons are appended to ``queue``.
    kind : ``"e-"``/``"e+"`` for Moller/Bhabha kinematics, else a heavy particle.
    dedx_mev_cm : (n,) mean collision stopping power per step of a heavy particle
        (default Bethe); e+- use :func:`lartpc.sim.materials.electron_restricted_dedx`.

    Returns
    -------
    (points, energies) of a finer polyline: each step is cut into ``SUBSTEPS`` pieces
    (0.1 cm, the readout's sampling) straggled independently, so the loss on any 0.3 cm
    of track (one wire) has the thin-layer width whatever the steps' alignment with
    the wires (see :mod:`lartpc.sim.straggling`). Every
    step keeps its restricted share of the mean loss whatever deltas were drawn, so a
    track is never dimmed by its deltas; the mean total (local + deltas) is still the
    full collision loss (for e+-: the restricted Berger-Seltzer loss, at most the step's
    collision loss, plus the deltas).
    """
    tm = 0.5 * (t[1:] + t[:-1])
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    if kind in ("e-", "e+"):
        # Berger-Seltzer restricted loss (Moller/Bhabha), within the step's collision loss
        mean = np.minimum(mat.electron_dedx(tm, DELTA_CUT_MEV, kind == "e+") * seg, de)
    else:
        if dedx_mev_cm is None:
            dedx_mev_cm = mat.bethe_dedx(tm, mass_mev)
        frac = np.clip(1 - delta_loss_mev_cm(tm, mass_mev, kind) / dedx_mev_cm, 0.0, 1.0)
        mean = de * frac
    beta2 = _beta2(tm, mass_mev)
    # thin-layer (Landau) straggling of the restricted part, mean preserved; the high
    # tail beyond the delta cut comes from the explicit delta rays
    t_max = delta_tmax_mev(tm, mass_mev, kind)
    k = SUBSTEPS
    out = fluctuate(np.repeat(mean / k, k), np.repeat(_delta_prefactor(beta2) * seg / k, k),
                    np.repeat(np.minimum(DELTA_CUT_MEV, t_max), k), np.repeat(t_max, k),
                    np.repeat(beta2, k), rng)
    fine = np.empty((k * len(de) + 1, 3))
    fine[:-1] = (pts[:-1, None, :] + np.diff(pts, axis=0)[:, None, :]
                 * (np.arange(k) / k)[None, :, None]).reshape(-1, 3)
    fine[-1] = pts[len(de)]
    _delta_rays(pts, tm, mass_mev, rng, queue, kind)
    return fine, out


def _delta_rays(pts, tm, mass_mev, rng, queue, kind: str = "") -> None:
    tmax = delta_tmax_mev(tm, mass_mev, kind)
    ok = tmax > DELTA_CUT_MEV
    if not ok.any():
        return
    beta2 = _beta2(tm, mass_mev)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    # Poisson counts from the 1/T^2 envelope, each kept with probability
    # 1 - beta^2 T / Tmax (thinning a Poisson process keeps it Poisson)
    rate = _delta_prefactor(beta2) * (1 / DELTA_CUT_MEV - 1 / np.maximum(tmax, DELTA_CUT_MEV))
    counts = rng.poisson(np.where(ok, rate * seg, 0.0))
    for i in np.flatnonzero(counts):
        for _ in range(counts[i]):
            te = 1 / (1 / DELTA_CUT_MEV - rng.random() * (1 / DELTA_CUT_MEV - 1 / tmax[i]))
            if rng.random() > 1 - beta2[i] * te / tmax[i]:
                continue
            # cos = (T_e / p_e)(p_ref / T_ref): T_ref = Tmax for a heavy particle, the
            # primary's own T for e+- (two-body elastic kinematics in both cases)
            ref = tm[i] if kind in ("e-", "e+") else tmax[i]
            cos = min(1.0, te / mat.momentum(te, mat.ME_MEV)
                      * mat.momentum(ref, mat.ME_MEV) / ref)
            d = pts[i + 1] - pts[i]
            d = d / max(np.linalg.norm(d), 1e-9)
            d = rotate(d, float(np.arccos(cos)), rng.uniform(0, 2 * np.pi))
            queue.append(("e-", pts[i].copy(), d, float(te)))
