"""Energy deposits -> collection-plane pixels.

Each deposit segment is cut into points every ``SUBSTEP_CM`` (finer than a wire pitch
and a time pixel, so tracks have no holes), converted to electrons with the modified
box recombination model and attenuated by the electron lifetime. Transverse diffusion
shares each point's charge among the neighbouring wires by the integral of its Gaussian
(sigma_T = sqrt(2 D_T t)) over each wire's pitch, so charge spreads instead of jumping
between wires; longitudinal diffusion displaces the point in time (the time response
below is wider). The readout then spreads each wire's charge in time with the Gaussian
width a deconvolved, filtered MicroBooNE waveform keeps, adds noise to every pixel it
looks at, finds regions of interest (ROI: pixels of the *noisy* waveform above
threshold, padded in time) and drops everything outside, like the ROI-based deconvolved
wire data (recob::Wire) the upstream images hold; then bins by ``downsample``.

Noise is everywhere, not only near charge: ROIs are seeded from the noisy waveform (so
an ROI's edge does not trace the noiseless charge), and the whole plane gets the
noise-only ROIs its Gaussian tail above threshold implies (Poisson count, uniform
positions on live wires). With the defaults (threshold 5 x the noise RMS, Wire-Cell's
tight-ROI factor for the collection plane) that is ~3 per full-resolution event.

This is schematic: no field-response shapes or induced signals on neighbouring wires,
no space charge, no wire-to-wire noise correlation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import ndtr, ndtri

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
    diffusion_long_cm2_us : D_L, MicroBooNE's measurement 3.74 cm2/s (Abratenko et al.,
        JINST 16 (2021) P09025).
    diffusion_trans_cm2_us : D_T, 9.8 cm2/s as in Wire-Cell's MicroBooNE configuration
        (wire-cell-toolkit cfg/pgrapher/experiment/uboone/params.jsonnet).
    lifetime_us : electron lifetime.
    noise_electrons : Gaussian noise RMS per full-resolution pixel (0 = off). Assumed:
        the ROI threshold divided by Wire-Cell's collection-plane tight-ROI factor 5
        (ROI_formation th_factor_col), i.e. of the order of MicroBooNE's filtered noise.
    threshold_electrons : an ROI starts where a pixel's noisy charge (after the time
        response) exceeds this.
    time_response_ticks : Gaussian sigma (ticks) of the deconvolved signal in time.
        MicroBooNE's signal processing (JINST 13 (2018) P07006 and P07007) removes the
        2 us electronics shaping and field response by deconvolution and applies a
        Gaussian low-pass software filter of sigma ~0.12 MHz, i.e. 1/(2 pi 0.12 MHz)
        ~ 1.3 us ~ 2.7 ticks in time. 0 turns the response (and ROI padding) off.
    roi_pad_rows : ROIs are padded by this many full-resolution time pixels (3 ticks
        each) on both sides of the above-threshold pixels (assumed).
    dead_wire_fraction : fraction of collection wires that read nothing (MicroBooNE had
        ~10 % unresponsive channels); 0 = all wires live.
    dead_wire_seed : seed of the dead-wire mask (the same wires for every event).
    charge_unit_electrons : stored charge = electrons / this (arbitrary units).
    """

    efield_kv_cm: float = 0.273
    box_alpha: float = 0.93
    box_beta: float = 0.212
    diffusion_long_cm2_us: float = 3.74e-6
    diffusion_trans_cm2_us: float = 9.8e-6
    lifetime_us: float = 10_000.0
    noise_electrons: float = 200.0
    threshold_electrons: float = 1000.0
    time_response_ticks: float = 2.7
    roi_pad_rows: int = 1
    dead_wire_fraction: float = 0.0
    dead_wire_seed: int = 0
    charge_unit_electrons: float = 1000.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.dead_wire_fraction < 1.0:
            raise ValueError(f"dead_wire_fraction={self.dead_wire_fraction}: need 0 <= f < 1")
        if self.time_response_ticks < 0 or self.roi_pad_rows < 0:
            raise ValueError("time_response_ticks and roi_pad_rows must be >= 0")


@lru_cache(maxsize=4)
def dead_wires(n_wires: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted wire numbers of the dead-wire mask (fixed for a given seed)."""
    if fraction <= 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.random.default_rng(seed).random(n_wires) < fraction)


@lru_cache(maxsize=8)
def time_kernel(sigma_rows: float, min_half: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(row offsets, weights) of a unit Gaussian integrated over whole time pixels,
    reaching at least ``min_half`` rows either side (3 sigma otherwise)."""
    k = max(1, min_half, math.ceil(3 * sigma_rows))
    off = np.arange(-k, k + 1)
    cdf = np.array([0.5 * (1 + math.erf((j + 0.5) / (sigma_rows * math.sqrt(2))))
                    for j in range(-k - 1, k + 1)])
    w = np.diff(cdf)
    return off, w / w.sum()


def recombination(dedx_mev_cm: np.ndarray, cfg: ReadoutConfig) -> np.ndarray:
    """Fraction of ionisation electrons that escape recombination (modified box)."""
    xi = cfg.box_beta * np.maximum(dedx_mev_cm, 0.05) / (mat.DENSITY_G_CM3 * cfg.efield_kv_cm)
    return np.log(cfg.box_alpha + xi) / xi


def wire_share(w: np.ndarray, sigma_w: np.ndarray, q: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Charge ``q`` at fractional wire coordinates ``w``, shared among wires.

    Each point's charge goes to wire ``floor(w) + k`` in proportion to the integral of a
    Gaussian of width ``sigma_w`` (wire pitches) over that wire's pitch: transverse
    diffusion spreads a charge cloud, it does not move it as a whole.

    Returns
    -------
    (wire numbers (n, m) int64, charges (n, m)); rows sum to ``q``.
    """
    k = max(1, math.ceil(3 * float(sigma_w.max(initial=0.0))))
    base = np.floor(w)
    edges = base[:, None] + np.arange(-k, k + 2) - w[:, None]
    cdf = ndtr(edges / np.maximum(sigma_w, 1e-6)[:, None])
    frac = np.diff(cdf, axis=1)
    frac /= frac.sum(axis=1, keepdims=True)
    return base.astype(np.int64)[:, None] + np.arange(-k, k + 1), q[:, None] * frac


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
    x = pts[:, 0] + rng.normal(size=len(q)) * sig_l
    row = np.floor(geom.time_pixel_of(x)).astype(np.int64)
    col, q = wire_share(geom.wire_of(pts[:, 2]),
                        np.sqrt(2 * cfg.diffusion_trans_cm2_us * t_us) / geom.wire_pitch_cm, q)
    row = np.repeat(row, col.shape[1])
    col, q = col.ravel(), q.ravel()
    ok = (row >= 0) & (row < geom.n_time_pixels) & (col >= 0) & (col < geom.n_wires) & (q > 0)
    flat = row[ok] * geom.full_size + col[ok]
    uniq, inv = np.unique(flat, return_inverse=True)
    uniq, charge = _respond(uniq, np.bincount(inv, weights=q[ok]), geom, rng, cfg)
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


def _respond(flat: np.ndarray, charge: np.ndarray, geom: Geometry, rng: np.random.Generator,
             cfg: ReadoutConfig) -> tuple[np.ndarray, np.ndarray]:
    """Time response, dead wires, noise, ROI finding on the noisy waveform, zero
    suppression.

    ``flat`` are sorted full-resolution pixel numbers (row * full_size + col).
    """
    f = geom.full_size
    dead = dead_wires(geom.n_wires, cfg.dead_wire_fraction, cfg.dead_wire_seed)
    if len(dead):
        live = ~np.isin(flat % f, dead)
        flat, charge = flat[live], charge[live]
    if cfg.time_response_ticks > 0 and len(flat):
        # reaching the ROI padding, so every padded pixel is in the spread set
        off, w = time_kernel(cfg.time_response_ticks / geom.tick_group, cfg.roi_pad_rows)
        rows = flat[:, None] // f + off
        ok = (rows >= 0) & (rows < geom.n_time_pixels)
        spread = (flat[:, None] + off * f)[ok]
        flat, inv = np.unique(spread, return_inverse=True)
        charge = np.bincount(inv, weights=(charge[:, None] * w)[ok])
        return _rois(flat, charge, geom, rng, cfg, dead)
    if cfg.noise_electrons > 0:
        charge = charge + rng.normal(size=len(charge)) * cfg.noise_electrons
    keep = charge > cfg.threshold_electrons
    return flat[keep], charge[keep]


def _noise_seeds(geom: Geometry, rng: np.random.Generator, cfg: ReadoutConfig,
                 dead: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Noise-only ROI seeds on the whole plane: (pixel numbers, noisy charges).

    Each live pixel's noise exceeds the threshold with probability p = Q(thr / sigma);
    the count is Poisson(N p), positions uniform, values drawn from the Gaussian tail.
    """
    if cfg.noise_electrons <= 0:
        return np.zeros(0, np.int64), np.zeros(0)
    p = float(ndtr(-cfg.threshold_electrons / cfg.noise_electrons))
    live = np.setdiff1d(np.arange(geom.n_wires), dead)
    n = int(rng.poisson(p * len(live) * geom.n_time_pixels))
    pos = (rng.integers(0, geom.n_time_pixels, n) * geom.full_size
           + live[rng.integers(0, len(live), n)])
    z = -ndtri(rng.random(n) * p)  # the tail above thr / sigma
    return pos, z * cfg.noise_electrons


def _rois(flat: np.ndarray, charge: np.ndarray, geom: Geometry, rng: np.random.Generator,
          cfg: ReadoutConfig, dead: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROIs of the noisy waveform: seeds above threshold padded in time; the rest dropped."""
    f = geom.full_size
    noisy = charge + rng.normal(size=len(charge)) * cfg.noise_electrons \
        if cfg.noise_electrons > 0 else charge
    fake, fake_q = _noise_seeds(geom, rng, cfg, dead)
    new = ~np.isin(fake, flat)  # where there is signal, its own noise was drawn above
    known = np.concatenate([flat, fake[new]])
    value = np.concatenate([noisy, fake_q[new]])
    known, first = np.unique(known, return_index=True)
    value = value[first]
    seeds = known[value > cfg.threshold_electrons]
    pad = np.arange(-cfg.roi_pad_rows, cfg.roi_pad_rows + 1)
    rows = seeds[:, None] // f + pad
    roi = np.unique((seeds[:, None] + pad * f)[(rows >= 0) & (rows < geom.n_time_pixels)])
    at = np.minimum(np.searchsorted(known, roi), len(known) - 1)
    seen = known[at] == roi
    out = np.where(seen, value[at], 0.0)
    if cfg.noise_electrons > 0:  # ROI padding beyond anything simulated: noise only
        out[~seen] = rng.normal(size=int((~seen).sum())) * cfg.noise_electrons
    keep = out > 0  # stored charge is positive; a noisy ROI edge may dip below
    return roi[keep], out[keep]
