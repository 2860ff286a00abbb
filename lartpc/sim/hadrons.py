"""Muons, charged pions, kaons and protons: tracks, hadronic interactions, decays at rest.

The hadronic model is schematic but keeps what an image shows: an interaction ends the
track in a kink (quasi-elastic), a few prongs (inelastic: leading hadron, extra pions,
short heavily-ionising protons, sometimes a pi0 whose photons shower) or protons only
(pion absorption). Stopped particles decay at rest with PDG branching ratios.
"""

from __future__ import annotations

import numpy as np

from lartpc.sim import materials as mat
from lartpc.sim.tracks import Track, heavy_track, isotropic, rotate

MASS = {"mu+": mat.MASS_MEV["mu"], "mu-": mat.MASS_MEV["mu"], "pi+": mat.MASS_MEV["pi"],
        "pi-": mat.MASS_MEV["pi"], "K+": mat.MASS_MEV["K"], "p": mat.MASS_MEV["p"]}
LAMBDA_CM = {"pi+": mat.LAMBDA_INT_PION_CM, "pi-": mat.LAMBDA_INT_PION_CM,
             "K+": mat.LAMBDA_INT_KAON_CM, "p": mat.LAMBDA_INT_PROTON_CM}
# K+ decays (PDG): mu nu, pi pi0, pi pi pi, pi0 e nu, pi0 mu nu, pi pi0 pi0
K_MODES = ("munu", "pipi0", "3pi", "ke3", "kmu3", "pi2pi0")
K_BR = np.array([0.6356, 0.2067, 0.0558, 0.0507, 0.0335, 0.0176])
P_MU_KMU2 = 235.5  # MeV/c, muon momentum in K+ -> mu+ nu at rest
P_MU_PIMU2 = 29.79  # MeV/c, muon momentum in pi+ -> mu+ nu at rest (T = 4.1 MeV)


def michel_energy(rng: np.random.Generator) -> float:
    """Positron energy from muon decay at rest, dN/dx ~ x^2 (3 - 2x), x = E / 52.8 MeV."""
    while True:
        x = rng.random()
        if rng.random() <= x * x * (3 - 2 * x):
            return x * mat.MICHEL_ENDPOINT_MEV


def hadron(ctx, kind: str, pos, d, t_mev: float) -> Track:
    """Transport one heavy charged particle; secondaries go to ``ctx.queue``."""
    rng = ctx.rng
    lam = LAMBDA_CM.get(kind)
    max_len = rng.exponential(lam) if lam else np.inf
    tr = heavy_track(pos, d, t_mev, MASS[kind], rng, ctx.deps, ctx.queue, max_len_cm=max_len)
    end = tr.points[-1].copy()
    if tr.end == "interact":
        t_end = float(tr.t_mev[-1])
        if t_end > 5.0 and ctx.hadronic_budget > 0:
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


def _interact(ctx, kind: str, pos, d, t: float) -> None:
    rng = ctx.rng
    r = rng.random()
    is_kaon = kind == "K+"
    if r < (0.40 if is_kaon else 0.25):
        # quasi-elastic: the same hadron continues at an angle (a kink), maybe a knock-out p
        t2 = t * rng.uniform(0.6, 0.97)
        ctx.queue.append((kind, pos, _forward(rng, d, 0.5), t2))
        if rng.random() < 0.6:
            _emit_protons(ctx, pos, d, min(t - t2, 250.0) * rng.uniform(0.3, 0.9), 1)
        return
    if r < (0.52 if is_kaon else 0.35):
        # charge exchange: K+ n -> K0 p (K0 unseen), pi+ n -> pi0 p
        if is_kaon:
            _emit_protons(ctx, pos, d, min(0.3 * t, 200.0), 1)
        else:
            pi0(ctx, pos, d, 0.9 * t)
        return
    if not is_kaon and r < 0.45:
        # pion absorption on a nucleon cluster: protons only
        _emit_protons(ctx, pos, d, min(0.5 * t, 400.0), int(rng.integers(2, 5)))
        return
    # inelastic: leading hadron, extra pions, protons, sometimes a pi0
    lead = t * rng.uniform(0.2, 0.7)
    lead_kind = kind if not is_kaon or rng.random() < 0.6 else None  # K0 carries it away
    if lead_kind:
        ctx.queue.append((lead_kind, pos, _forward(rng, d, 0.35), lead))
    rest = (t - lead) * rng.uniform(0.4, 0.8)  # the rest: neutrons, binding, nuclear excitation
    n_pi = int(rng.poisson(0.7))
    n_p = 1 + int(rng.poisson(1.2))
    has_pi0 = rng.random() < 0.4
    shares = _dirichlet_split(rng, rest, n_pi + 2)
    for i in range(n_pi):
        if shares[i] > 5.0:
            ctx.queue.append(("pi+" if rng.random() < 0.6 else "pi-", pos, _forward(rng, d, 0.8),
                              float(shares[i])))
    _emit_protons(ctx, pos, d, min(shares[n_pi], 150.0 * n_p), n_p)
    if has_pi0 and shares[n_pi + 1] > 10:
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


def _at_rest(ctx, kind: str, pos, t_mev: float, d=None) -> None:
    d = isotropic(ctx.rng) if d is None else d
    if t_mev > 0.05:
        ctx.queue.append((kind, pos, d, float(t_mev)))


def _decay_at_rest(ctx, kind: str, pos) -> None:
    rng = ctx.rng
    mmu, mpi = mat.MASS_MEV["mu"], mat.MASS_MEV["pi"]
    if kind == "mu+" or (kind == "mu-" and rng.random() < 0.25):  # mu- is mostly captured
        _at_rest(ctx, "e+" if kind == "mu+" else "e-", pos, michel_energy(rng) - mat.ME_MEV)
    elif kind == "pi+":
        _at_rest(ctx, "mu+", pos, float(mat.kinetic(P_MU_PIMU2, mmu)))
    elif kind == "pi-":  # nuclear capture: a small star of protons
        _emit_protons(ctx, pos, isotropic(rng), rng.uniform(20, 60), int(rng.integers(1, 3)))
    elif kind == "K+":
        mode = K_MODES[rng.choice(len(K_MODES), p=K_BR / K_BR.sum())]
        d = isotropic(rng)
        if mode == "munu":
            _at_rest(ctx, "mu+", pos, float(mat.kinetic(P_MU_KMU2, mmu)), d)
        elif mode == "pipi0":
            p = 205.14  # MeV/c
            _at_rest(ctx, "pi+", pos, float(mat.kinetic(p, mpi)), d)
            pi0(ctx, pos, -d, float(mat.kinetic(p, mat.MASS_MEV["pi0"])))
        else:  # three-body modes: share the kinetic energy, no neutrino tracking needed
            q = mat.MASS_MEV["K"] - 3 * mpi
            t = _dirichlet_split(rng, q, 3)
            kinds = {"3pi": ("pi+", "pi+", "pi-"), "pi2pi0": ("pi+", "pi0", "pi0"),
                     "ke3": ("e+", "pi0", None), "kmu3": ("mu+", "pi0", None)}[mode]
            for k, ti in zip(kinds, t, strict=True):
                if k == "pi0":
                    pi0(ctx, pos, isotropic(rng), float(ti))
                elif k:
                    _at_rest(ctx, k, pos, float(ti))
