"""Liquid-argon constants and stopping power (Bethe-Bloch with the density effect).

Numbers are the PDG "Atomic and nuclear properties" entry for liquid argon unless noted.
Range tables are built once per particle mass by integrating 1/(dE/dx) (CSDA), so
tracks can be stepped with vectorised look-ups instead of a Python loop per step.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

DENSITY_G_CM3 = 1.396
Z_OVER_A = 18.0 / 39.948
I_EV = 188.0  # PDG's value for LAr; Strait (2022) argues 197 eV, a 0.5 % effect on dE/dx
X0_CM = 14.0
MOLIERE_CM = 9.04
CRITICAL_MEV = 32.84
W_EV = 23.6  # energy per ionisation electron
K_MEV_CM2_MOL = 0.307075
ME_MEV = 0.51099895
# Sternheimer density-effect parameters for liquid argon (PDG table)
_C_BAR, _X0_D, _X1_D, _A_D, _K_D = 5.2146, 0.2, 3.0, 0.19559, 3.0
# Hadronic interaction lengths (inelastic), taken as energy independent above ~1 GeV.
# Nucleons: PDG "Atomic and nuclear properties", liquid argon, nuclear interaction
# length 119.7 g/cm2 = 85.8 cm (the SPEC's 86 cm). Pions: the PDG pion interaction
# length is ~1.25x the nucleon one (pi-N cross sections ~25 mb vs N-N ~40 mb at a few
# GeV), ~150 g/cm2 = 107 cm, i.e. sigma_inel(pi+ Ar) ~ 0.45 b; LArIAT's pi-Ar
# cross-section measurements are at lower energy (< 1 GeV) and are not used here.
LAMBDA_INT_PION_CM = 107.0
# Kaons: PARAMETER, not a measurement. K+ N ~ 17.5 mb vs pi+ N ~ 25 mb at a few GeV
# (PDG cross-section plots); scaled to argon as sqrt of that ratio (nuclear shadowing
# weakens the dependence), 107 * sqrt(25 / 17.5) = 128 cm.
LAMBDA_INT_KAON_CM = 128.0
LAMBDA_INT_PROTON_CM = 84.0
# Decay in flight (PDG): c tau of K+ 371.2 cm, pi+ 780.45 cm (muons: 659 m, ignored)
CTAU_CM = {"K+": 371.2, "pi+": 780.45}

MASS_MEV = {
    "e": ME_MEV, "mu": 105.6583755, "pi": 139.57039, "K": 493.677, "p": 938.27208,
    "pi0": 134.9768,
}
PDG_CODE = {"gamma": 22, "e-": 11, "e+": -11, "mu+": -13, "mu-": 13, "pi+": 211,
            "pi-": -211, "K+": 321, "p": 2212, "pi0": 111}
MICHEL_ENDPOINT_MEV = 52.83  # (m_mu^2 + m_e^2) / (2 m_mu)


def density_effect(bg: np.ndarray) -> np.ndarray:
    """Sternheimer density-effect correction delta(beta*gamma) for LAr."""
    x = np.log10(np.maximum(bg, 1e-6))
    d = 2 * np.log(10) * x - _C_BAR
    mid = (x >= _X0_D) & (x < _X1_D)
    d = np.where(mid, d + _A_D * (_X1_D - x) ** _K_D, d)
    return np.where(x < _X0_D, 0.0, d)


def bethe_dedx(t_mev: np.ndarray | float, mass_mev: float) -> np.ndarray:
    """Mean electronic stopping power (MeV/cm) of a singly charged heavy particle.

    Parameters
    ----------
    t_mev : kinetic energy.
    mass_mev : particle mass (muon, pion, kaon, proton).
    """
    t = np.maximum(np.asarray(t_mev, float), 1e-3)
    gamma = 1 + t / mass_mev
    bg2 = gamma**2 - 1
    beta2 = bg2 / gamma**2
    ratio = ME_MEV / mass_mev
    tmax = 2 * ME_MEV * bg2 / (1 + 2 * gamma * ratio + ratio**2)
    i_mev = I_EV * 1e-6
    log_term = 0.5 * np.log(2 * ME_MEV * bg2 * tmax / i_mev**2)
    val = K_MEV_CM2_MOL * Z_OVER_A / beta2 * (log_term - beta2 - density_effect(np.sqrt(bg2)) / 2)
    # Bethe-Bloch fails below beta*gamma ~ 0.05 (shell corrections); a smooth floor keeps
    # the residual range of the last millimetre finite without pretending to precision.
    return np.maximum(val, 1.0) * DENSITY_G_CM3


def electron_restricted_dedx(t_mev: np.ndarray | float, cut_mev: float,
                             positron: bool = False) -> np.ndarray:
    """Restricted collision stopping power (MeV/cm) of e- (Moller) or e+ (Bhabha).

    Energy transfers below ``cut_mev`` only, with the density effect: the
    Berger-Seltzer formulas (ICRU Report 37, 1984) as Geant4's G4MollerBhabhaModel
    evaluates them. On the Fermi plateau (GeV electrons, 3 MeV cut) this is
    ~2.1-2.2 MeV/cm, the restricted loss the PDG formula gives for any fast singly
    charged particle there.
    """
    tau = np.maximum(np.asarray(t_mev, float), 1e-3) / ME_MEV
    gam = tau + 1
    beta2 = tau * (tau + 2) / gam**2
    eexc2 = (I_EV * 1e-6 / ME_MEV) ** 2
    if positron:
        d = np.minimum(cut_mev / ME_MEV, tau)
        d2 = d * d * 0.5
        d3 = d2 * d / 1.5
        d4 = d3 * d * 0.75
        y = 1 / (1 + gam)
        val = (np.log(2 * (tau + 2) / eexc2) + np.log(tau * d)
               - beta2 * (tau + 2 * d - y * (3 * d2 + y * (d - d3 + y * (d2 - tau * d3 + d4))))
               / tau)
    else:
        d = np.minimum(cut_mev / ME_MEV, 0.5 * tau)
        val = (np.log(2 * (tau + 2) / eexc2) - 1 - beta2 + np.log((tau - d) * d)
               + tau / (tau - d) + (0.5 * d * d + (2 * tau + 1) * np.log(1 - d / tau)) / gam**2)
    val = val - density_effect(np.sqrt(tau * (tau + 2)))
    return np.maximum(0.5 * K_MEV_CM2_MOL * Z_OVER_A * DENSITY_G_CM3 * val / beta2, 0.0)


@lru_cache(maxsize=8)
def _electron_table(cut_mev: float | None, positron: bool) -> tuple[np.ndarray, np.ndarray]:
    t = np.geomspace(0.05, 50_000.0, 600)
    return np.log(t), electron_restricted_dedx(t, t if cut_mev is None else cut_mev, positron)


def electron_dedx(t_mev: np.ndarray | float, cut_mev: float | None = None,
                  positron: bool = False) -> np.ndarray:
    """:func:`electron_restricted_dedx` from a cached table (``cut_mev`` None: the total
    collision stopping power, every transfer allowed)."""
    lt, val = _electron_table(cut_mev, positron)
    return np.interp(np.log(np.maximum(t_mev, 0.05)), lt, val)


def _range_from(t: np.ndarray, dedx: np.ndarray) -> np.ndarray:
    """CSDA ranges (cm) on the energy grid ``t`` from the stopping powers ``dedx`` there;
    below the grid's lowest energy dE/dx is taken as constant."""
    inv = 1.0 / dedx
    r0 = t[0] * inv[0]
    return r0 + np.concatenate([[0.0], np.cumsum(0.5 * (inv[1:] + inv[:-1]) * np.diff(t))])


@lru_cache(maxsize=8)
def range_table(mass_mev: float) -> tuple[np.ndarray, np.ndarray]:
    """(kinetic energy grid in MeV, CSDA range in cm), log-spaced 0.01 MeV .. 20 GeV."""
    t = np.geomspace(0.01, 20_000.0, 1200)
    return t, _range_from(t, bethe_dedx(t, mass_mev))


@lru_cache(maxsize=2)
def electron_range_table(positron: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(kinetic energy grid in MeV, CSDA range in cm) of an e- (``positron``: e+) from its
    total collision stopping power (:func:`electron_dedx`, every transfer allowed); the
    radiative loss is apart (the cascade emits it as photons). 8 MeV: 3.9 cm."""
    t = np.geomspace(0.01, 50_000.0, 1200)
    return t, _range_from(t, electron_dedx(t, None, positron))


def range_of(t_mev: np.ndarray | float, table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """CSDA range (cm) at kinetic energy ``t_mev`` from a (energies, ranges) ``table``."""
    t, r = table
    return np.interp(np.log(np.maximum(t_mev, t[0])), np.log(t), r)


def energy_of(r_cm: np.ndarray | float, table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Kinetic energy (MeV) at residual range ``r_cm`` from a (energies, ranges) ``table``
    (the inverse of :func:`range_of`)."""
    t, r = table
    r_cm = np.asarray(r_cm, float)
    out = np.exp(np.interp(r_cm, r, np.log(t)))
    return np.where(r_cm <= r[0], t[0] * np.clip(r_cm / r[0], 0, 1), out)


def csda_range_cm(t_mev: np.ndarray | float, mass_mev: float) -> np.ndarray:
    """CSDA range (cm) of a particle of kinetic energy ``t_mev``."""
    return range_of(t_mev, range_table(mass_mev))


def energy_at_range(r_cm: np.ndarray | float, mass_mev: float) -> np.ndarray:
    """Kinetic energy (MeV) of a particle with residual range ``r_cm`` (inverse of range)."""
    return energy_of(r_cm, range_table(mass_mev))


def momentum(t_mev, mass_mev):
    """Momentum (MeV/c) of kinetic energy ``t_mev``."""
    return np.sqrt(np.asarray(t_mev) * (np.asarray(t_mev) + 2 * mass_mev))


def kinetic(p_mev, mass_mev):
    """Kinetic energy (MeV) of momentum ``p_mev``."""
    return np.sqrt(np.asarray(p_mev) ** 2 + mass_mev**2) - mass_mev


def highland_theta0(p_mev, beta, step_cm):
    """Highland RMS plane scattering angle (rad) over ``step_cm`` of LAr."""
    x = np.maximum(step_cm / X0_CM, 1e-9)
    return 13.6 / (beta * p_mev) * np.sqrt(x) * (1 + 0.038 * np.log(x / beta**2))
