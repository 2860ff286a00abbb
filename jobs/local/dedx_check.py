"""How well the first centimetres' charge per wire tells electrons from photons in a store.

    python -m lartpc.jobs.local.dedx_check fid/events-beam-ds1 --events 600 --lengths 2,4,8

Once the beam vertex no longer marks where a photon came from (``+sim3``), the one thing
in an image that separates e from gamma is the start of the shower: an electron ionises
as one minimum-ionising particle, a converted photon as two. This measures that
directly: for each e and gamma event it takes the visible start from truth (the vertex
for e, the conversion point for gamma), follows the primary's direction for ``L`` cm of
track, sums the charge of each wire it crosses within a few time pixels of the expected
track, divides by the 3D path between two wires (pitch / |cos| of the angle to the
wire-number axis: the charge per cm, dQ/dx) and takes the median over those wires; then
it finds the one cut on that median with the best class-balanced accuracy. It is a bound
on what a classifier can get from dE/dx when it knows where the shower starts (a network
has to find the start itself), and a check that the generator's images carry the
difference at all. The cut is chosen on the same events it is scored on (one parameter
on hundreds of events). Prints JSON.

With one readout plane, how many wires sample the start depends on the direction: a
track at angle theta to the wire-number axis crosses L |cos theta| / pitch wires in L cm,
and one running along the wires puts its first centimetres on one or two. So the result
is also given per bin of |cos theta| (``by_wire_cosine``; beam events all sit in the last
bin, isotropic ones spread evenly over the bins, as |cos| of an isotropic direction is
uniform on [0, 1]) with the overall cut: what the projection leaves of the difference.

What one plane cannot give is that |cos theta|: the image shows the track's direction
projected onto the (drift, wire-number) plane, never its component d_y along the wires.
So ``seen`` repeats the measurement with the charge per cm of the *projected* track
(charge per wire x |d_z| / sqrt(d_x^2 + d_z^2) / pitch), the most a classifier can work
out from the image even with the start and the projected direction handed to it. It is
dQ/dx / sqrt(1 - d_y^2): a track leaning along the wires looks denser than it is (an
electron with |d_y| > 0.87 looks like two MIPs), so e and gamma overlap more; its
``by_along_wires`` bins (|d_y|, uniform on [0, 1] for isotropic directions) show where.
Beam directions have |d_y| < 0.09 and lose nothing to this.

``from_image`` takes nothing from truth: :func:`find_start` finds the start and the
projected direction in the image with a short rule (the connected cluster holding most
charge; of its two ends along its principal axis, the narrower one; the direction of the
charge within a few cm of it), then measures the charge per projected cm the same way.
``start_found`` is the share of events whose found start lies within 2 cm of the truth
start in the plane. A network has at least this much to learn from.

``from_image.brightest_pixel`` keeps that found start and its wires but drops the
division by the path: per wire, the charge of its brightest pixel, what a small
convolution sees before it knows the track's direction. In a pixel the charge depends on
the angle as well as on dE/dx (a track steep to the wires spreads a wire's charge over
many time pixels, one along the wires piles it into few), so where directions vary the
pixel alone says less about one MIP or two than the charge per cm does.
"""

from __future__ import annotations

import argparse
import json
from itertools import pairwise
from pathlib import Path

import numpy as np

from lartpc.data.orient import find_start
from lartpc.data.store import EventStore
from lartpc.errors import LartpcError

GAMMA, ELECTRON = 0, 1  #: class indices (lartpc.CLASSES order)
ROW_WINDOW = 6  #: time pixels either side of the expected track that count for a wire
COSINE_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)  #: |cos| to an axis, the per-bin results
CHUNK_EVENTS = 100  #: events read from the store at a time
START_MATCH_CM = 2.0  #: a found start this close to the truth start counts as found


def _lengths(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < v < 100 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated lengths in cm "
                                         "between 0 and 100, e.g. 2,4,8")
    return values


def start_medians(store: EventStore, lengths: list[float], max_events: int) -> dict:
    """Per class (gamma, electron), arrays over its events: ``cos`` (|d_z|, to the
    wire-number axis), ``along`` (|d_y|, along the wires), and per length L the median
    over the first L cm after the visible start of the charge per cm, in 3D (``(L,
    "dqdx")``) and of the projected track (``(L, "seen")``), and the same after the start
    :func:`find_start` finds (``(L, "from_image")``, with ``start_found``: within
    ``START_MATCH_CM`` of the truth start) and, from there, the median brightest pixel
    per wire (``(L, "pixel")``)."""
    geom = store.geometry
    if geom.downsample != 1:
        raise LartpcError(f"{store.paths[0].parent}: downsample {geom.downsample}; the "
                          "charge per wire needs full-resolution events (downsample 1)")
    out = {c: {"cos": [], "along": [], "start_found": [],
               **{(L, k): [] for L in lengths
                  for k in ("dqdx", "seen", "from_image", "pixel")}}
           for c in (GAMMA, ELECTRON)}
    picked = np.flatnonzero(store.labels <= ELECTRON)[:max_events]
    for chunk in np.array_split(picked, max(1, len(picked) // CHUNK_EVENTS)):
        for ev in store.read_many(chunk):
            d = np.asarray(ev.truth["direction"])
            start = np.asarray(ev.truth["vertex_cm"]) \
                + (d * ev.truth["path_length_cm"] if ev.label == GAMMA else 0.0)
            pixels = (ev.row.astype(float), ev.col.astype(float), ev.charge)
            mine = out[ev.label]
            mine["cos"].append(abs(d[2]))
            mine["along"].append(abs(d[1]))
            # cm of 3D track, and of its projection onto the plane, between two wires
            per_wire_cm = geom.wire_pitch_cm / max(1e-3, abs(d[2]))
            seen_cm = per_wire_cm * float(np.hypot(d[0], d[2]))
            (fx, fz), (fdx, fdz) = find_start(geom, *pixels)
            mine["start_found"].append(np.hypot(fx - start[0], fz - start[2])
                                       < START_MATCH_CM)
            found, found_d = np.array([fx, 0.0, fz]), np.array([fdx, 0.0, fdz])
            found_cm = geom.wire_pitch_cm / max(1e-3, abs(fdz))
            for L in lengths:
                (q,) = _medians_per_wire(geom, start, d, L, *pixels)
                mine[(L, "dqdx")].append(q / per_wire_cm)
                mine[(L, "seen")].append(q / seen_cm)
                q, brightest = _medians_per_wire(geom, found, found_d, L, *pixels,
                                                 reduces=(np.sum, np.max))
                mine[(L, "from_image")].append(q / found_cm)
                mine[(L, "pixel")].append(brightest)
    return {c: {k: np.array(v) for k, v in by.items()} for c, by in out.items()}


def _medians_per_wire(geom, start, d, length_cm, rows, cols, charge,
                      reduces=(np.sum,)) -> list[float]:
    """For each of ``reduces`` (np.sum: the wire's charge; np.max: its brightest pixel),
    its median over the wires of the first ``length_cm`` of track, applied to each wire's
    pixels near the expected track (one pass over the wires for all of them)."""
    cos = max(1e-3, abs(d[2]))
    step = np.sign(d[2]) or 1.0
    n = max(1, int(round(length_cm * cos / geom.wire_pitch_cm)))
    # time pixels per wire along the track's projection; a steep track spreads one wire's
    # charge over that many rows, so the window widens with it
    slope = (d[0] / geom.time_pixel_cm) / (cos / geom.wire_pitch_cm)
    window = ROW_WINDOW + abs(slope) / 2
    r0, c0 = geom.time_pixel_of(start[0]), geom.wire_of(start[2])
    per_wire = []
    for k in range(1, n + 1):
        near = (np.abs(cols - round(c0 + step * k)) < 0.5) \
            & (np.abs(rows - (r0 + slope * k)) <= window)
        per_wire.append([float(f(charge[near])) if near.any() else 0.0 for f in reduces])
    return [float(m) for m in np.median(np.array(per_wire), axis=0)]


def best_cut(gamma: np.ndarray, electron: np.ndarray) -> dict:
    """The cut (electron below, photon at or above) with the best balanced accuracy."""
    cuts = np.quantile(np.r_[gamma, electron], np.linspace(0.01, 0.99, 197))
    acc = [0.5 * ((electron < c).mean() + (gamma >= c).mean()) for c in cuts]
    c = float(cuts[int(np.argmax(acc))])
    return {"cut": c, "balanced_accuracy": float(max(acc)),
            "electron_accuracy": float((electron < c).mean()),
            "gamma_accuracy": float((gamma >= c).mean())}


def by_cosine(gamma, electron, cos_gamma, cos_electron, cut: float) -> list[dict]:
    """The overall cut's accuracy per bin of |cos| to an axis (``cos_*``, per event)."""
    rows = []
    bin_g, bin_e = (np.digitize(c, COSINE_BINS[1:-1]) for c in (cos_gamma, cos_electron))
    for i, (lo, hi) in enumerate(pairwise(COSINE_BINS)):
        g, e = gamma[bin_g == i], electron[bin_e == i]
        row = {"cos": [lo, hi], "events_gamma": len(g), "events_electron": len(e)}
        if len(g) and len(e):
            row["gamma_accuracy"] = float((g >= cut).mean())
            row["electron_accuracy"] = float((e < cut).mean())
            row["balanced_accuracy"] = 0.5 * (row["gamma_accuracy"] + row["electron_accuracy"])
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path, help="event store (full resolution)")
    ap.add_argument("--events", type=int, default=600, help="e and gamma events to use")
    ap.add_argument("--lengths", type=_lengths, default=[2.0, 4.0, 8.0],
                    help="cm after the start, comma-separated")
    args = ap.parse_args(argv)
    if args.events < 2:
        ap.error(f"--events {args.events}: expected at least 2")
    try:
        m = start_medians(EventStore(args.store), args.lengths, args.events)
    except LartpcError as e:
        ap.exit(2, f"dedx_check: {e}\n")
    g, e = m[GAMMA], m[ELECTRON]
    if len(g["cos"]) == 0 or len(e["cos"]) == 0:
        ap.exit(2, f"dedx_check: {args.store}: needs both e and gamma events\n")
    result = {}
    for L in args.lengths:
        result[f"{L:g}cm"] = {"events_gamma": len(g["cos"]), "events_electron": len(e["cos"]),
                              **_separation(g[(L, "dqdx")], e[(L, "dqdx")], g["cos"],
                                            e["cos"], "by_wire_cosine"),
                              "seen": _separation(g[(L, "seen")], e[(L, "seen")], g["along"],
                                                  e["along"], "by_along_wires"),
                              "from_image": {
                                  "start_found": float(np.mean(np.r_[g["start_found"],
                                                                     e["start_found"]])),
                                  **_separation(g[(L, "from_image")], e[(L, "from_image")],
                                                g["along"], e["along"], "by_along_wires"),
                                  "brightest_pixel": _separation(
                                      g[(L, "pixel")], e[(L, "pixel")], g["along"],
                                      e["along"], "by_along_wires")}}
    print(json.dumps(result, indent=2))
    return 0


def _separation(g, e, bin_g, bin_e, bins_key: str) -> dict:
    """Medians, the best cut and its accuracy overall and per bin of ``bin_*``."""
    cut = best_cut(g, e)
    return {"median_gamma": float(np.median(g)), "median_electron": float(np.median(e)),
            **cut, bins_key: by_cosine(g, e, bin_g, bin_e, cut["cut"])}


if __name__ == "__main__":
    raise SystemExit(main())
