"""Energy deposits -> collection-plane pixels.

Each deposit segment is cut into points every ``SUBSTEP_CM`` (finer than a wire pitch
and a time pixel, so tracks have no holes), converted to electrons with the modified
box recombination model, attenuated by the electron lifetime, displaced by drift
diffusion, and summed per full-resolution pixel, then per downsample bin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lartpc.geometry import Geometry
from lartpc.sim import materials as mat
from lartpc.sim.tracks import inside

SUBSTEP_CM = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadoutConfig:
    """Detector response.

    Attributes
    ----------
    efield_kv_cm : drift field (MicroBooNE 0.273 kV/cm).
    box_alpha, box_beta : modified box model, ArgoNeuT (beta in (kV/cm)(g/cm2)/MeV).
    diffusion_long_cm2_us, diffusion_trans_cm2_us : MicroBooNE-like D_L, D_T.
    lifetime_us : electron lifetime.
    noise_electrons : Gaussian noise per pixel added to pixels with signal (0 = off).
    threshold_electrons : zero suppression per full-resolution pixel.
    charge_unit_electrons : stored charge = electrons / this (arbitrary units).
    """

    efield_kv_cm: float = 0.273
    box_alpha: float = 0.93
    box_beta: float = 0.212
    diffusion_long_cm2_us: float = 3.74e-6
    diffusion_trans_cm2_us: float = 5.85e-6
    lifetime_us: float = 10_000.0
    noise_electrons: float = 300.0
    threshold_electrons: float = 1000.0
    charge_unit_electrons: float = 1000.0


def recombination(dedx_mev_cm: np.ndarray, cfg: ReadoutConfig) -> np.ndarray:
    """Fraction of ionisation electrons that escape recombination (modified box)."""
    xi = cfg.box_beta * np.maximum(dedx_mev_cm, 0.05) / (mat.DENSITY_G_CM3 * cfg.efield_kv_cm)
    return np.log(cfg.box_alpha + xi) / xi


def digitise(starts: np.ndarray, ends: np.ndarray, energy_mev: np.ndarray, geom: Geometry,
             rng: np.random.Generator, cfg: ReadoutConfig | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse pixels ``(row int16, col int16, charge float32)`` of one event."""
    cfg = cfg or ReadoutConfig()
    empty = (np.zeros(0, np.int16), np.zeros(0, np.int16), np.zeros(0, np.float32))
    if not len(energy_mev):
        return empty
    seg = ends - starts
    length = np.linalg.norm(seg, axis=1)
    # point-like deposits (photo-absorption, nuclear fragments) take a 0.1 cm dE/dx scale
    dedx = energy_mev / np.maximum(length, SUBSTEP_CM)
    electrons = energy_mev * 1e6 / mat.W_EV * recombination(dedx, cfg)
    m = np.maximum(1, np.ceil(length / SUBSTEP_CM).astype(np.int64))
    idx = np.repeat(np.arange(len(m)), m)
    first = np.cumsum(m) - m
    frac = (np.arange(len(idx)) - first[idx] + 0.5) / m[idx]
    pts = starts[idx] + seg[idx] * frac[:, None]
    q = electrons[idx] / m[idx]
    keep = inside(pts)
    pts, q = pts[keep], q[keep]
    if not len(q):
        return empty
    v = geom.drift_velocity_cm_per_us
    t_us = pts[:, 0] / v
    q = q * np.exp(-t_us / cfg.lifetime_us)
    sig_l = np.sqrt(2 * cfg.diffusion_long_cm2_us * t_us)
    sig_t = np.sqrt(2 * cfg.diffusion_trans_cm2_us * t_us)
    x = pts[:, 0] + rng.normal(size=len(q)) * sig_l
    z = pts[:, 2] + rng.normal(size=len(q)) * sig_t
    row = np.floor(geom.time_pixel_of(x)).astype(np.int64)
    col = np.floor(geom.wire_of(z)).astype(np.int64)
    ok = (row >= 0) & (row < geom.n_time_pixels) & (col >= 0) & (col < geom.n_wires)
    flat = row[ok] * geom.full_size + col[ok]
    uniq, inv = np.unique(flat, return_inverse=True)
    charge = np.bincount(inv, weights=q[ok])
    if cfg.noise_electrons > 0:
        charge = charge + rng.normal(size=len(charge)) * cfg.noise_electrons
    sel = charge > cfg.threshold_electrons
    uniq, charge = uniq[sel], charge[sel]
    k = geom.downsample
    if k > 1:
        r, c = uniq // geom.full_size // k, uniq % geom.full_size // k
        uniq, inv = np.unique(r * geom.width + c, return_inverse=True)
        charge = np.bincount(inv, weights=charge)
        row, col = uniq // geom.width, uniq % geom.width
    else:
        row, col = uniq // geom.full_size, uniq % geom.full_size
    return (row.astype(np.int16), col.astype(np.int16),
            (charge / cfg.charge_unit_electrons).astype(np.float32))
