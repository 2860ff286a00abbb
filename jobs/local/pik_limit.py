"""A physics-feature classifier for pions and kaons that interact: what truth features tell.

    python -m lartpc.jobs.local.pik_limit fid/events-isotropic-ds1 [--json OUT]

The reference rule of the truth limits (:mod:`lartpc.sim.limits`) counts every pion or
kaon that interacts in the detector as classifiable, i.e. right 100 % of the time. What
tells such a pion from such a kaon in this generator (:mod:`lartpc.sim.hadrons`) is far
less:

* **The interaction.** Both end in the same kinds of final state, drawn with different
  probabilities (``HadronicParameters``, assumed, not measured): a small kink
  (quasi-elastic; pi 25 %, K 40 %), a pi0 shower alone (pi charge exchange, 10 %), two to
  four protons (pi absorption, 10 %), one proton (K charge exchange, K0 unseen, 12 %), a
  star with a leading hadron (inelastic; pi 55 %, K 48 % x 60 %) or without one (K 48 % x
  40 %, a K0 takes the lead); the extra pions, protons and pi0 of a star come from the
  same distributions for both.
* **The charge per cm** of the track before it interacts: at 1.5-4.5 GeV/c a pion is on
  the relativistic rise and a kaon near minimum ionisation, 9-13 % apart in mean
  stopping power (Bethe with the density effect, :func:`lartpc.sim.materials.bethe_dedx`).
  One readout plane shows the track's projection, not how far it leans along the wires
  (d_y), so what an image can measure is the charge per *projected* cm, the stopping
  power times 1 / sqrt(1 - d_y^2).
* **Delta rays** (tracked above 3 MeV, :mod:`lartpc.sim.tracks`): a delta electron takes
  at most T_max from its primary, under 84 MeV for any kaon below 4.5 GeV/c and up to
  ~400 MeV for a pion, so a delta ray above the kaons' largest T_max marks a pion.
* **Where it interacts**: interaction lengths 107 cm (pi) and 128 cm (K).
* A kaon that decays in flight (``end_process`` ``decay``).

This job takes the store's classifiable pions and kaons (not an exiting stub, not under
10 % visible energy) with their truth (momentum, direction, path length, end process)
and gives each:

* the interaction type it would have had, drawn from the generator's own probabilities
  (seeded: the store does not record it); after a kink the hadron goes on, and it is
  taken to interact a second time in view, every time, showing a second type;
* a measured charge per projected cm: the mean stopping power over its path, times the
  projection factor, times a log-normal error of ``--wire-resolution`` / sqrt(wires
  crossed);
* whether it made a delta ray above the kaons' largest T_max (drawn from the
  generator's delta-ray rate along its path);
* its momentum, exactly (an image could only estimate it, from multiple scattering);

and scores a naive-Bayes classifier on these and the path length (histograms fitted on
one half of the events and scored on the other, both ways, equal priors). Each feature
is handed over perfectly or better than an image gives it: every interaction's type
without error, the charge as the mean stopping power (an image sees Landau-distributed
charge per wire; ``--wire-resolution 0``: no error at all) with the full Bethe rise (the
restricted loss a truncated mean measures rises less), the momentum beside it, a delta
ray with its energy, a second interaction after every kink. Left out: the shapes within
a star, drawn from the same distributions for both; and the interaction types are drawn
from the generator's mix, not read from the events. So the result is the recall of one
achievable classifier on truth features, **neither a bound nor a ceiling**: a network
can beat it (the 65.1 % isotropic network gets kaons right that this classifier misses).
``reference_rule_recall`` gives the reference rule's recall per class beside the rule
with this classifier for the classifiable hadrons, ``(1 - indistinguishable) x recall``.
(Before issue 39 that field was ``ceilings``.) Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lartpc import CLASSES
from lartpc.errors import LartpcError

#: interaction types and their probabilities per class, from lartpc.sim.hadrons.HADRONIC
TYPES = ("kink", "pi0_only", "protons", "one_proton", "star_lead", "star_no_lead")
N_TYPES = len(TYPES)
CATEGORIES = 2 * N_TYPES + 1  #: the types, a decay in flight, a kink then each type
BINS = 40  #: histogram bins of each continuous feature
MOMENTUM_BINS = 10  #: momentum bins of the charge's joint histogram
PATH_POINTS = 8  #: points along the path where the stopping power is averaged


def type_probabilities() -> dict[str, np.ndarray]:
    """P(interaction type | class), over :data:`TYPES`, from the generator's parameters."""
    from lartpc.sim.hadrons import HADRONIC as h

    qe, cex, ab = h.pion_mix
    pion = np.array([qe, 0.0, 0.0, 0.0, 0.0, 0.0])
    pion[[1, 2, 4]] = cex, ab, 1 - qe - cex - ab
    qe, cex, ab = h.kaon_mix
    if ab:
        raise LartpcError("kaon absorption in HadronicParameters: not in this job's types")
    inel = 1 - qe - cex
    kaon = np.array([qe, 0.0, 0.0, cex, inel * h.inel_kaon_keeps_lead,
                     inel * (1 - h.inel_kaon_keeps_lead)])
    return {"pion": pion, "kaon": kaon}


def category_probabilities() -> dict[str, np.ndarray]:
    """P(category | class) of the categories :func:`features` gives an interacting
    hadron (no decay in flight): a non-kink type alone, or a kink then a second type."""
    out = {}
    for c, p in type_probabilities().items():
        out[c] = np.r_[p[1:], p[0] * p]
    return out


def features(store, wire_resolution: float, seed: int) -> dict[str, np.ndarray]:
    """The classifiable pions and kaons of ``store``: label (0 pion, 1 kaon), type index,
    log charge per projected cm, a delta ray above any kaon's T_max (0/1), path length
    (cm)."""
    from lartpc.sim import materials as mat
    from lartpc.sim.limits import event_masks, read_truth
    from lartpc.sim.tracks import delta_rays_above_per_cm, delta_tmax_mev

    labels = np.asarray(store.labels)
    pi, k = CLASSES.index("pion"), CLASSES.index("kaon")
    keep = np.isin(labels, [pi, k]) & ~event_masks(store)["indistinguishable"]
    truth = read_truth(store, ("momentum_mev", "direction", "path_length_cm", "end_process"))
    t = {key: v[keep] for key, v in truth.items()}
    y = (labels[keep] == k).astype(int)
    if len(np.unique(y)) < 2:
        raise LartpcError(f"{store.paths[0].parent}: needs classifiable pions and kaons")
    rng = np.random.default_rng(seed)
    probs = type_probabilities()
    first, second = (np.array([rng.choice(len(TYPES), p=probs["kaon" if c else "pion"])
                               for c in y]) for _ in range(2))
    # after a kink the hadron goes on, and is taken to interact again in view (more
    # than always happens: generous): its category is the pair (kink, second type)
    kind = np.where(first == 0, N_TYPES + 1 + second, first)
    kind[t["end_process"] == b"decay"] = N_TYPES  # a decay in flight: its own category
    mass = np.where(y == 1, mat.MASS_MEV["K"], mat.MASS_MEV["pi"])
    length = np.asarray(t["path_length_cm"], float)
    dedx, hard = np.empty(len(y)), np.zeros(len(y))
    k_max = float(delta_tmax_mev(mat.kinetic(float(t["momentum_mev"].max()), mat.MASS_MEV["K"]),
                                 mat.MASS_MEV["K"]))
    for m in np.unique(mass):
        sel = mass == m
        t0 = mat.kinetic(t["momentum_mev"][sel].astype(float), m)
        r0 = mat.csda_range_cm(t0, m)
        along = np.linspace(0, 1, PATH_POINTS)[None, :] * length[sel, None]
        tk = mat.energy_at_range(np.maximum(r0[:, None] - along, 1e-3), m)
        dedx[sel] = mat.bethe_dedx(tk, m).mean(axis=1)
        # delta rays above k_max per cm, 1/T^2 envelope without the (1 - b^2 T/Tmax)
        # thinning (more of them: generous); only a pion's T_max reaches past k_max
        per_cm = delta_rays_above_per_cm(tk, m, k_max)
        hard[sel] = rng.poisson(per_cm.mean(axis=1) * length[sel]) > 0
    d = np.asarray(t["direction"], float)
    projected = np.sqrt(np.maximum(1 - d[:, 1] ** 2, 1e-6))
    wires = np.maximum(1.0, length * np.abs(d[:, 2]) / store.geometry.wire_pitch_cm)
    noise = rng.normal(0, 1, len(y)) * wire_resolution / np.sqrt(wires)
    return {"label": y, "type": kind, "log_charge": np.log(dedx / projected) + noise,
            "log_momentum": np.log(t["momentum_mev"].astype(float)),
            "hard_delta": hard.astype(int), "length": length}


def _log_hist(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    counts = np.histogram(np.clip(x, edges[0], edges[-1]), edges)[0] + 1.0  # add-one
    return np.log(counts / counts.sum())


def _bin(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)


def score(f: dict[str, np.ndarray], use: tuple[str, ...]) -> dict:
    """Naive Bayes on the features ``use``: fit on one half, score on the other, both
    ways; recall per class (pion, kaon) and their mean. The charge is scored jointly
    with the momentum (a 2-D histogram): the momentum is handed over exactly."""
    n = len(f["label"])
    half = np.arange(n) % 2 == 0
    edges = {k: np.quantile(f[k], np.linspace(0, 1, BINS + 1))
             for k in ("log_charge", "length")}
    p_edges = np.quantile(f["log_momentum"], np.linspace(0, 1, MOMENTUM_BINS + 1))
    right = np.zeros(n, bool)
    for fit in (half, ~half):
        test = ~fit
        loglik = np.zeros((test.sum(), 2))
        for c in (0, 1):
            mine = fit & (f["label"] == c)
            for k, n_values in (("type", CATEGORIES), ("hard_delta", 2)):
                if k in use:
                    counts = np.bincount(f[k][mine], minlength=n_values) + 1.0
                    loglik[:, c] += np.log(counts / counts.sum())[f[k][test]]
            if "length" in use:
                e = edges["length"]
                loglik[:, c] += _log_hist(f["length"][mine], e)[_bin(f["length"][test], e)]
            if "log_charge" in use:
                e = edges["log_charge"]
                counts = np.histogram2d(np.clip(f["log_charge"][mine], e[0], e[-1]),
                                        np.clip(f["log_momentum"][mine], p_edges[0],
                                                p_edges[-1]), (e, p_edges))[0] + 1.0
                loglik[:, c] += np.log(counts / counts.sum())[
                    _bin(f["log_charge"][test], e), _bin(f["log_momentum"][test], p_edges)]
        right[test] = loglik.argmax(1) == f["label"][test]
    recall = [float(right[f["label"] == c].mean()) for c in (0, 1)]
    return {"pion": recall[0], "kaon": recall[1], "balanced": float(np.mean(recall))}


def pik_limit(store, wire_resolution: float = 0.2, seed: int = 0) -> dict:
    """The classifier of the module docstring, with the parts each feature adds."""
    from lartpc.sim.limits import truth_limits

    f = features(store, wire_resolution, seed)
    lim = truth_limits(store)["classes"]
    cat = category_probabilities()
    type_only = {"pion": float(cat["pion"][cat["pion"] >= cat["kaon"]].sum()),
                 "kaon": float(cat["kaon"][cat["kaon"] > cat["pion"]].sum())}
    parts = {"type": ("type",), "charge": ("log_charge",), "type+charge": ("type", "log_charge"),
             "all": ("type", "log_charge", "hard_delta", "length")}
    res = {name: score(f, use) for name, use in parts.items()}
    best = res["all"]
    return {
        "store": str(store.paths[0].parent),
        "events": {"pion": int((f["label"] == 0).sum()), "kaon": int((f["label"] == 1).sum())},
        "pions_with_a_delta_ray_above_any_kaons": float(f["hard_delta"][f["label"] == 0].mean()),
        "wire_resolution": wire_resolution, "seed": seed,
        "type_probabilities": {c: dict(zip(TYPES, p.tolist(), strict=True))
                               for c, p in type_probabilities().items()},
        "type_only_from_the_parameters": {**type_only,
                                          "balanced": (type_only["pion"] + type_only["kaon"]) / 2},
        "recall": res,
        "reference_rule_recall": {
            c: {"reference_rule": lim[c]["reference_rule_recall"],
                "with_physics_feature_classifier": lim[c]["reference_rule_recall"] * best[c]}
            for c in ("pion", "kaon")},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.pik_limit",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path, help="event store with generator truth")
    p.add_argument("--wire-resolution", type=float, default=0.2,
                   help="relative error of one wire's charge (0: a perfect measurement)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn interaction types")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    if args.wire_resolution < 0:
        p.error(f"--wire-resolution {args.wire_resolution}: must be >= 0")
    from lartpc.data.store import EventStore

    try:
        res = pik_limit(EventStore(args.store), args.wire_resolution, args.seed)
    except (LartpcError, OSError) as e:
        print(f"pik_limit: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        from lartpc.fsutil import atomic_write

        atomic_write(args.json, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
