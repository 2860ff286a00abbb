"""Can the study's networks memorise a few hundred raw isotropic events? (issue 39)

    python -m lartpc.jobs.local.isotropic_memorise --work DIR --json OUT
        [--events 600] [--held-out 100] [--downsample 8] [--minutes 11]
        [--jishnet-minutes 11] [--variants NAME,...] [--stop-by HH:MM]

On raw isotropic events the paper's recipe gives 45-52 % held-out accuracy with e/gamma
at chance, and on a GPU the network did not fit its own training events. This job asks,
at reduced size on the CPU, whether it can fit a *small* training set at all, and which
single change makes a difference. It makes two stores of ``--events`` events (isotropic
and beam geometry, the same seed and downsample), then trains each variant in turn
with ``lartpc train`` on ONE thread for a fixed wall-time limit:

* ``scnet-iso``: the paper's SCNet recipe (flatten head, Adam lr 1e-3, the paper's
  softmax loss, minibatch 7) on isotropic events: the baseline;
* ``scnet-iso-maxhead``: the same with ``model.head=max``;
* ``scnet-iso-lr1e-4``: the same with ``train.lr=1e-4``;
* ``scnet-beam``: the baseline on beam-geometry events (known to train): the control
  that tells "cannot memorise" from "too little budget";
* ``jishnet-iso``: JishNet (dense) instead of SCNet, same events (slower per image: it
  gets ``--jishnet-minutes``);
* ``scnet-beam-ce`` and ``scnet-iso-ce``: the control and the baseline with
  ``model.loss=ce`` (cross-entropy on logits instead of on softmax outputs: with the
  paper's loss a class whose probability collapses gets almost no gradient back);
* ``scnet-iso-sgd``: the optimiser: SGD with momentum 0.9 instead of Adam, at lr 0.01
  (SGD at Adam's 1e-3 barely moves in this budget: the one change is the optimiser
  with a learning rate of its own).

More events (``--events 2400 --held-out 400``) and another receptive field
(``--downsample 4``: the same network sees a region half as wide in cm, as each pixel
is half as wide) are further invocations of the same variants.

``--held-out`` of the events are held out by the run's own split
(``data.eval_fraction``); the rest are the training events. After each run its last
checkpoint is scored (:func:`lartpc.train.evaluate.predict`, evaluation mode, each event
once) on its *training* events and on its held-out events: accuracy, per-class recall,
confusion matrix. The learning curve is the running training accuracy and loss per epoch
(``rank-000.csv``: minibatch means while the weights change) and the held-out accuracy
(``eval.csv``). The JSON at ``--json`` is rewritten after every variant, so a job cut
short keeps what it finished; a variant whose run folder exists is scored, not trained
again; ``--stop-by`` (UTC) skips a variant that could not finish in time.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lartpc import CLASSES
from lartpc.sim.versions import LATEST, PHYSICS

#: name -> (config preset, store geometry, --set overrides beyond the common ones)
VARIANTS = {
    "scnet-iso": ("paper-scnet", "isotropic", []),
    "scnet-beam": ("paper-scnet", "beam", []),
    "scnet-iso-maxhead": ("paper-scnet", "isotropic", ["model.head=max"]),
    "scnet-iso-lr1e-4": ("paper-scnet", "isotropic", ["train.lr=0.0001"]),
    "jishnet-iso": ("paper-jishnet", "isotropic", []),
    "scnet-beam-ce": ("paper-scnet", "beam", ["model.loss=ce"]),
    "scnet-iso-ce": ("paper-scnet", "isotropic", ["model.loss=ce"]),
    "scnet-iso-sgd": ("paper-scnet", "isotropic", ["train.optimizer=sgd", "train.lr=0.01"]),
}
CURVE_POINTS = 12  #: learning-curve points kept per run (evenly spaced epochs, and the last)


def make_store(out: Path, geometry: str, events: int, seed: int, downsample: int,
               physics: str) -> None:
    """The store at ``out``: reused when it is exactly these events (the generator's
    ``physics`` version among them), else made again (``jobs/local/steps.events``)."""
    from lartpc.jobs.local.steps import events as make_events

    make_events("memorise", out, events, downsample=downsample, seed=seed, workers=1,
                extra=("--source-geometry", geometry), expect={"source_geometry": geometry},
                physics=physics)


def common_overrides(args, minutes: float) -> list[str]:
    limit = 60.0 * minutes
    return [f"data.downsample={args.downsample}",
            f"data.eval_fraction={args.held_out / args.events}",
            "train.threads=1", "train.device=cpu", "train.seed=0",
            f"train.time_limit_s={limit}", f"train.budget_s={limit}",
            "train.epochs=100000", "train.eval_every_images=0",
            f"train.eval_every_epochs={args.eval_every_epochs}",
            "train.progress_every_s=60", "train.checkpoint_every_s=100000"]


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def training_curve(run: Path) -> list[dict]:
    """Per epoch (evenly thinned): images seen, mean running training loss and accuracy."""
    rows = _rows(run / "rank-000.csv")
    by_epoch: dict[int, list[dict]] = {}
    for r in rows:
        by_epoch.setdefault(int(r["epoch"]), []).append(r)
    epochs = sorted(by_epoch)
    seen, curve = 0, []
    for e in epochs:
        rs = by_epoch[e]
        seen += sum(int(r["data_size"]) for r in rs)
        curve.append({"epoch": e, "images": seen, "steps": len(rs),
                      "train_loss": float(np.mean([float(r["local_loss"]) for r in rs])),
                      "train_acc_running": float(np.mean([float(r["local_acc"]) for r in rs]))})
    return thin(curve)


def thin(curve: list) -> list:
    if len(curve) <= CURVE_POINTS:
        return curve
    keep = sorted(set(np.linspace(0, len(curve) - 1, CURVE_POINTS).round().astype(int)))
    return [curve[i] for i in keep]


def held_out_curve(run: Path) -> list[dict]:
    path = run / "eval.csv"
    if not path.is_file():
        return []
    return thin([{"epoch": int(r["epoch"]), "images": int(r["images"]),
                  "loss": float(r["loss"]), "accuracy": float(r["accuracy"])}
                 for r in _rows(path)])


def score(run: Path, store, positions: np.ndarray) -> dict:
    """Accuracy, per-class recall and confusion of the run's last checkpoint on
    ``positions`` of ``store`` (evaluation mode, one thread, each event once)."""
    from lartpc.train import evaluate, weights

    p = evaluate.predict(weights.load(run), store, positions, threads=1)
    conf = p.confusion()
    recall = {c: (int(conf[i, i]) / int(conf[i].sum()) if conf[i].sum() else None)
              for i, c in enumerate(p.classes)}
    return {"events": int(conf.sum()), "accuracy": float(conf.trace() / conf.sum()),
            "recall": recall, "confusion": conf.tolist()}


def split(run: Path, store) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) store indices of the run, from its own config."""
    from lartpc.config import config_from_dict
    from lartpc.train import evaluate

    cfg = config_from_dict(json.loads((run / "run.json").read_text())["config"], str(run))
    held = np.sort(evaluate.held_out(cfg, store.labels))
    n = min(len(store), cfg.data.max_events) if cfg.data.max_events else len(store)
    return np.setdiff1d(np.arange(n), held), held


def run_variant(name: str, args, work: Path, stores: dict) -> dict:
    from lartpc.data.store import EventStore

    preset, geometry, extra = VARIANTS[name]
    minutes = args.jishnet_minutes if preset.endswith("jishnet") else args.minutes
    overrides = common_overrides(args, minutes) + extra
    run = work / f"run-{name}"
    if not (run / "run.json").is_file():
        cmd = [sys.executable, "-m", "lartpc", "train", "--config", preset,
               "--data", str(stores[geometry]), "--out", str(run)]
        for o in overrides:
            cmd += ["--set", o]
        with open(work / f"{name}.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    info = json.loads((run / "run.json").read_text())
    store = EventStore(stores[geometry])
    train_idx, held_idx = split(run, store)
    t1 = time.time()
    on_train = score(run, store, train_idx)
    on_held = score(run, store, held_idx)
    curve = training_curve(run)
    last = curve[-1] if curve else {}
    conf = np.array(on_train["confusion"])
    g, e = CLASSES.index("gamma"), CLASSES.index("electron")
    return {
        "variant": name, "preset": preset, "geometry": geometry, "overrides": overrides,
        "changed_from_baseline": (
            extra + ([f"geometry={geometry}"] if geometry != "isotropic" else [])
            + ([f"model={preset}"] if preset != "paper-scnet" else [])),
        "train_events": len(train_idx), "held_out_events": len(held_idx),
        "status": info.get("status"), "images_seen": last.get("images"),
        "steps": sum(1 for _ in open(run / "rank-000.csv")) - 1,
        "epochs": (last.get("epoch", -1) + 1) if curve else 0,
        "train_time_s": info.get("train_time_s"), "eval_time_s": info.get("eval_time_s"),
        "wall_s": round(info["end_time"] - info["start_time"], 1),
        "score_wall_s": round(time.time() - t1, 1),
        "final_train_loss_running": last.get("train_loss"),
        "final_train_acc_running": last.get("train_acc_running"),
        "train_accuracy": on_train["accuracy"], "train_recall": on_train["recall"],
        "train_confusion": on_train["confusion"],
        "train_e_gamma": {"gamma_as_gamma": int(conf[g, g]), "gamma_as_e": int(conf[g, e]),
                          "e_as_e": int(conf[e, e]), "e_as_gamma": int(conf[e, g])},
        "held_out_accuracy": on_held["accuracy"], "held_out_recall": on_held["recall"],
        "held_out_confusion": on_held["confusion"],
        "curve": curve, "held_out_curve": held_out_curve(run),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="folder for the stores and run folders")
    ap.add_argument("--json", required=True, help="results JSON (rewritten per variant)")
    ap.add_argument("--events", type=int, default=600, help="events per store")
    ap.add_argument("--held-out", type=int, default=100, help="of which held out")
    ap.add_argument("--downsample", type=int, default=8)
    ap.add_argument("--seed", type=int, default=101, help="store seed (both geometries)")
    ap.add_argument("--physics", choices=tuple(PHYSICS), default=LATEST,
                    help="the generator's physics version (docs/results/isotropic-memorise"
                         ".json was made with sim3)")
    ap.add_argument("--minutes", type=float, default=11.0, help="wall limit per run")
    ap.add_argument("--jishnet-minutes", type=float, default=11.0)
    ap.add_argument("--eval-every-epochs", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, in order (default {','.join(VARIANTS)})")
    ap.add_argument("--stop-by", help="UTC HH:MM: skip a variant that could not end by then")
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    geometries = sorted({VARIANTS[v][1] for v in names})
    stores = {g: work / f"{g}-ds{args.downsample}-{args.events}" for g in geometries}
    for g, path in stores.items():
        make_store(path, g, args.events, args.seed, args.downsample, args.physics)
    out = {"what": "training accuracy of small runs on their own training events (issue 39)",
           "hardware": "CPU, one thread per run, one run at a time",
           "image_size": 3600 // args.downsample, "downsample": args.downsample,
           "events": args.events, "held_out": args.held_out, "store_seed": args.seed,
           "physics": args.physics,
           "minutes_scnet": args.minutes, "minutes_jishnet": args.jishnet_minutes,
           "command": "python -m lartpc.jobs.local.isotropic_memorise "
                      + " ".join(a for a in (argv if argv is not None else sys.argv[1:])),
           "variants": [], "skipped": []}
    deadline = None
    if args.stop_by:
        hh, mm = (int(x) for x in args.stop_by.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        deadline = now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    for name in names:
        preset = VARIANTS[name][0]
        minutes = args.jishnet_minutes if preset.endswith("jishnet") else args.minutes
        if deadline and time.time() + 60 * minutes + 60 > deadline:
            out["skipped"].append(name)
            print(f"{name}: skipped (would end after {args.stop_by} UTC)", flush=True)
        else:
            res = run_variant(name, args, work, stores)
            out["variants"].append(res)
            print(f"{name}: {res['images_seen']} images, training accuracy "
                  f"{res['train_accuracy']:.3f}, held-out {res['held_out_accuracy']:.3f}, "
                  f"recall {res['train_recall']}", flush=True)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
