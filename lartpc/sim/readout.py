"""Energy deposits -> collection-plane pixels.

Each deposit segment is cut into points every ``SUBSTEP_CM`` (finer than a wire pitch
and a time pixel, so tracks have no holes), converted to electrons with the modified
box recombination model, attenuated by the electron lifetime, displaced by drift
diffusion, and summed per full-resolution pixel. The readout then spreads each wire's
charge in time with the Gaussian width a deconvolved, filtered MicroBooNE waveform
keeps, finds regions of interest (ROI: pixels above threshold, padded in time), adds
noise inside them and drops everything outside, like the ROI-based deconvolved wire
data (recob::Wire) the upstream images hold; then bins by ``downsample``.

This is schematic: no field-response shapes or induced signals on neighbouring wires,
no space charge, no wire-to-wire noise correlation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

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
    noise_electrons : Gaussian noise per full-resolution pixel inside regions of
        interest (0 = off). Assumed, of the order of MicroBooNE's filtered noise.
    threshold_electrons : an ROI starts where a pixel's charge (after the time
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
    diffusion_trans_cm2_us: float = 5.85e-6
    lifetime_us: float = 10_000.0
    noise_electrons: float = 300.0
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
    """Time response, dead wires, ROI finding, noise inside ROIs, zero suppression.

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
        seeds = flat[charge > cfg.threshold_electrons]
        roi = np.zeros(len(flat), bool)
        for j in range(-cfg.roi_pad_rows, cfg.roi_pad_rows + 1):
            roi |= np.isin(flat + j * f, seeds, assume_unique=True)
        flat, charge = flat[roi], charge[roi]
        if cfg.noise_electrons > 0:
            charge = charge + rng.normal(size=len(charge)) * cfg.noise_electrons
        keep = charge > 0  # stored charge is positive; a noisy ROI edge may dip below
        return flat[keep], charge[keep]
    if cfg.noise_electrons > 0:
        charge = charge + rng.normal(size=len(charge)) * cfg.noise_electrons
    keep = charge > cfg.threshold_electrons
    return flat[keep], charge[keep]
