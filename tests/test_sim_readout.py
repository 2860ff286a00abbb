"""Readout response: MIP track width in time, regions of interest, noise, dead wires."""

from __future__ import annotations

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


def test_response_keeps_the_charge_and_adds_noise_only_inside_rois():
    a, b, e, length = _mip_track(128.0)
    quiet = ReadoutConfig(noise_electrons=0.0)
    _, _, q0 = digitise(a, b, e, GEOM, np.random.default_rng(2), quiet)
    # charge per wire: 0.63 MeV -> electrons after box recombination, in 10^3 e units
    expect = e.sum() * 1e6 / mat.W_EV * recombination(np.array([2.1]), quiet)[0] / 1000
    lifetime = np.exp(-128.0 / GEOM.drift_velocity_cm_per_us / quiet.lifetime_us)
    assert q0.sum() == pytest.approx(expect * lifetime, rel=0.03)  # the ROI keeps ~all
    r1, c1, q1 = digitise(a, b, e, GEOM, np.random.default_rng(2))
    r0, c0, _ = digitise(a, b, e, GEOM, np.random.default_rng(2), quiet)
    # noise is added only inside the ROIs: no pixel appears outside the quiet ROI set
    assert set(zip(r1.tolist(), c1.tolist(), strict=True)) <= set(
        zip(r0.tolist(), c0.tolist(), strict=True))
    assert abs(q1.sum() - q0.sum()) < 0.05 * q0.sum()
    assert np.std(q1[q1 < 1.0]) > 0  # ROI edges carry noise-sized charges


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
    _, col, _ = digitise(a, b, e, GEOM, np.random.default_rng(4), cfg)
    _, col_all, _ = digitise(a, b, e, GEOM, np.random.default_rng(4))
    assert not np.isin(col, dead).any()
    hit = np.unique(col_all)
    assert set(np.unique(col)) == set(hit[~np.isin(hit, dead)])
    with pytest.raises(ValueError, match="dead_wire_fraction"):
        ReadoutConfig(dead_wire_fraction=1.0)
