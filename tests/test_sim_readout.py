"""Readout response: MIP track width in time, regions of interest, noise, dead wires,
drift velocity and transverse diffusion."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lartpc.geometry import Geometry
from lartpc.sim import materials as mat
from lartpc.sim.readout import ReadoutConfig, dead_wires, digitise, recombination

GEOM = Geometry()
#: documented in docs/event-store.md: a MIP track perpendicular to the drift lights
#: 4.5-6.3 grouped time pixels per wire (MicroBooNE's deconvolved hits span ~5-6)
MIP_PX_PER_CM = (15.0, 21.0)


def _mip_track(x_cm: float, length_cm: float = 60.0):
    n = int(length_cm / 0.3)
    z = 100 + np.arange(n + 1) * 0.3
    pts = np.stack([np.full(n + 1, x_cm), np.zeros(n + 1), z], 1)
    return pts[:-1], pts[1:], np.full(n, 2.1 * 0.3), n * 0.3


@pytest.mark.parametrize("x_cm", [20.0, 128.0, 240.0])
def test_mip_pixels_per_cm_in_documented_range(x_cm):
    a, b, e, length = _mip_track(x_cm)
    row, col, q = digitise(a, b, e, GEOM, np.random.default_rng(1))
    per_cm = len(q) / length
    assert MIP_PX_PER_CM[0] <= per_cm <= MIP_PX_PER_CM[1]
    # the spread is in time: one wire column per 0.3 cm, several rows per wire
    per_wire = np.bincount(col)[np.unique(col)]
    assert 4 <= np.median(per_wire) <= 7
    assert np.all(q > 0)


def test_response_keeps_the_charge_and_rois_come_from_the_noisy_waveform():
    a, b, e, length = _mip_track(128.0)
    quiet = ReadoutConfig(noise_electrons=0.0)
    _, _, q0 = digitise(a, b, e, GEOM, np.random.default_rng(2), quiet)
    # charge per wire: 0.63 MeV -> electrons after box recombination, in 10^3 e units
    expect = e.sum() * 1e6 / mat.W_EV * recombination(np.array([2.1]), quiet)[0] / 1000
    lifetime = np.exp(-128.0 / GEOM.drift_velocity_cm_per_us / quiet.lifetime_us)
    assert q0.sum() == pytest.approx(expect * lifetime, rel=0.03)  # the ROI keeps ~all
    r0, c0, _ = digitise(a, b, e, GEOM, np.random.default_rng(2), quiet)
    quiet_set = set(zip(r0.tolist(), c0.tolist(), strict=True))
    near, outside, missing, seeds = 0, 0, 0, 0
    for seed in range(40):
        r1, c1, q1 = digitise(a, b, e, GEOM, np.random.default_rng(seed))
        on = (c1 >= c0.min() - 2) & (c1 <= c0.max() + 2) & (abs(r1 - np.median(r0)) < 20)
        got = set(zip(r1[on].tolist(), c1[on].tolist(), strict=True))
        outside += len(got - quiet_set)
        missing += len(quiet_set - got)
        near += on.sum()
        seeds += int((q1[~on] > 1.0).sum())  # noise-only ROI seeds (> 1000 e threshold)
        if seed == 0:
            assert abs(q1[on].sum() - q0.sum()) < 0.05 * q0.sum()
            assert np.std(q1[q1 < 1.0]) > 0  # ROI edges carry noise-sized charges
    # the ROIs are found on the noisy waveform: their edges do not trace the noiseless
    # charge (pixels appear beyond it and some of its pixels drop out)
    assert outside > 0.01 * near and missing > 0
    # noise is everywhere: seeds above threshold = 5 x RMS (Wire-Cell's collection-plane
    # tight-ROI factor) occur at the Gaussian tail rate, Q(5) = 2.87e-7 per pixel of
    # the 3456 x 3200 plane: 3.17 per event (Poisson over 40 events, 4 sigma)
    expect_seeds = 40 * 2.8665e-7 * GEOM.n_wires * GEOM.n_time_pixels
    assert abs(seeds - expect_seeds) < 4 * np.sqrt(expect_seeds)


def test_drift_velocity_is_microboone_measured():
    # charge from the cathode (x = 256 cm) arrives 256 / 0.1098 cm/us = 2331.5 us after
    # the trigger (MicroBooNE's measured drift velocity at 273 V/cm, 1.098 mm/us, as
    # Wire-Cell's MicroBooNE configuration uses): 1554.3 grouped pixels of 1.5 us
    # after the pretrigger's 1066.7
    cfg = ReadoutConfig(noise_electrons=0.0, time_response_ticks=0.0, threshold_electrons=0.0,
                        diffusion_long_cm2_us=0.0)
    row, _, _ = digitise(np.array([[255.99, 0, 500.0]]), np.array([[255.99, 0, 500.0]]),
                         np.array([1.0]), GEOM, np.random.default_rng(0), cfg)
    assert set(row.tolist()) == {int((3200 / 3) + 255.99 / (0.1098 * 1.5))}


def test_transverse_diffusion_shares_charge_by_the_gaussian_integral():
    # a point charge from x = 250 cm drifts 250 / 0.1098 = 2277 us; with D_T = 9.8 cm2/s
    # (Wire-Cell's MicroBooNE value) sigma_T = sqrt(2 D_T t) = 0.211 cm, so a charge at a
    # wire's centre keeps erf(0.15 / (sigma sqrt 2)) = 52 % on that wire and shares the
    # rest with its neighbours, the same way for every random stream (no jumps)
    cfg = ReadoutConfig(noise_electrons=0.0, time_response_ticks=0.0, threshold_electrons=0.0)
    sigma = math.sqrt(2 * 9.8e-6 * 250.0 / 0.1098)
    z = 1000 * 0.3 + 0.15  # centre of wire 1000
    shares = []
    for seed in (1, 2):
        _, col, q = digitise(np.array([[250.0, 0, z]]), np.array([[250.0, 0, z]]),
                             np.array([0.5]), GEOM, np.random.default_rng(seed), cfg)
        per_wire = np.bincount(col, weights=q)
        shares.append(per_wire[1000] / per_wire.sum())
        assert per_wire[999] == pytest.approx(per_wire[1001], rel=1e-6)
    assert shares[0] == pytest.approx(math.erf(0.15 / (sigma * math.sqrt(2))), rel=0.01)
    assert shares[0] == shares[1]


def test_time_response_off_gives_the_old_sparse_readout():
    a, b, e, length = _mip_track(128.0)
    bare = ReadoutConfig(time_response_ticks=0.0)
    _, _, q = digitise(a, b, e, GEOM, np.random.default_rng(3), bare)
    assert len(q) / length < 8.0  # 1.4-2.1 pixels per wire without a time response


def test_dead_wires_read_nothing():
    a, b, e, length = _mip_track(128.0, length_cm=300.0)
    cfg = ReadoutConfig(dead_wire_fraction=0.1, dead_wire_seed=5)
    dead = dead_wires(GEOM.n_wires, 0.1, 5)
    assert 0.08 < len(dead) / GEOM.n_wires < 0.12
    cfg = ReadoutConfig(dead_wire_fraction=0.1, dead_wire_seed=5, noise_electrons=0.0)
    _, col, _ = digitise(a, b, e, GEOM, np.random.default_rng(4), cfg)
    _, col_all, _ = digitise(a, b, e, GEOM, np.random.default_rng(4),
                             ReadoutConfig(noise_electrons=0.0))
    assert not np.isin(col, dead).any()
    hit = np.unique(col_all)
    assert set(np.unique(col)) == set(hit[~np.isin(hit, dead)])
    with pytest.raises(ValueError, match="dead_wire_fraction"):
        ReadoutConfig(dead_wire_fraction=1.0)
