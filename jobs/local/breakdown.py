"""Where a trained run's held-out accuracy is lost, event by event, against the truth.

    python -m lartpc.jobs.local.breakdown RUN STORE [--json OUT]

Rebuilds the run's network from ``RUN/weights.pt`` (else its checkpoint) and its held-out
split from the run's own config (the events its ``eval.csv`` and ``confusion.csv`` were measured on;
the run must have been trained on ``STORE``), classifies them once, and splits the
result by what the generator's truth says about each event (:mod:`lartpc.sim.limits`):

* per class, the events no image can classify (``indistinguishable``: exiting pion and
  kaon stubs, little visible energy) apart from the rest, with the accuracy on each and
  what each part was called (its row of the confusion matrix, split in two): the
  accuracy on the *classifiable* events is the one to set against 100 %, and the gap
  to the class's reference rule (:mod:`lartpc.sim.limits`: a rule on truth, not a
  bound) splits into what is lost on each part;
* the minimum-ionising stub pool (every muon, pion and kaon that left without
  interacting) and what the network calls it: the confusion that the physics forces;
* electrons and photons by how far their direction leans along the wires (``|d_y|``):
  one plane sees a track's projection, and the steeper ones look denser.

Prints a table and writes JSON (``--json``) with every number. The checkpoint is the
run's last one, so its confusion matrix equals the run's ``confusion.csv`` when the run
ended with an evaluation (the JSON says whether they agree). ``--orient start`` puts the
events through the start-finding stage (:mod:`lartpc.data.orient`) whatever the run used:
a network trained on a store oriented ahead by ``orient_store`` is then scored on the
events as they are, turned as they are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lartpc import CLASSES, NUM_CLASSES
from lartpc.config import choices
from lartpc.errors import LartpcError

DY_BINS = (0.0, 0.5, 0.75, 1.0 + 1e-9)  #: |d_y| bins (the direction's component along the wires)


def predict(run: Path, store, threads: int = 1,
            orient: str | None = None) -> tuple[np.ndarray, ...]:
    """(store indices, predicted classes, truth directions) of ``run``'s held-out events
    in ``store`` (an EventStore), from its weights (``weights.pt``, else its checkpoint);
    ``orient`` replaces the run's ``data.orient`` (None: keep it)."""
    from lartpc.train import evaluate, weights

    p = evaluate.predict(weights.load(run), store, orient=orient, threads=threads)
    return p.positions, p.predicted, p.directions


def _share(mask: np.ndarray, right: np.ndarray) -> dict:
    n = int(mask.sum())
    return {"events": n, "accuracy": float(right[mask].mean()) if n else None}


def _calls(mask: np.ndarray, preds: np.ndarray) -> dict:
    """What the network called the events of ``mask``: share per class."""
    n = int(mask.sum())
    counts = np.bincount(preds[mask], minlength=NUM_CLASSES)
    return {c: float(k / n) if n else None for c, k in zip(CLASSES, counts, strict=True)}


def breakdown(store, ids: np.ndarray, preds: np.ndarray, direction: np.ndarray) -> dict:
    """The split described in the module docstring, of predictions ``preds`` for the
    events ``ids`` of ``store`` whose truth directions are ``direction`` (n, 3)."""
    from lartpc.sim.limits import event_masks

    masks = {k: v[ids] for k, v in event_masks(store).items()}
    labels = np.asarray(store.labels)[ids]
    right = preds == labels
    lost = masks["indistinguishable"]
    per_class = {}
    for i, cls in enumerate(CLASSES):
        m = labels == i
        rule = 1.0 - float(lost[m].mean()) if m.any() else None
        per_class[cls] = {
            **_share(m, right), "reference_rule_recall": rule,
            "classifiable": {**_share(m & ~lost, right), "called": _calls(m & ~lost, preds)},
            "indistinguishable": {**_share(m & lost, right), "called": _calls(m & lost, preds)},
        }
    tracks = ("muon", "pion", "kaon")
    stubs = {cls: masks["exit"] & (labels == CLASSES.index(cls)) for cls in tracks}
    pool = {cls: {"events": int(m.sum()), "called": _calls(m, preds)} for cls, m in stubs.items()}
    eg = np.isin(labels, [CLASSES.index("gamma"), CLASSES.index("electron")])
    dy = np.abs(direction[:, 1])
    by_dy = []
    for lo, hi in zip(DY_BINS[:-1], DY_BINS[1:], strict=True):
        sel = eg & (dy >= lo) & (dy < hi)
        row = {"dy_from": lo, "dy_to": min(hi, 1.0), "events": int(sel.sum())}
        for i, cls in ((0, "gamma"), (1, "electron")):
            row[cls] = _share(sel & (labels == i), right)["accuracy"]
        by_dy.append(row)
    conf = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
    np.add.at(conf, (labels, preds), 1)
    return {
        "events": len(ids), "accuracy": float(right.mean()),
        "classifiable": _share(~lost, right), "confusion": conf.tolist(),
        "per_class": per_class,
        "mip_stub_pool": {"events": sum(p["events"] for p in pool.values()), "by_class": pool},
        "electron_gamma_by_dy": by_dy,
    }


def format_table(res: dict) -> str:
    """The breakdown as plain text."""
    def pct(v: float | None) -> str:
        return "   -" if v is None else f"{100 * v:4.0f}"

    lines = [f"held-out events {res['events']}: accuracy {100 * res['accuracy']:.1f} %, on "
             f"the classifiable ones {100 * res['classifiable']['accuracy']:.1f} % "
             f"({res['classifiable']['events']})",
             "class     events  acc    rule  classifiable (acc)  indistinguishable (acc)"]
    for cls, c in res["per_class"].items():
        a, b = c["classifiable"], c["indistinguishable"]
        lines.append(f"{cls:9s} {c['events']:6d} {pct(c['accuracy'])} "
                     f"{pct(c['reference_rule_recall']):>7s}"
                     f"  {a['events']:6d} ({pct(a['accuracy'])})      {b['events']:6d} "
                     f"({pct(b['accuracy'])})")
    lines.append("MIP stubs (left without interacting), called (%): "
                 + " ".join(CLASSES))
    for cls, p in res["mip_stub_pool"]["by_class"].items():
        lines.append(f"  {cls:7s} {p['events']:5d}  " + " ".join(
            pct(p["called"][c]) for c in CLASSES))
    lines.append("electron/gamma by |d_y|: " + "; ".join(
        f"[{r['dy_from']:.2f}, {r['dy_to']:.2f}] n={r['events']} gamma {pct(r['gamma'])} "
        f"electron {pct(r['electron'])}" for r in res["electron_gamma_by_dy"]))
    return "\n".join(lines)


def _run_confusion(run: Path) -> list[list[int]] | None:
    """The run's last evaluation (``confusion.csv``), None when it has none."""
    from lartpc.analysis.csvread import read_confusion

    from lartpc.runfolder.schema import CONFUSION_CSV

    path = run / CONFUSION_CSV
    return read_confusion(path, CLASSES).tolist() if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.breakdown",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="run folder (its weights.pt or checkpoint.pt)")
    p.add_argument("store", type=Path, help="the event store the run was trained on")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (SCNet: 1 is fastest)")
    p.add_argument("--orient", choices=choices("data.orient"),
                   help="turn the events by this start-finding stage instead of the run's "
                        "data.orient (lartpc/data/orient.py)")
    args = p.parse_args(argv)
    from lartpc.data.store import EventStore

    try:
        store = EventStore(args.store)
        res = breakdown(store, *predict(args.run, store, args.threads, args.orient))
        recorded = _run_confusion(args.run)
    except (LartpcError, OSError) as e:
        print(f"breakdown: {e}", file=sys.stderr)
        return 2
    res = {"run": str(args.run), "store": str(args.store),
           **({"orient": args.orient} if args.orient else {}),
           "matches_run_confusion": recorded == res["confusion"], **res}
    print(format_table(res))
    if args.json:
        from lartpc.fsutil import atomic_write

        atomic_write(args.json, json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
