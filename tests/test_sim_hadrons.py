"""Hadronic inputs: PDG decay kinematics (Q values), decay in flight, interaction lengths."""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from lartpc.sim import hadrons as h
from lartpc.sim import materials as mat
from lartpc.sim.tracks import Deposits

M = h.MASS
# PDG: Q = m_K - sum of daughter masses
Q_MEV = {"ke3": 358.19, "kmu3": 253.04, "3pi": 74.97, "pi2pi0": 84.15}


@pytest.mark.parametrize("mode", sorted(Q_MEV))
def test_three_body_k_decays_conserve_energy_with_pdg_q(mode):
    products = dict((m, p) for m, _, p in h.DECAYS["K+"])[mode]
    masses = [M[k] for k in products]
    assert M["K+"] - sum(masses) == pytest.approx(Q_MEV[mode], abs=0.01)
    rng = np.random.default_rng(1)
    t = []
    for _ in range(3000):
        p4 = np.array(h.three_body(rng, M["K+"], np.zeros(3), *masses))
        np.testing.assert_allclose(p4.sum(axis=0), [M["K+"], 0, 0, 0], atol=1e-6)
        t.append(p4[:, 0] - masses)
    t = np.array(t)
    np.testing.assert_allclose(t.sum(axis=1), Q_MEV[mode], atol=0.01)
    # endpoint of the second daughter: (M^2 + m2^2 - (m1 + m3)^2) / 2M - m2
    m1, m2, m3 = masses
    end = (M["K+"] ** 2 + m2**2 - (m1 + m3) ** 2) / (2 * M["K+"]) - m2
    assert 0.9 * end < t[:, 1].max() <= end + 1e-6


def test_k_decay_at_rest_and_in_flight_through_the_queue():
    ctx = SimpleNamespace(rng=np.random.default_rng(2), queue=deque(), deps=Deposits())
    kinds = []
    for _ in range(4000):
        h.decay(ctx, "K+", np.zeros(3), np.zeros(3))
    kinds = [q[0] for q in ctx.queue]
    n = len(kinds)
    # mu+ nu 63.6 %, Kmu3 3.4 %: mu+ with T = 152.5 MeV (p = 235.5 MeV/c) or a spectrum
    mus = np.array([q[3] for q in ctx.queue if q[0] == "mu+"])
    t_kmu2 = float(mat.kinetic(h.P_MU_KMU2, M["mu+"]))
    assert np.mean(np.isclose(mus, t_kmu2, atol=0.1)) == pytest.approx(0.6356 / 0.6691, abs=0.03)
    assert kinds.count("e+") / 4000 == pytest.approx(0.0507, abs=0.012)
    assert n > 4000
    # in flight: a 2 GeV/c K+ -> mu nu boosts the muon forward
    ctx.queue.clear()
    for _ in range(200):
        h.decay(ctx, "K+", np.zeros(3), np.array([0.0, 0.0, 2000.0]))
    fwd = [q[2][2] for q in ctx.queue if q[0] in ("mu+", "pi+")]
    assert np.median(fwd) > 0.8


def test_kaon_decays_in_flight_with_pdg_lifetime():
    # c tau = 371.2 cm: at 2 GeV/c (beta gamma 4.05 falling to ~3.6 over 100 cm as the
    # kaon slows) ~6.8 % decay within 100 cm; ~40 % reach the end of their range first
    rng = np.random.default_rng(3)
    t = float(mat.kinetic(2000.0, M["K+"]))
    r0 = float(mat.csda_range_cm(t, M["K+"]))
    s = np.linspace(0, 100, 1001)
    bg = mat.momentum(mat.energy_at_range(r0 - 0.5 * (s[1:] + s[:-1]), M["K+"]), M["K+"]) / M["K+"]
    expect = 1 - np.exp(-np.sum(np.diff(s) / bg) / 371.2)
    assert 0.064 < expect < 0.07
    d = np.array([h.decay_distance_cm(rng, "K+", t) for _ in range(20000)])
    assert (d < 100).mean() == pytest.approx(expect, abs=0.0055)  # 3 sigma
    assert 0.3 < np.isinf(d).mean() < 0.5
    assert np.isinf(h.decay_distance_cm(rng, "mu+", 1000.0))


def test_interaction_lengths():
    # nucleon 119.7 g/cm2 (PDG) -> 85.8 cm; pion ~1.25x; kaon a labelled parameter
    assert mat.LAMBDA_INT_PION_CM == pytest.approx(1.25 * 119.7 / 1.396, rel=0.03)
    assert 105 <= mat.LAMBDA_INT_PION_CM <= 110 < mat.LAMBDA_INT_KAON_CM
    ctx = SimpleNamespace(rng=np.random.default_rng(4), queue=deque(), deps=Deposits(),
                          hadronic_budget=0)
    # 3 GeV/c pions along 10 m of argon: path to the first interaction ~ exponential(107)
    ends = [h.hadron(ctx, "pi+", np.array([128.0, 0, 1.0]), np.array([0, 0, 1.0]),
                     float(mat.kinetic(3000.0, M["pi+"]))) for _ in range(400)]
    lengths = np.array([tr.length_cm for tr in ends if tr.end == "interact"])
    assert len(lengths) > 380
    assert lengths.mean() == pytest.approx(mat.LAMBDA_INT_PION_CM, rel=0.12)


@pytest.mark.parametrize("kind", ["pi+", "K+"])
def test_quasi_elastic_kinks_follow_the_t_slope(kind):
    # d sigma / dt ~ exp(-b |t|), b ~ 7.5 GeV^-2 (pi p elastic diffraction slope at a few
    # GeV/c, Foley et al. PRL 11 (1963) 425): median |t| = ln 2 / b, so at p = 3 GeV/c the
    # median kink is sqrt(ln 2 / b) / p = 0.101 rad = 5.8 degrees (small angles,
    # |t| = p^2 theta^2), and the struck nucleon takes |t| / 2M ~ 50 MeV: > 95 % of the
    # kinetic energy stays with the hadron. (+sim2: half-normal, sigma 0.5 rad,
    # median 19 degrees, 60-97 % kept.)
    b = 7.5
    rng = np.random.default_rng(5)
    t = float(mat.kinetic(3000.0, M[kind]))
    d = np.array([0, 0, 1.0])
    out = [h.quasi_elastic(rng, M[kind], t, d, b) for _ in range(4000)]
    theta = np.arccos(np.clip([o[1][2] for o in out], -1, 1))
    kept = np.array([o[0] for o in out]) / t
    assert np.median(theta) == pytest.approx(math.sqrt(math.log(2) / b) / 3.0, rel=0.06)
    assert np.median(kept) > 0.95 and kept.min() > 0.5
    # momentum is conserved: hadron + recoil = incoming
    p_in = float(mat.momentum(t, M[kind]))
    o = out[0]
    p_out = o[1] * float(mat.momentum(o[0], M[kind])) + o[2]
    np.testing.assert_allclose(p_out, p_in * d, atol=1e-6 * p_in)
    assert h.HADRONIC.qe_t_slope_gev2 == b
