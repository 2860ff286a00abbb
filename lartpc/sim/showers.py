"""Electromagnetic cascades: electrons radiate bremsstrahlung photons that travel before
pair-converting (or Compton scattering at low energy), which makes new electrons.

Electrons above ``E_TRACK_MEV`` are followed with multiple scattering; softer ones (and
any beyond the cap on followed particles) deposit along a straight stub of their CSDA
range, which keeps a multi-GeV shower to ~100 followed tracks. What differs between
generator versions (the e+- ranges, the booking of the collision loss, annihilation) is
:class:`lartpc.sim.versions.Physics`.
"""

from __future__ import annotations

import numpy as np

from lartpc.sim import materials as mat
from lartpc.sim.tracks import (
    STEP_CM,
    Deposits,
    deposit_restricted,
    inside,
    isotropic,
    rotate,
    trajectory,
)
from lartpc.sim.versions import Physics, physics

E_TRACK_MEV = 8.0  # follow e+- above this with a scattered trajectory
K_CUT_MEV = 6.0  # bremsstrahlung photons above this are emitted as particles
PAIR_MIN_MEV = 10.0
MAX_FOLLOWED = 400
_MU = mat.MASS_MEV["mu"]
# Total photon attenuation in argon (NIST XCOM, coherent excluded; cm2/g): Compton
# dominated at 1-10 MeV, pair production 7/9 / X0 at high energy.
_XCOM_MEV = np.array([1, 2, 5, 10, 20, 50, 100, 300, 1000, 1e4, 1e5])
_XCOM_CM2_G = np.array([.0615, .0448, .0328, .0299, .0300, .0327, .0348, .0372, .0388,
                        .0397, .0398])
#: mean free path of a 511 keV annihilation photon: Compton on argon's electrons (the
#: Klein-Nishina cross section at 511 keV gives 0.0778 cm2/g; binding lowers it a little,
#: photoabsorption adds ~4e-4), 0.078 cm2/g, coherent scattering excluded as in the table
#: above: 9.2 cm
ANNIHILATION_MFP_CM = 1.0 / (0.078 * mat.DENSITY_G_CM3)


def photon_mfp_cm(k_mev: float | np.ndarray) -> np.ndarray:
    """Mean free path of a photon of energy ``k_mev`` in LAr."""
    mu = np.interp(np.log(np.maximum(k_mev, 1.0)), np.log(_XCOM_MEV), _XCOM_CM2_G)
    return 1.0 / (mu * mat.DENSITY_G_CM3)


def electron_range_cm(t_mev, stopping: bool = False, positron: bool = False):
    """CSDA range of an e- (``positron``: e+); radiative loss is handled explicitly.
    ``stopping`` (sim4 on): from the electrons' own collision stopping power
    (:func:`lartpc.sim.materials.electron_range_table`); else (sim3) scaled from the
    muon's Bethe table at equal beta*gamma, 10 % short at 8 MeV."""
    if stopping:
        return mat.range_of(t_mev, mat.electron_range_table(positron))
    return mat.csda_range_cm(np.asarray(t_mev) * _MU / mat.ME_MEV, _MU) * mat.ME_MEV / _MU


def electron_energy_at_range(r_cm, stopping: bool = False, positron: bool = False):
    """The inverse of :func:`electron_range_cm`."""
    if stopping:
        return mat.energy_of(r_cm, mat.electron_range_table(positron))
    return mat.energy_at_range(np.asarray(r_cm) * _MU / mat.ME_MEV, _MU) * mat.ME_MEV / _MU


def _brems_rate_per_cm(e_mev: float) -> float:
    y = K_CUT_MEV / e_mev
    return ((4 / 3) * (np.log(1 / y) - (1 - y)) + (1 - y * y) / 2) / mat.X0_CM


def _brems_fraction(rng: np.random.Generator, ycut: float) -> float:
    # dN/dy ~ (4/3 (1-y) + y^2) / y: sample 1/y, accept with the bracket / (4/3)
    while True:
        y = ycut ** rng.random()
        if rng.random() * (4 / 3) <= (4 / 3) * (1 - y) + y * y:
            return y


class Cascade:
    """Per-event EM transport state: counts followed particles, batches soft stubs."""

    def __init__(self, deps: Deposits, queue: list, rng: np.random.Generator,
                 version: Physics | None = None):
        self.deps, self.queue, self.rng = deps, queue, rng
        self.physics = version or physics()
        self.followed = 0
        self.stubs: list[tuple[np.ndarray, np.ndarray, float, str]] = []

    def _range(self, t_mev, kind: str):
        return electron_range_cm(t_mev, self.physics.electron_stopping, kind == "e+")

    def electron(self, pos: np.ndarray, d: np.ndarray, t_mev: float, kind: str = "e-") -> float:
        """Transport one e+- (``kind`` "e-" or "e+"); returns its path length (cm).

        Collision loss goes through the heavy-track code: the restricted Berger-Seltzer
        loss with thin-layer straggling on every step, plus Moller (e-) or Bhabha (e+)
        delta electrons above the delta-ray cut. The energy bookkeeping between
        bremsstrahlung emissions uses the total collision loss at the energy after the
        last emission (sim3: at the starting energy throughout; 2.2 MeV/cm at 10 MeV to
        2.8 MeV/cm at 3 GeV in LAr), and a stopped e+ annihilates (sim4).
        """
        rng = self.rng
        if t_mev < E_TRACK_MEV or self.followed >= MAX_FOLLOWED:
            self.stubs.append((pos, d, t_mev, kind))
            return float(self._range(t_mev, kind))
        self.followed += 1
        positron = kind == "e+"
        current = self.physics.electron_stopping
        dedx = float(mat.electron_dedx(t_mev, None, positron))
        e, s = t_mev, 0.0
        em_s, em_k = [], []
        booked = [0.0]  # the collision loss booked up to the start and each emission
        while e > K_CUT_MEV + 1.0:
            dist = rng.exponential(1 / _brems_rate_per_cm(e))
            if e - dedx * dist < E_TRACK_MEV:
                break
            s += dist
            e -= dedx * dist
            booked.append(booked[-1] + dedx * dist)
            k = _brems_fraction(rng, K_CUT_MEV / e) * e
            em_s.append(s)
            em_k.append(k)
            e -= k
            if current:
                dedx = float(mat.electron_dedx(e, None, positron))
        r_end = float(self._range(e, kind))
        length = s + r_end
        n = max(1, int(np.ceil(length / STEP_CM)))
        ds = length / n
        grid = np.arange(n + 1) * ds
        em_s, em_k = np.array(em_s), np.array(em_k)
        emitted = np.concatenate([[0.0], np.cumsum(em_k)])[np.searchsorted(em_s, grid, "right")]
        collision = np.interp(grid, np.concatenate([[0.0], em_s]), booked) if current \
            else dedx * grid
        t = np.where(grid <= s, t_mev - collision - emitted,
                     electron_energy_at_range(np.maximum(length - grid, 0.0), current,
                                              positron))
        t[-1] = 0.0
        pts, _ = trajectory(pos, d, np.maximum(t, 0.0), mat.ME_MEV, ds, rng, chunk=16)
        de = -np.diff(t) - np.diff(emitted)
        ok = inside(pts)
        stop = len(pts) if ok.all() else int(np.argmin(ok)) + 1
        de = np.maximum(de[:stop - 1], 0.0)
        if len(de):
            self.deps.add_polyline(*deposit_restricted(pts[:stop], t[:stop], mat.ME_MEV, de,
                                                       rng, self.queue, kind))
        for si, k in zip(em_s, em_k, strict=True):
            i = min(int(si / ds), n - 1)
            if i + 1 < stop:
                dk = pts[i + 1] - pts[i]
                dk = dk / max(np.linalg.norm(dk), 1e-9)
                self.queue.append(("gamma", pts[i + 1].copy(), dk, k))
        if positron and stop == len(pts):
            self._annihilate(pts[-1])
        return float(min(length, stop * ds))

    def _annihilate(self, pos: np.ndarray) -> None:
        """A stopped e+ (sim4): two back-to-back 511 keV photons, each deposited where it
        first interacts (a point, as every photon below 1 MeV here), if inside."""
        if not self.physics.annihilation:
            return
        u = isotropic(self.rng)
        for d in (u, -u):
            p = pos + d * self.rng.exponential(ANNIHILATION_MFP_CM)
            if inside(p):
                self.deps.add_segments(p[None], p[None], np.array([mat.ME_MEV]))

    def photon(self, pos: np.ndarray, d: np.ndarray, k_mev: float) -> tuple[float, str]:
        """Transport one photon; returns (distance to first interaction, 'interact'|'exit')."""
        rng = self.rng
        first, how = None, "interact"
        while k_mev > 1.0:
            dist = rng.exponential(photon_mfp_cm(k_mev))
            pos = pos + d * dist
            first = dist if first is None else first
            if not inside(pos):
                return first, "exit" if first == dist else how
            if k_mev > PAIR_MIN_MEV:
                self._pair(pos, d, k_mev)
                return first, how
            te = k_mev * rng.random()  # Compton electron (flat approximation of Klein-Nishina)
            de = rotate(d, rng.uniform(0, 1.0), rng.uniform(0, 2 * np.pi))
            self.queue.append(("e-", pos, de, te))
            k_mev -= te
            d = rotate(d, rng.uniform(0.2, 1.5), rng.uniform(0, 2 * np.pi))
        # photo-absorption of what is left: a point deposit
        self.deps.add_segments(pos[None], pos[None], np.array([max(k_mev, 0.0)]))
        return (first or 0.0), how

    def _pair(self, pos, d, k_mev):
        rng = self.rng
        avail = k_mev - 2 * mat.ME_MEV
        while True:  # Bethe-Heitler high-energy sharing: 1 - 4/3 x(1-x)
            x = rng.random()
            if rng.random() <= 1 - (4 / 3) * x * (1 - x):
                break
        theta = mat.ME_MEV / max(k_mev, 1.0)
        phi = rng.uniform(0, 2 * np.pi)
        self.queue.append(("e-", pos, rotate(d, theta, phi), x * avail))
        self.queue.append(("e+", pos, rotate(d, theta, phi + np.pi), (1 - x) * avail))

    def flush(self) -> None:
        """Deposit the batched soft electrons as straight stubs of their CSDA range."""
        if not self.stubs:
            return
        p = np.array([s[0] for s in self.stubs])
        d = np.array([s[1] for s in self.stubs])
        t = np.array([s[2] for s in self.stubs])
        positron = np.array([s[3] == "e+" for s in self.stubs])
        stopping = self.physics.electron_stopping
        r = np.where(positron, electron_range_cm(t, stopping, True), electron_range_cm(t, stopping))
        # two segments per stub with a random bend: soft electrons scatter strongly
        bend = d + self.rng.normal(scale=0.5, size=d.shape)
        bend /= np.linalg.norm(bend, axis=1, keepdims=True)
        mid = p + d * (r / 2)[:, None]
        end = mid + bend * (r / 2)[:, None]
        self.deps.add_segments(np.concatenate([p, mid]), np.concatenate([mid, end]),
                               np.concatenate([0.4 * t, 0.6 * t]))
        for e in end[positron & inside(end)]:
            self._annihilate(e)
        self.stubs = []
