"""``lartpc evaluate RUN``: score a trained network on events, writing the confusion
matrix as JSON.

RUN is a run folder (its ``weights.pt``, else its ``checkpoint.pt``) or either file.
``--store`` scores events of a store on disk (by default the run's held-out events of
its own store: ``--split validation``, the events it was evaluated on while it trained,
or ``--split test``, those a run with ``data.test_fraction`` never saw nor scored);
``--regenerate DIR`` makes the run's held-out events of that split alone again (from
its record of how its events were made: seed, count, geometry; each event depends on
its seed and index only) and scores them, so a quoted number is reproduced without the
training events. With the held-out events of a run folder that has a
``confusion.csv``, the JSON says whether the two agree event for event in count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lartpc.config import choices
from lartpc.errors import LartpcError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run folder (weights.pt or checkpoint.pt), or either file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", help="event store to score (default: the run's held-out "
                                     "events of it, which must be the run's own store)")
    src.add_argument("--regenerate", metavar="DIR",
                     help="generate the run's held-out events alone into DIR, then score them")
    p.add_argument("--split", default="validation", choices=("validation", "test"),
                   help="which held-out events: validation (scored during training; the "
                        "default) or test (data.test_fraction: touched only here)")
    p.add_argument("--indices", default="held-out",
                   help="with --store: 'held-out' (default: the --split events), 'all', "
                        "A:B (store indices A to B-1) or i,j,k")
    p.add_argument("--orient", default=None, choices=choices("data.orient"),
                   help="start-finding stage instead of the run's data.orient")
    p.add_argument("--sparse", default=None, choices=choices("model.sparse"),
                   help="SCNet's layers by spconv or in torch operations (the same function "
                        "to rounding; ~2x faster on a CPU) instead of the run's model.sparse")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (SCNet: 1 is fastest)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes generating events (--regenerate)")
    p.add_argument("--json", help="write the result here (default: print it); an existing "
                                  "file is replaced only when it is an evaluation's JSON")
    p.add_argument("--overwrite", action="store_true",
                   help="with --regenerate: replace the event shards already in DIR")


def parse_indices(text: str, n: int):
    """Store indices of ``--indices`` for a store of ``n`` events (None: held-out)."""
    import numpy as np

    if text == "held-out":
        return None
    if text == "all":
        return np.arange(n)
    try:
        if ":" in text:
            a, b = (int(v) for v in text.split(":"))
            idx = np.arange(a, b)
        else:
            idx = np.array([int(v) for v in text.split(",")], np.int64)
    except ValueError:
        raise LartpcError(f"--indices {text!r}: held-out, all, A:B or i,j,k") from None
    if len(idx) == 0 or idx.min() < 0 or idx.max() >= n:
        raise LartpcError(f"--indices {text!r}: store indices 0..{n - 1}, one or more")
    return idx


def result(network: dict, preds, run: Path, held_out: bool, split: str = "validation") -> dict:
    """The JSON of one evaluation (see the module docstring)."""
    classes = preds.classes
    conf = preds.confusion()
    n, k = int(conf.sum()), int(conf.trace())
    recorded = None
    if held_out and split == "validation" and run.is_dir() and (run / "confusion.csv").is_file():
        from lartpc.analysis.csvread import read_confusion

        recorded = read_confusion(run / "confusion.csv", classes).tolist()
    from lartpc.analysis.metrics import binomial_se, wilson_interval

    return {
        "network": network["path"], "dtype": network["dtype"],
        "events": n, "accuracy": k / n if n else None,
        # binomial standard error and the 95 % Wilson score interval of the accuracy
        "accuracy_se": binomial_se(k / n, n) if n else None,
        "accuracy_wilson95": list(wilson_interval(k, n)) if n else None,
        "classes": list(classes),
        "confusion": conf.tolist(), "confusion_rows": "true class",
        "confusion_columns": "predicted class",
        "per_class": {c: (int(conf[i, i]) / int(conf[i].sum()) if conf[i].sum() else None)
                      for i, c in enumerate(classes)},
        "held_out": held_out, **({"split": split} if held_out else {}),
        **({"matches_run_confusion": recorded == conf.tolist()} if recorded else {}),
        "event_ids": preds.event_ids.tolist(), "labels": preds.labels.tolist(),
        "predicted": preds.predicted.tolist(),
    }


def is_result(data: bytes) -> bool:
    """Whether ``data`` is the JSON of an evaluation (:func:`result`)."""
    try:
        res = json.loads(data)
    except ValueError:
        return False
    return isinstance(res, dict) and {"network", "confusion", "accuracy"} <= res.keys()


def check_options(args: argparse.Namespace) -> None:
    """The options' checks, before torch is imported or anything is read."""
    if args.threads < 1 or args.workers < 1:
        raise LartpcError("--threads and --workers: at least 1")
    if args.regenerate and args.indices != "held-out":
        raise LartpcError("--indices: only with --store (--regenerate makes the held-out "
                          "events)")
    if args.overwrite and not args.regenerate:
        raise LartpcError("--overwrite: only with --regenerate")
    if args.regenerate and not args.overwrite:
        from lartpc.data.staging import existing_shards

        old = existing_shards(Path(args.regenerate)) if Path(args.regenerate).is_dir() else []
        if old:
            raise LartpcError(f"--regenerate {args.regenerate}: already holds {len(old)} "
                              "event shard(s); choose an empty folder or add --overwrite")
    if args.json:
        from lartpc.fsutil import check_replaceable

        check_replaceable(args.json, "--json", "lartpc evaluate result", is_result)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    from lartpc.data.store import EventStore  # torch, after the options' checks
    from lartpc.train import evaluate, weights

    network = weights.load(args.run)
    if args.regenerate:
        evaluate.regenerate_held_out(network, args.regenerate, args.workers, args.split,
                                     overwrite=args.overwrite)
        store = EventStore(args.regenerate)
        positions = list(range(len(store)))
        held_out = True
    else:
        store = EventStore(args.store)
        positions = parse_indices(args.indices, len(store))
        held_out = positions is None
    preds = evaluate.predict(network, store, positions, orient=args.orient,
                             threads=args.threads, split=args.split, sparse=args.sparse)
    res = result(network, preds, Path(args.run), held_out, args.split)
    text = json.dumps(res, indent=1) + "\n"
    if args.json:
        from lartpc.fsutil import atomic_write

        try:
            atomic_write(Path(args.json), text)
        except OSError as e:
            raise LartpcError(f"--json {args.json}: cannot write ({e.strerror or e})") from None
        print(f"{res['events']} events, accuracy {res['accuracy']:.4f}"
              + (f", matches the run's confusion.csv: {res['matches_run_confusion']}"
                 if "matches_run_confusion" in res else "") + f"; {args.json}")
    else:
        print(text, end="")
    return 0
