"""Generator physics against published numbers (PDG liquid-argon tables)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lartpc.geometry import Geometry
from lartpc.sim import materials as mat
from lartpc.sim.hadrons import michel_energy
from lartpc.sim.readout import ReadoutConfig, digitise
from lartpc.sim.showers import Cascade
from lartpc.sim.tracks import Deposits, trajectory
from lartpc.sim.transport import transport

MU = mat.MASS_MEV["mu"]


def test_minimum_ionising_dedx():
    # PDG liquid argon: <dE/dx>_min = 1.508 MeV cm2/g (at beta*gamma ~ 3.5)
    # x 1.396 g/cm3 = 2.105 MeV/cm. 1.5 % covers I = 188 eV vs the PDG table's
    # treatment of shell corrections; the minimum's position is checked too.
    bg = np.geomspace(1, 20, 400)
    t = (np.sqrt(1 + bg**2) - 1) * MU
    dedx = mat.bethe_dedx(t, MU)
    assert dedx.min() == pytest.approx(1.508 * 1.396, rel=0.015)
    assert 3.0 < bg[np.argmin(dedx)] < 4.0


def test_simulated_muon_track_is_minimum_ionising():
    # energy deposited per cm by a 3 GeV muon crossing the detector (restricted loss with
    # fluctuations + delta rays): the 2.1 MeV/cm minimum plus the relativistic rise
    # (Bethe 2.53 MeV/cm at 3 GeV/c), less delta energy that escapes. The median of 8
    # tracks: one 10 m track varies by +-10 % with its few deltas of 50-700 MeV.
    per_cm = []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        deps, length, end = transport("mu+", np.array([128.0, 0, 10]), np.array([0, 0, 1.0]),
                                      3000.0, rng)
        assert end == "exit"
        per_cm.append(deps.arrays()[2].sum() / length)
    assert 2.0 < np.median(per_cm) < 2.6


# PDG muon table for liquid argon (muonloss_289, Groom, Mokhov & Striganov 2001):
# kinetic energy (MeV) -> CSDA range (g/cm2), divided by 1.396 g/cm3 for cm.
PDG_MUON_CSDA = {100: 42.50, 200: 106.3, 300: 172.5, 400: 238.5, 800: 493.4, 1000: 616.3,
                 1400: 855.2, 2000: 1202.0}


@pytest.mark.parametrize("t_mev,range_g", sorted(PDG_MUON_CSDA.items()))
def test_muon_csda_range_vs_pdg(t_mev, range_g):
    # Our integrated Bethe-Bloch range; 2 % allows the table's radiative losses
    # (b(E)E ~ 0.3 % of dE/dx at 2 GeV) and low-energy corrections.
    assert mat.csda_range_cm(t_mev, MU) == pytest.approx(range_g / 1.396, rel=0.02)


@pytest.mark.parametrize("t_mev", [100, 400, 1000, 2000])
def test_stopping_muon_path_length(t_mev):
    # A simulated muon started along z stops after its CSDA range (path length, 3 %).
    rng = np.random.default_rng(t_mev)
    deps, length, end = transport("mu+", np.array([128.0, 0, 5]), np.array([0, 0, 1.0]),
                                  float(t_mev), rng)
    assert end == "decay"
    assert length == pytest.approx(PDG_MUON_CSDA[t_mev] / 1.396, rel=0.03)
    # visible energy: the muon's kinetic energy plus a Michel positron (< 52.8 MeV)
    assert 0.85 * t_mev < deps.arrays()[2].sum() < 1.15 * t_mev + mat.MICHEL_ENDPOINT_MEV


def test_photon_conversion_mean_free_path():
    # High-energy pair conversion: mean free path 9/7 X0 = 18.0 cm in LAr. 4000 samples
    # give a 1.6 % statistical error; 5 % tolerance also allows the XCOM table's 1 %
    # excess of total over pair attenuation at 3 GeV.
    rng = np.random.default_rng(1)
    cas = Cascade(Deposits(), [], rng)
    d = np.array([0, 0, 1.0])
    dist = np.array([cas.photon(np.array([128.0, 0, 300]), d, 3000.0)[0] for _ in range(4000)])
    assert dist.mean() == pytest.approx(9 / 7 * mat.X0_CM, rel=0.05)
    assert len(cas.queue) == 2 * 4000  # every photon converted into an e+ e- pair


def test_michel_spectrum():
    # dN/dx ~ x^2 (3 - 2x) up to 52.83 MeV: mean 0.7 x endpoint, most probable at the edge
    rng = np.random.default_rng(2)
    e = np.array([michel_energy(rng) for _ in range(20000)])
    assert e.max() <= mat.MICHEL_ENDPOINT_MEV
    assert e.max() > 0.99 * mat.MICHEL_ENDPOINT_MEV
    assert e.mean() == pytest.approx(0.7 * mat.MICHEL_ENDPOINT_MEV, rel=0.01)
    hist, _ = np.histogram(e, bins=10, range=(0, mat.MICHEL_ENDPOINT_MEV))
    assert np.argmax(hist) == 9


def test_highland_scattering():
    # Projected angle after one X0 at p = 1 GeV/c matches Highland (13.6 MeV / p)
    # within 6 % (500 tracks: 3 % statistical on the RMS).
    rng = np.random.default_rng(3)
    p = 1000.0
    t = np.full(48, float(mat.kinetic(p, MU)))
    d0 = np.array([0, 0, 1.0])
    ang = []
    for _ in range(500):
        _, d = trajectory(np.zeros(3), d0, t, MU, mat.X0_CM / 47, rng)
        ang.append(np.arctan2(d[0], d[2]))
    beta = p / np.sqrt(p**2 + MU**2)
    expected = float(mat.highland_theta0(p, beta, mat.X0_CM))
    assert np.std(ang) == pytest.approx(expected, rel=0.06)


def test_gamma_starts_with_two_mips_electron_with_one():
    # What separates e from gamma: the first 3 cm after the shower start carry twice the
    # dE/dx for a converted photon (e+ e- pair) as for a single electron.
    def start_dedx(kind, pos, d, seed):
        rng = np.random.default_rng(seed)
        deps, length, _ = transport(kind, pos, d, 1000.0, rng)
        start = pos + d * (length if kind == "gamma" else 0.0)
        a, b, e = deps.arrays()
        mid = 0.5 * (a + b)
        near = np.linalg.norm(mid - start, axis=1) < 3.0
        return e[near].sum() / 3.0

    pos, d = np.array([128.0, 0, 200]), np.array([0, 0, 1.0])
    g = np.median([start_dedx("gamma", pos, d, s) for s in range(25)])
    e = np.median([start_dedx("e-", pos, d, s) for s in range(25)])
    assert 1.5 < g / e < 2.7
    assert 1.8 < e < 3.0


# PDG liquid argon (Atomic and nuclear properties): Z/A, density, I, plasma energy and
# the Sternheimer density-effect parameters; K and m_e c^2 from the PDG constants.
PDG_K, PDG_ZA, PDG_RHO, ME = 0.307075, 0.45059, 1.396, 0.511
PDG_I_MEV, PDG_HW_MEV = 188e-6, 22.85e-6
PDG_DENSITY = (5.2146, 0.2, 3.0, 0.19559, 3.0)  # C, x0, x1, a, k


def _pdg_delta(bg: float) -> float:
    c, x0, x1, a, k = PDG_DENSITY
    x = math.log10(bg)
    if x >= x1:
        return 2 * math.log(10) * x - c
    return 2 * math.log(10) * x - c + a * (x1 - x) ** k if x >= x0 else 0.0


def _fwhm_and_mpv(v: np.ndarray, lo: float, hi: float, bin_w: float) -> tuple[float, float]:
    h, e = np.histogram(v, bins=np.arange(lo, hi + 1e-9, bin_w))
    h = np.convolve(h, np.ones(5) / 5, "same")
    c = 0.5 * (e[1:] + e[:-1])
    above = c[h >= h.max() / 2]
    return float(above.max() - above.min()), float(c[np.argmax(h)])


def test_per_wire_mip_straggling_matches_landau_vavilov():
    # Thin-layer straggling over one 0.3 cm wire pitch (PDG "Passage of particles through
    # matter", Eq. 34.12 and w = 4 xi; Bichsel, Rev. Mod. Phys. 60 (1988) 663): for a
    # muon of p = 3 GeV/c, xi = (K/2)(Z/A) rho x / beta^2 = 0.029 MeV,
    # Delta_p = xi [ln(2 m beta^2 gamma^2 / I) + ln(xi / I) + 0.200 - beta^2 - delta] and
    # FWHM = 4.018 xi give FWHM / MPV = 0.23. The simulation's per-wire charge (no noise,
    # near the anode so diffusion barely mixes wires; +sim2 gave a per-wire std/mean of
    # 0.55), turned back into energy with the ArgoNeuT modified box model (alpha 0.93,
    # beta 0.212, JINST 8 (2013) P08005), must match within 10 %.
    t = float(mat.kinetic(3000.0, MU))
    gam = 1 + t / MU
    bg2 = gam**2 - 1
    b2 = bg2 / gam**2
    xi = 0.5 * PDG_K * PDG_ZA * PDG_RHO * 0.3 / b2
    mpv = xi * (math.log(2 * ME * bg2 / PDG_I_MEV) + math.log(xi / PDG_I_MEV) + 0.200 - b2
                - _pdg_delta(math.sqrt(bg2)))
    expect = 4.018 * xi / mpv
    assert 0.22 < expect < 0.24
    cfg = ReadoutConfig(noise_electrons=0.0)
    box_b = 0.212 / (1.396 * 0.273)
    dedx = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        deps, _, _ = transport("mu+", np.array([5.0, 0, 1.0]), np.array([0, 0, 1.0]), t, rng)
        _, col, q = digitise(*deps.arrays(), Geometry(), rng, cfg)
        per_wire = np.bincount(col, weights=q)[np.unique(col)][5:-5] * 1000  # electrons
        dqdx = per_wire / 0.3 * 23.6e-6 / np.exp(-5.0 / 0.1098 / cfg.lifetime_us)
        dedx.append((np.exp(box_b * dqdx) - 0.93) / box_b)
    dedx = np.concatenate(dedx)
    assert len(dedx) > 9000
    fwhm, peak = _fwhm_and_mpv(dedx, 0.5, 5.0, 0.02)
    assert peak == pytest.approx(mpv / 0.3, rel=0.05)
    assert fwhm / peak == pytest.approx(expect, rel=0.10)


def test_gev_electron_deposits_the_restricted_fermi_plateau():
    # Local ionisation of a GeV electron (energy transfers below the 3 MeV delta cut;
    # harder deltas are tracked): the PDG restricted energy-loss formula on the Fermi
    # plateau (delta/2 -> ln(hw_p / I) + ln(beta gamma) - 1/2) is
    # K (Z/A) rho [1/2 ln(2 m T_cut / (hw_p)^2) - T_cut / (2 T_max)] = 2.17 MeV/cm in
    # LAr with hw_p = 22.85 eV. +sim2 deposited 1.80. Mean over 80 electrons' first 5 cm
    # (straggling preserves the mean, but its Landau tail scatters the mean of 20
    # electrons by ~2 %: 2.13 for sim3's seeds 0-19, 2.09 for sim4's); 3 % for Moller vs
    # the PDG form.
    t_cut, t_max = 3.0, 1000.0
    plateau = PDG_K * PDG_ZA * PDG_RHO * (0.5 * math.log(2 * ME * t_cut / PDG_HW_MEV**2)
                                          - t_cut / (2 * t_max))
    assert plateau == pytest.approx(2.17, abs=0.01)
    per_cm = []
    for seed in range(80):
        deps, _, _ = transport("e-", np.array([128.0, 0, 100]), np.array([0, 0, 1.0]),
                               2000.0, np.random.default_rng(seed))
        a, b, e = deps.starts[0], deps.ends[0], deps.energy[0]  # the primary's own track
        s = np.cumsum(np.linalg.norm(b - a, axis=1))
        per_cm.append(e[s <= 5.0].sum() / s[s <= 5.0][-1])
    assert np.mean(per_cm) == pytest.approx(plateau, rel=0.03)


def test_shower_shape_against_the_pdg_rules():
    # Eight 3 GeV e- along z (sim4). PDG ("Passage of particles through matter"): the
    # maximum at t_max = ln(E / E_c) - 0.5 X0 (56 cm in LAr, E_c = 32.84 MeV), ~90 % of the
    # energy within one Moliere radius (9.04 cm), 95 % within t_max + 0.08 Z + 9.6 X0
    # (211 cm). Measured 2026-11-30: maximum 63 cm, 86 % within R_M, 95 % by 148 cm: the
    # tail is short because photons below 6 MeV are not emitted and those below 1 MeV
    # are absorbed where they are made (docs/event-store.md says so)
    t_max = (math.log(3000.0 / mat.CRITICAL_MEV) - 0.5) * mat.X0_CM
    assert t_max == pytest.approx(56.1, abs=0.2)
    peak, core, l95 = [], [], []
    for seed in range(8):
        deps, _, _ = transport("e-", np.array([128.0, 0, 10]), np.array([0, 0, 1.0]), 3000.0,
                               np.random.default_rng(seed))
        a, b, e = deps.arrays()
        mid = 0.5 * (a + b)
        z = mid[:, 2] - 10.0
        hist, edges = np.histogram(z, bins=np.arange(0.0, 700.0, 5.0), weights=e)
        peak.append(edges[np.argmax(hist)])
        core.append(e[np.hypot(mid[:, 0] - 128.0, mid[:, 1]) < mat.MOLIERE_CM].sum() / e.sum())
        order = np.argsort(z)
        l95.append(z[order][np.searchsorted(np.cumsum(e[order]) / e.sum(), 0.95)])
    assert np.mean(peak) == pytest.approx(t_max, rel=0.3)
    assert 0.80 < np.mean(core) < 0.95
    assert 120 < np.mean(l95) < 211  # shorter than the PDG's rule: a stated approximation
