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

``reference_rule_muon_purity`` is the muon purity of the reference rule below, which
calls the exiting MIP stubs of all three track classes muon:
N_mu / (N_mu + exiting pions + exiting kaons).

``reference_rule_recall`` per class is the recall of one fixed rule on truth: call the
muon-stub pool muon (exiting pion/kaon stubs lost, muons 1.0), take every event with
little visible energy as lost, everything else as right: ``1 - indistinguishable``.
It is a reference, **not a bound**: a network can beat it on a class (guess some stubs
pion or kaon, get some low-energy events right, and for hadrons that interact it
assumes 100 %, which no known classifier reaches). ``reference_rule_overall`` is the
class-balanced mean over the classes present. (Before issue 39 these fields were
called ``accuracy_ceiling``, ``overall_accuracy_ceiling`` and ``muon_purity_ceiling``;
readers of old files accept those.)
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
        per_class[name]["reference_rule_recall"] = \
            1.0 - per_class[name]["indistinguishable"] if n else None
    n_mu = int((store.labels == CLASSES.index("muon")).sum())
    pool = sum(int((exit_ & (store.labels == CLASSES.index(c))).sum()) for c in ("pion", "kaon"))
    recalls = [c["reference_rule_recall"] for c in per_class.values() if c["events"]]
    return {
        "source_geometry": store.attrs.get("source_geometry", "isotropic (not recorded)"),
        "classes": per_class,
        "reference_rule_overall": float(np.mean(recalls)) if recalls else None,
        "reference_rule_muon_purity": n_mu / (n_mu + pool) if n_mu else None,
        "low_visible_fraction": LOW_VISIBLE_FRACTION,
    }


def format_limits(lim: dict) -> str:
    """Plain-text table of :func:`truth_limits`."""
    lines = [f"truth limits (source geometry {lim['source_geometry']}): share of events",
             f"{'class':9s} {'events':>6s} {'exit':>6s} {'low-vis':>7s} {'indist.':>7s} "
             f"{'rule':>7s}"]
    for name, c in lim["classes"].items():
        rule = c["reference_rule_recall"]
        rule = "-" if rule is None else f"{100 * rule:.1f}%"
        lines.append(f"{name:9s} {c['events']:6d} {100 * c['exit_without_interaction']:5.1f}% "
                     f"{100 * c['low_visible_energy']:6.1f}% {100 * c['indistinguishable']:6.1f}% "
                     f"{rule:>7s}")
    if lim.get("reference_rule_overall") is not None:
        lines.append(f"reference rule, overall (class-balanced mean; rule = stubs called muon, "
                     f"low visible energy lost, the rest right: a reference, not a bound): "
                     f"{100 * lim['reference_rule_overall']:.1f}%")
    if lim["reference_rule_muon_purity"] is not None:
        lines.append(f"reference rule's muon purity (exiting pi/K stubs called muon): "
                     f"{100 * lim['reference_rule_muon_purity']:.1f}%")
    return "\n".join(lines)
