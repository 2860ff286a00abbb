"""Truth limits: the share of events whose class no image can reveal.

Read from the generator's truth (not from pixels), per class:

* ``exit_without_interaction``: the primary left the active volume before it stopped,
  decayed or interacted. For a pion or kaon this is a clean minimum-ionising stub that
  looks like an exiting muon; for a muon it is the muon signature itself.
* ``low_visible_energy``: less than :data:`LOW_VISIBLE_FRACTION` of the kinetic
  energy was deposited in the active volume (most of it left or went into neutral,
  invisible particles), so the image holds too little to classify by topology.
* ``indistinguishable``: pions and kaons that exit without interaction or show low
  visible energy, photons and electrons with low visible energy: the floor under the
  off-diagonal of a confusion matrix. Muons are 0 by construction: short exiting muon
  stubs share the MIP-stub pool with pions and kaons, and calling that pool muon (see
  below) gets them right.

``muon_purity_ceiling`` is the best muon purity on this sample if the exiting
MIP stubs of all three track classes are called muon (the choice that maximises it
when the classes are balanced): N_mu / (N_mu + exiting pions + exiting kaons).

``accuracy_ceiling`` per class is the best accuracy (recall) a perfect classifier could
reach on that class under the same rule: ``1 - indistinguishable``. The muon-stub pool
is called muon, so exiting pion/kaon stubs count as lost and muons keep 1.0; an event
with little visible energy is taken as lost whatever its class (a coin toss would get
a share of them right, so this is a conservative floor under the ceiling).
``overall_accuracy_ceiling`` is the class-balanced mean over the classes present, the
number to set beside a balanced test set's accuracy.
These are heuristics on truth, not a classifier's proven optimum.
"""

from __future__ import annotations

import h5py
import numpy as np

from lartpc import CLASSES
from lartpc.data.store import EventStore, EventStoreError

LOW_VISIBLE_FRACTION = 0.1
_FIELDS = ("end_process", "visible_energy_mev", "kinetic_energy_mev")


def read_truth(store: EventStore, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The generator's truth ``fields`` of every event of ``store``, one array each,
    straight from the shards' ``truth/`` datasets (no pixels read)."""
    out: dict[str, list] = {k: [] for k in fields}
    for p in store.paths:
        with h5py.File(p, "r") as f:
            for k in fields:
                if f"truth/{k}" not in f:
                    raise EventStoreError(
                        f"{p}: no truth/{k}; truth limits need a store written by "
                        "lartpc simulate with generator version +sim2 or later")
                out[k].append(f[f"truth/{k}"][:])
    return {k: np.concatenate(v) for k, v in out.items()}


def _truth(store: EventStore) -> dict[str, np.ndarray]:
    arr = read_truth(store, _FIELDS)
    if np.all(arr["end_process"] == b"") or np.all(arr["visible_energy_mev"] < 0):
        raise EventStoreError(f"{store.paths[0]}: events carry no generator truth "
                              "(converted files cannot give truth limits)")
    return arr


def event_masks(store: EventStore) -> dict[str, np.ndarray]:
    """Per event of ``store`` (bool arrays): ``exit`` (left without interacting),
    ``low_visible`` and ``indistinguishable``, as the module docstring defines them."""
    t = _truth(store)
    exit_ = t["end_process"] == b"exit"
    low = t["visible_energy_mev"] < LOW_VISIBLE_FRACTION * np.maximum(
        t["kinetic_energy_mev"], 1e-9)
    labels = np.asarray(store.labels)
    stub_class = np.isin(labels, [CLASSES.index("pion"), CLASSES.index("kaon")])
    not_muon = labels != CLASSES.index("muon")
    return {"exit": exit_, "low_visible": low,
            "indistinguishable": (exit_ & stub_class) | (low & not_muon)}


def truth_limits(store: EventStore) -> dict:
    """Per-class shares (0-1) of exiting, low-visible and indistinguishable events."""
    masks = event_masks(store)
    exit_, low, lost = masks["exit"], masks["low_visible"], masks["indistinguishable"]
    per_class = {}
    for i, name in enumerate(CLASSES):
        m = store.labels == i
        n = int(m.sum())
        per_class[name] = {
            "events": n,
            "exit_without_interaction": float(exit_[m].mean()) if n else 0.0,
            "low_visible_energy": float(low[m].mean()) if n else 0.0,
            "indistinguishable": float(lost[m].mean()) if n else 0.0,
        }
        per_class[name]["accuracy_ceiling"] = 1.0 - per_class[name]["indistinguishable"] \
            if n else None
    n_mu = int((store.labels == CLASSES.index("muon")).sum())
    pool = sum(int((exit_ & (store.labels == CLASSES.index(c))).sum()) for c in ("pion", "kaon"))
    ceilings = [c["accuracy_ceiling"] for c in per_class.values() if c["events"]]
    return {
        "source_geometry": store.attrs.get("source_geometry", "isotropic (not recorded)"),
        "classes": per_class,
        "overall_accuracy_ceiling": float(np.mean(ceilings)) if ceilings else None,
        "muon_purity_ceiling": n_mu / (n_mu + pool) if n_mu else None,
        "low_visible_fraction": LOW_VISIBLE_FRACTION,
    }


def format_limits(lim: dict) -> str:
    """Plain-text table of :func:`truth_limits`."""
    lines = [f"truth limits (source geometry {lim['source_geometry']}): share of events",
             f"{'class':9s} {'events':>6s} {'exit':>6s} {'low-vis':>7s} {'indist.':>7s} "
             f"{'ceiling':>7s}"]
    for name, c in lim["classes"].items():
        ceiling = "-" if c["accuracy_ceiling"] is None else f"{100 * c['accuracy_ceiling']:.1f}%"
        lines.append(f"{name:9s} {c['events']:6d} {100 * c['exit_without_interaction']:5.1f}% "
                     f"{100 * c['low_visible_energy']:6.1f}% {100 * c['indistinguishable']:6.1f}% "
                     f"{ceiling:>7s}")
    if lim.get("overall_accuracy_ceiling") is not None:
        lines.append(f"overall accuracy ceiling (class-balanced mean; ceiling = best accuracy a "
                     f"perfect classifier reaches per class): "
                     f"{100 * lim['overall_accuracy_ceiling']:.1f}%")
    if lim["muon_purity_ceiling"] is not None:
        lines.append(f"muon purity ceiling (exiting pi/K stubs called muon): "
                     f"{100 * lim['muon_purity_ceiling']:.1f}%")
    return "\n".join(lines)
