"""Muons, charged pions, kaons and protons: tracks, hadronic interactions, decays at rest.

The hadronic model is schematic but keeps what an image shows: an interaction ends the
track in a kink (quasi-elastic), a few prongs (inelastic: leading hadron, extra pions,
short heavily-ionising protons, sometimes a pi0 whose photons shower) or protons only
(pion absorption). Stopped particles decay at rest, and K+/pi+ also decay in flight
(PDG lifetimes), with PDG branching ratios.

A fast stand-in for Geant4/LArSoft: interaction lengths and decays follow published
numbers (sources beside them); the final-state mix is :class:`HadronicParameters`,
labelled as assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lartpc.sim import materials as mat
from lartpc.sim.tracks import Track, heavy_track, isotropic, rotate

MASS = {"mu+": mat.MASS_MEV["mu"], "mu-": mat.MASS_MEV["mu"], "pi+": mat.MASS_MEV["pi"],
        "pi-": mat.MASS_MEV["pi"], "K+": mat.MASS_MEV["K"], "p": mat.MASS_MEV["p"],
        "pi0": mat.MASS_MEV["pi0"], "e+": mat.ME_MEV, "nu": 0.0}
LAMBDA_CM = {"pi+": mat.LAMBDA_INT_PION_CM, "pi-": mat.LAMBDA_INT_PION_CM,
             "K+": mat.LAMBDA_INT_KAON_CM, "p": mat.LAMBDA_INT_PROTON_CM}
# Decay modes with PDG branching fractions; the kinematics (two-body, or three-body
# phase space without matrix elements or form factors) follow from the masses, so the
# Q values are Ke3 358.2, Kmu3 253.0, K -> 3 pi 75.0 and K -> pi 2pi0 84.2 MeV.
DECAYS = {
    "K+": (("munu", 0.6356, ("mu+", "nu")), ("pipi0", 0.2067, ("pi+", "pi0")),
           ("3pi", 0.0558, ("pi+", "pi+", "pi-")), ("ke3", 0.0507, ("pi0", "e+", "nu")),
           ("kmu3", 0.0335, ("pi0", "mu+", "nu")), ("pi2pi0", 0.0176, ("pi+", "pi0", "pi0"))),
    "pi+": (("munu", 1.0, ("mu+", "nu")),),
}
#: kinetic energy a proton needs to make a pion on a nucleon at rest (N N -> N N pi0:
#: 2 m_pi + m_pi^2 / 2 M = 280 MeV); below it a proton's interaction makes nucleons only
PION_THRESHOLD_MEV = 2 * mat.MASS_MEV["pi0"] + mat.MASS_MEV["pi0"] ** 2 / (2 * mat.MASS_MEV["p"])
P_MU_KMU2 = 235.5  # MeV/c, muon momentum in K+ -> mu+ nu at rest
P_MU_PIMU2 = 29.79  # MeV/c, muon momentum in pi+ -> mu+ nu at rest (T = 4.1 MeV)


@dataclass(frozen=True, slots=True)
class HadronicParameters:
    """Final states of pi+/K+ (and, from sim4, proton) argon interactions: ASSUMED
    PARAMETERS, not measurements.

    Nothing here is fitted to data (Geant4's cascade models or LArIAT/ProtoDUNE-SP
    exclusive cross sections would be the place to take them from); they keep what an
    image shows: kinks, prongs, short protons and pi0 showers.
    """

    # interaction type probabilities: quasi-elastic, charge exchange, absorption, else
    # inelastic (pion absorption matters mostly below ~0.5 GeV, taken flat here)
    pion_mix: tuple[float, float, float] = (0.25, 0.10, 0.10)
    kaon_mix: tuple[float, float, float] = (0.40, 0.12, 0.0)
    # quasi-elastic scattering on one nucleon: d sigma / dt ~ exp(-b |t|). b is the
    # diffraction slope of pi p elastic scattering at a few GeV/c, ~7-8 GeV^-2 (Foley et
    # al., Phys. Rev. Lett. 11 (1963) 425 and 15 (1965) 45; PDG's compilation of
    # elastic slopes); taken for K+ too (assumed). At 3 GeV/c the median kink is
    # sqrt(ln 2 / b) / p ~ 5.5 degrees (5.8 measured with
    # the exact kinematics) and the nucleon recoils with |t| / 2M ~ 50 MeV.
    qe_t_slope_gev2: float = 7.5
    qe_knockout_proton: float = 0.6  # the struck nucleon is a (visible) proton
    inel_lead_share: tuple[float, float] = (0.2, 0.7)  # leading hadron's share of T
    inel_kaon_keeps_lead: float = 0.6  # else a K0 carries it away unseen
    inel_visible_share: tuple[float, float] = (0.4, 0.8)  # of the rest; neutrons take the remainder
    inel_mean_extra_pions: float = 0.7
    inel_mean_extra_protons: float = 1.2
    inel_pi0_probability: float = 0.4
    # protons (sim4): quasi-elastic share (a kink and a recoil nucleon), else nucleons
    # knocked out, the leading one a proton this often (else an unseen neutron); pions
    # only above PION_THRESHOLD_MEV, each paying its mass
    nucleon_qe: float = 0.4
    nucleon_lead_proton: float = 0.5


HADRONIC = HadronicParameters()


def michel_energy(rng: np.random.Generator) -> float:
    """Positron energy from muon decay at rest, dN/dx ~ x^2 (3 - 2x), x = E / 52.8 MeV."""
    while True:
        x = rng.random()
        if rng.random() <= x * x * (3 - 2 * x):
            return x * mat.MICHEL_ENDPOINT_MEV


def decay_distance_cm(rng: np.random.Generator, kind: str, t_mev: float) -> float:
    """Path length after which a K+/pi+ of kinetic energy ``t_mev`` decays in flight
    (inf if it stops first or does not decay): a proper length drawn from c tau,
    converted along the slowing-down track (d(proper length) = ds / beta gamma)."""
    ctau = mat.CTAU_CM.get(kind)
    if ctau is None:
        return np.inf
    target = rng.exponential(ctau)
    m = MASS[kind]
    r0 = float(mat.csda_range_cm(t_mev, m))
    s = np.linspace(0.0, r0, 257)
    mid = 0.5 * (s[1:] + s[:-1])
    bg = mat.momentum(mat.energy_at_range(r0 - mid, m), m) / m
    proper = np.concatenate([[0.0], np.cumsum(np.diff(s) / np.maximum(bg, 1e-3))])
    return float(np.interp(target, proper, s)) if target < proper[-1] else np.inf


def hadron(ctx, kind: str, pos, d, t_mev: float) -> Track:
    """Transport one heavy charged particle; secondaries go to ``ctx.queue``."""
    rng = ctx.rng
    lam = LAMBDA_CM.get(kind)
    s_int = rng.exponential(lam) if lam else np.inf
    s_dec = decay_distance_cm(rng, kind, t_mev)
    tr = heavy_track(pos, d, t_mev, MASS[kind], rng, ctx.deps, ctx.queue,
                     max_len_cm=min(s_int, s_dec))
    end = tr.points[-1].copy()
    if tr.end == "interact":
        t_end = float(tr.t_mev[-1])
        if s_dec < s_int:
            tr.end = "decay"
            decay(ctx, kind, end, tr.direction * float(mat.momentum(t_end, MASS[kind])))
        elif t_end > 5.0 and ctx.hadronic_budget > 0:
            ctx.hadronic_budget -= 1
            _interact(ctx, kind, end, tr.direction, t_end)
    elif tr.end == "stop":
        _decay_at_rest(ctx, kind, end)
        if kind != "p":
            tr.end = "decay"
    return tr


def _dirichlet_split(rng, total: float, n: int) -> np.ndarray:
    return total * rng.dirichlet(np.ones(n) * 1.5)


def _forward(rng, d, scale: float) -> np.ndarray:
    return rotate(d, min(abs(rng.normal(0, scale)), np.pi), rng.uniform(0, 2 * np.pi))


def _emit_protons(ctx, pos, d, energy: float, n: int) -> None:
    rng = ctx.rng
    for t in _dirichlet_split(rng, energy, n):
        if t > 2.0:  # below ~2 MeV a proton range is < 0.1 mm: a point deposit
            ctx.queue.append(("p", pos, _forward(rng, d, 1.0), float(min(t, 400.0))))
        else:
            ctx.deps.add_segments(pos[None], pos[None], np.array([t]))


def quasi_elastic(rng: np.random.Generator, m_mev: float, t_mev: float, d: np.ndarray,
                  slope_gev2: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Elastic scattering of a hadron (mass ``m_mev``, kinetic ``t_mev``, direction
    ``d``) on a nucleon at rest, |t| drawn from exp(-b |t|) (``slope_gev2`` = b).

    Returns
    -------
    (kinetic energy kept, new unit direction, recoil nucleon momentum vector MeV/c).
    Exact two-body kinematics: the nucleon takes |t| / 2M, and
    cos theta = (E E' - m^2 - |t| / 2) / (p p').
    """
    mn = mat.MASS_MEV["p"]
    e = t_mev + m_mev
    p = float(mat.momentum(t_mev, m_mev))
    s = m_mev**2 + mn**2 + 2 * e * mn
    t_kin = 4 * p**2 * mn**2 / s  # |t| max: backward scattering in the c.m.
    u = rng.random() * -np.expm1(-slope_gev2 * t_kin * 1e-6)
    q2 = min(-np.log1p(-u) / slope_gev2 * 1e6, t_kin)  # MeV^2
    e2 = e - q2 / (2 * mn)
    p2 = float(np.sqrt(max(e2**2 - m_mev**2, 0.0)))
    cos = np.clip((e * e2 - m_mev**2 - q2 / 2) / max(p * p2, 1e-9), -1.0, 1.0)
    d2 = rotate(d, float(np.arccos(cos)), rng.uniform(0, 2 * np.pi))
    return float(e2 - m_mev), d2, p * d - p2 * d2


def _interact(ctx, kind: str, pos, d, t: float) -> None:
    if kind == "p" and ctx.physics.nucleon_interactions:
        _interact_nucleon(ctx, pos, d, t)
        return
    rng, par = ctx.rng, HADRONIC
    is_kaon = kind == "K+"
    qe, cex, absorb = par.kaon_mix if is_kaon else par.pion_mix
    r = rng.random()
    if r < qe:
        _quasi_elastic(ctx, kind, pos, d, t)
        return
    if r < qe + cex:
        # charge exchange: K+ n -> K0 p (K0 unseen), pi+ n -> pi0 p
        if is_kaon:
            _emit_protons(ctx, pos, d, min(0.3 * t, 200.0), 1)
        else:
            pi0(ctx, pos, d, 0.9 * t)
        return
    if r < qe + cex + absorb:
        # pion absorption on a nucleon cluster: protons only
        _emit_protons(ctx, pos, d, min(0.5 * t, 400.0), int(rng.integers(2, 5)))
        return
    # inelastic: leading hadron, extra pions, protons, sometimes a pi0
    lead = t * rng.uniform(*par.inel_lead_share)
    lead_kind = kind if not is_kaon or rng.random() < par.inel_kaon_keeps_lead else None
    if lead_kind:
        ctx.queue.append((lead_kind, pos, _forward(rng, d, 0.35), lead))
    rest = (t - lead) * rng.uniform(*par.inel_visible_share)
    n_pi = int(rng.poisson(par.inel_mean_extra_pions))
    n_p = 1 + int(rng.poisson(par.inel_mean_extra_protons))
    has_pi0 = rng.random() < par.inel_pi0_probability
    shares = _dirichlet_split(rng, rest, n_pi + 2)
    for i in range(n_pi):
        if shares[i] > 5.0:
            ctx.queue.append(("pi+" if rng.random() < 0.6 else "pi-", pos, _forward(rng, d, 0.8),
                              float(shares[i])))
    _emit_protons(ctx, pos, d, min(shares[n_pi], 150.0 * n_p), n_p)
    if has_pi0 and shares[n_pi + 1] > 10:
        pi0(ctx, pos, _forward(rng, d, 0.6), float(shares[n_pi + 1]))


def _quasi_elastic(ctx, kind: str, pos, d, t: float) -> None:
    """The same hadron continues at an angle (a kink); the struck nucleon recoils."""
    rng, par = ctx.rng, HADRONIC
    t2, d2, p_n = quasi_elastic(rng, MASS[kind], t, d, par.qe_t_slope_gev2)
    ctx.queue.append((kind, pos, d2, t2))
    t_n = t - t2
    if rng.random() < par.qe_knockout_proton:
        if t_n > 2.0:  # below ~2 MeV a proton range is < 0.1 mm: a point deposit
            ctx.queue.append(("p", pos, p_n / np.linalg.norm(p_n), float(t_n)))
        else:
            ctx.deps.add_segments(pos[None], pos[None], np.array([t_n]))


def _interact_nucleon(ctx, pos, d, t: float) -> None:
    """A proton's interaction (sim4): a kink, or nucleons knocked out; pions (charged, or a
    pi0 whose photons shower) only above :data:`PION_THRESHOLD_MEV`, each taking its
    mass out of the energy shared. Never more energy out than in."""
    rng, par = ctx.rng, HADRONIC
    if rng.random() < par.nucleon_qe:
        _quasi_elastic(ctx, "p", pos, d, t)
        return
    lead = t * rng.uniform(*par.inel_lead_share)
    if rng.random() < par.nucleon_lead_proton:
        ctx.queue.append(("p", pos, _forward(rng, d, 0.35), lead))
    rest = (t - lead) * rng.uniform(*par.inel_visible_share)
    n_pi, has_pi0 = 0, False
    if t > PION_THRESHOLD_MEV:
        n_pi = int(rng.poisson(par.inel_mean_extra_pions))
        has_pi0 = rng.random() < par.inel_pi0_probability
    m_pi, m_pi0 = mat.MASS_MEV["pi"], mat.MASS_MEV["pi0"]
    while n_pi and n_pi * m_pi + has_pi0 * m_pi0 > rest:  # what the energy allows
        n_pi -= 1
    if has_pi0 and m_pi0 > rest:
        has_pi0 = False
    kinetic = rest - n_pi * m_pi - has_pi0 * m_pi0
    shares = _dirichlet_split(rng, kinetic, n_pi + 2)
    for i in range(n_pi):
        ctx.queue.append(("pi+" if rng.random() < 0.5 else "pi-", pos, _forward(rng, d, 0.8),
                          float(shares[i])))
    n_p = 1 + int(rng.poisson(par.inel_mean_extra_protons))
    _emit_protons(ctx, pos, d, shares[n_pi] + (0.0 if has_pi0 else shares[n_pi + 1]), n_p)
    if has_pi0:
        pi0(ctx, pos, _forward(rng, d, 0.6), float(shares[n_pi + 1]))


def pi0(ctx, pos, d, t_mev: float) -> None:
    """pi0 -> gamma gamma (isotropic in the rest frame, boosted)."""
    m = mat.MASS_MEV["pi0"]
    for p4 in _two_body(ctx.rng, m, d * mat.momentum(t_mev, m), 0.0, 0.0):
        ctx.queue.append(("gamma", pos, p4[1:] / np.linalg.norm(p4[1:]), float(p4[0])))


def _two_body(rng, m_parent, p_parent, m1, m2) -> list[np.ndarray]:
    """Lab four-vectors (E, px, py, pz) of a two-body decay, isotropic in the rest frame."""
    p = ((m_parent**2 - (m1 + m2) ** 2) * (m_parent**2 - (m1 - m2) ** 2)) ** 0.5 / (2 * m_parent)
    u = isotropic(rng)
    out = []
    e_par = np.sqrt(m_parent**2 + p_parent @ p_parent)
    b = p_parent / e_par
    b2 = b @ b
    g = 1 / np.sqrt(1 - b2)
    for m, sgn in ((m1, 1), (m2, -1)):
        pv = sgn * p * u
        e = np.sqrt(m * m + p * p)
        bp = b @ pv
        g2 = (g - 1) / b2 if b2 > 0 else 0.0
        out.append(np.concatenate([[g * (e + bp)], pv + (g2 * bp + g * e) * b]))
    return out


def _pstar(m: float, a: float, b: float) -> float:
    """Momentum of the daughters of a two-body decay m -> a b at rest."""
    return max((m * m - (a + b) ** 2) * (m * m - (a - b) ** 2), 0.0) ** 0.5 / (2 * m)


@lru_cache(maxsize=16)
def _m23_weight_max(m: float, m1: float, m2: float, m3: float) -> float:
    grid = np.linspace(m2 + m3, m - m1, 129)
    return 1.05 * max(_pstar(m, m1, x) * _pstar(x, m2, m3) for x in grid)


def three_body(rng: np.random.Generator, m: float, p_parent: np.ndarray, m1: float,
               m2: float, m3: float) -> list[np.ndarray]:
    """Lab four-vectors of m -> 1 2 3 distributed by phase space (no matrix element).

    The (23) mass is drawn with weight p*(1) p*(2 in 23), then two chained two-body decays.
    """
    wmax = _m23_weight_max(m, m1, m2, m3)
    while True:
        m23 = rng.uniform(m2 + m3, m - m1)
        if rng.random() * wmax <= _pstar(m, m1, m23) * _pstar(m23, m2, m3):
            break
    p1, p23 = _two_body(rng, m, p_parent, m1, m23)
    return [p1, *_two_body(rng, m23, p23[1:], m2, m3)]


def decay(ctx, kind: str, pos, p_parent: np.ndarray) -> None:
    """Decay ``kind`` (K+ or pi+) with lab momentum ``p_parent`` (zeros: at rest)."""
    rng = ctx.rng
    modes = DECAYS[kind]
    br = np.array([b for _, b, _ in modes])
    _, _, products = modes[rng.choice(len(modes), p=br / br.sum())]
    masses = [MASS[k] for k in products]
    fn = _two_body if len(products) == 2 else three_body
    for k, p4 in zip(products, fn(rng, MASS[kind], np.asarray(p_parent, float), *masses),
                     strict=True):
        _emit(ctx, k, pos, p4)


def _emit(ctx, kind: str, pos, p4: np.ndarray) -> None:
    if kind == "nu":
        return
    p = float(np.sqrt(p4[1:] @ p4[1:]))
    d = p4[1:] / p if p > 0 else isotropic(ctx.rng)
    t = float(p4[0]) - MASS[kind]
    if kind == "pi0":
        pi0(ctx, pos, d, max(t, 0.0))
    elif t > 0.05:
        ctx.queue.append((kind, pos, d, t))


def _decay_at_rest(ctx, kind: str, pos) -> None:
    rng = ctx.rng
    if kind == "mu+" or (kind == "mu-" and rng.random() < 0.25):  # mu- is mostly captured
        t = michel_energy(rng) - mat.ME_MEV
        if t > 0.05:
            ctx.queue.append(("e+" if kind == "mu+" else "e-", pos, isotropic(rng), float(t)))
    elif kind in DECAYS:
        decay(ctx, kind, pos, np.zeros(3))
    elif kind == "pi-":  # nuclear capture: a small star of protons
        _emit_protons(ctx, pos, isotropic(rng), rng.uniform(20, 60), int(rng.integers(1, 3)))
