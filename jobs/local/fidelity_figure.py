"""The README's fidelity figure: the fidelity runs' confusion matrices beside Table 1's
and, per class, accuracy against the events' reference rule (truth limits: a rule on
truth, not a bound) and the paper::

    python -m lartpc.jobs.local.fidelity_figure docs/results/fidelity-scnet-beam-finetuned.json \
        docs/results/fidelity-scnet-isotropic-120k.json \
        docs/results/fidelity-scnet-isotropic-three-splits.json \
        --out docs/img/fidelity-scnet.png

Each file is a results JSON of ``python -m lartpc.jobs.local.fidelity`` (an interim
one too); the runs must be of one model, whose Table 1 row the figure shows. A run
with a test split is shown by its test numbers, and its legend says so (``(test events)``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from lartpc.analysis.paper import PAPER
from lartpc.analysis.plots import fidelity
from lartpc.analysis.runs import CLASSES

#: what a results file must hold for the figure
NEEDED = ("model", "confusion_percent", "per_class", "overall", "truth_limits")


def geometry(res: dict) -> str:
    """The events' source geometry (results from before it was recorded: the run's
    folder name, run-MODEL-GEOMETRY)."""
    found = re.search(r"run-[a-z]+-([a-z]+)", res.get("run", ""))
    return res.get("geometry") or (found.group(1) if found else "?")


def load(path: Path) -> dict:
    """A fidelity results JSON, checked for what the figure reads."""
    try:
        res = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a results JSON ({e})") from None
    missing = [k for k in NEEDED if not isinstance(res, dict) or k not in res]
    if missing:
        raise ValueError(f"{path}: not a fidelity results JSON (no {', '.join(missing)})")
    absent = [c for c in CLASSES if c not in res["per_class"]
              or c not in res["truth_limits"].get("classes", {})]
    if absent:
        raise ValueError(f"{path}: per_class or truth_limits lacks {', '.join(absent)}")
    return scored_on_test(res) if "test" in res else res


def scored_on_test(res: dict) -> dict:
    """A run with a test split as the figure shows it: its test events' numbers (scored
    once), in place of the validation ones it was evaluated on while training."""
    test = res["test"]
    percent = [[round(100 * v / max(1, sum(row)), 1) for v in row] for row in test["confusion"]]
    return {**res, "confusion": test["confusion"], "confusion_percent": percent,
            "per_class": test["per_class"], "overall": test["overall"], "split_shown": "test"}


def label(res: dict) -> str:
    """What the figure calls a run: geometry, hours of training over every stage that
    led to it (``cumulative_training_s``; with the last stage's when they differ; a
    results file from before it was recorded: this run's, said to be fine-tuned) and
    whether the results are interim."""
    own = res.get("training_s", 0) / 3600
    total = res.get("cumulative_training_s")
    if total is not None:
        total /= 3600
        trained = (f"{total:.1f} h in all ({own:.1f} h last stage)"
                   if round(total, 1) != round(own, 1) else f"{total:.1f} h")
    else:
        trained = f"fine-tuned {own:.1f} h" if res.get("init_from") else f"{own:.1f} h"
    side = 3600 // res.get("downsample", 1)
    extra = ([f"{side}x{side}"] if side != 3600 else []) \
        + ([f"{res['head']} head"] if res.get("head", "flatten") != "flatten" else []) \
        + (["oriented"] if res.get("oriented_by") or res.get("orient", "none") != "none"
           else []) \
        + ([f"{res['augment']} augmentation"] if res.get("augment", "none") != "none" else [])
    return ", ".join([geometry(res), "CPU", trained, *extra]) \
        + (" (interim)" if res.get("interim") else "") \
        + (" (test events)" if res.get("split_shown") == "test" else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+", help="fidelity results JSON files")
    ap.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = ap.parse_args(argv)
    try:
        runs = [load(p) for p in args.results]
    except ValueError as e:
        ap.exit(2, f"fidelity_figure: {e}\n")
    models = {r["model"] for r in runs}
    if len(models) != 1:
        ap.exit(2, f"fidelity_figure: the results are of {', '.join(sorted(models))}: "
                   "give one model's runs\n")
    model = models.pop()
    paper = PAPER[model]
    fidelity([(label(r), r) for r in runs],
             (f"paper, Table 1 ({paper['accuracy_gpus']} GPUs)", paper["confusion_percent"],
              paper["accuracy"]), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
