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
"""

from __future__ import annotations

import argparse
import json
from itertools import pairwise
from pathlib import Path

import numpy as np

from lartpc.data.store import EventStore
from lartpc.errors import LartpcError

GAMMA, ELECTRON = 0, 1  #: class indices (lartpc.CLASSES order)
ROW_WINDOW = 6  #: time pixels either side of the expected track that count for a wire
COSINE_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)  #: |cos| to the wire-number axis, per-bin results
CHUNK_EVENTS = 100  #: events read from the store at a time


def _lengths(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < v < 100 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated lengths in cm "
                                         "between 0 and 100, e.g. 2,4,8")
    return values


def start_medians(store: EventStore, lengths: list[float], max_events: int
                  ) -> tuple[dict[float, dict[int, list[float]]], dict[int, list[float]]]:
    """Per length L and class (gamma, electron): each event's median charge per cm (dQ/dx)
    over the first L cm after its visible start; and per class each event's |cos| to the
    wire-number axis."""
    geom = store.geometry
    if geom.downsample != 1:
        raise LartpcError(f"{store.paths[0].parent}: downsample {geom.downsample}; the "
                          "charge per wire needs full-resolution events (downsample 1)")
    out = {L: {GAMMA: [], ELECTRON: []} for L in lengths}
    cosines = {GAMMA: [], ELECTRON: []}
    picked = np.flatnonzero(store.labels <= ELECTRON)[:max_events]
    for chunk in np.array_split(picked, max(1, len(picked) // CHUNK_EVENTS)):
        for ev in store.read_many(chunk):
            d = np.asarray(ev.truth["direction"])
            start = np.asarray(ev.truth["vertex_cm"]) \
                + (d * ev.truth["path_length_cm"] if ev.label == GAMMA else 0.0)
            pixels = (ev.row.astype(float), ev.col.astype(float), ev.charge)
            cosines[ev.label].append(float(abs(d[2])))
            for L in lengths:
                out[L][ev.label].append(_median_dqdx(geom, start, d, L, *pixels))
    return out, cosines


def _median_dqdx(geom, start, d, length_cm, rows, cols, charge) -> float:
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
        per_wire.append(float(charge[near].sum()))
    return float(np.median(per_wire)) * cos / geom.wire_pitch_cm


def best_cut(gamma: np.ndarray, electron: np.ndarray) -> dict:
    """The cut (electron below, photon at or above) with the best balanced accuracy."""
    cuts = np.quantile(np.r_[gamma, electron], np.linspace(0.01, 0.99, 197))
    acc = [0.5 * ((electron < c).mean() + (gamma >= c).mean()) for c in cuts]
    c = float(cuts[int(np.argmax(acc))])
    return {"cut": c, "balanced_accuracy": float(max(acc)),
            "electron_accuracy": float((electron < c).mean()),
            "gamma_accuracy": float((gamma >= c).mean())}


def by_cosine(gamma, electron, cos_gamma, cos_electron, cut: float) -> list[dict]:
    """The overall cut's accuracy per bin of |cos| to the wire-number axis."""
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
        medians, cosines = start_medians(EventStore(args.store), args.lengths, args.events)
    except LartpcError as e:
        ap.exit(2, f"dedx_check: {e}\n")
    cos_g, cos_e = np.array(cosines[GAMMA]), np.array(cosines[ELECTRON])
    if len(cos_g) == 0 or len(cos_e) == 0:
        ap.exit(2, f"dedx_check: {args.store}: needs both e and gamma events\n")
    result = {}
    for L, by_class in medians.items():
        g, e = np.array(by_class[GAMMA]), np.array(by_class[ELECTRON])
        cut = best_cut(g, e)
        result[f"{L:g}cm"] = {"events_gamma": len(g), "events_electron": len(e),
                              "median_gamma": float(np.median(g)),
                              "median_electron": float(np.median(e)), **cut,
                              "by_wire_cosine": by_cosine(g, e, cos_g, cos_e, cut["cut"])}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
