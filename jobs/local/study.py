"""The local study (``make demo``): the paper's experiment in miniature on this machine.

Simulates a small downsampled event set, trains JishNet and SCNet on 1 and 2 Horovod
ranks under the same wall-clock limit per run (the paper's 4 h, scaled down), and
writes the analysis report. Re-running reuses finished pieces: the events when they
are the ones asked for, a finished run when it was made from these events with the
settings the study gives it now. Another finished run (other ``--events``,
``--downsample``, ``--minutes-per-run``, ``--seed``, preset...) is moved, whole, to
``OUT/stale-runs/`` (one line says why) and trained again, as is a run that was
interrupted before it finished: the report and the fit read only ``OUT/runs/``.

    python -m lartpc.jobs.local.study --out demo [--events 350] [--minutes-per-run 2.5]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from lartpc.jobs.local.steps import events, run, say, tool

from lartpc.bench.train import LARTPC
from lartpc.config import Config, load_config
from lartpc.data.store import EventStore
from lartpc.errors import LartpcError
from lartpc.geometry import Geometry
from lartpc.models import MODELS
from lartpc.runfolder.record import flat, read_record, record_path
from lartpc.runfolder.schema import Status
from lartpc.train.plan import plan_run
from lartpc.train.segments import ABSENT_MEANS, store_identity

TAG = "study"


def _say(msg: str) -> None:
    say(TAG, msg)


def _run(cmd: list[str]) -> None:
    run(TAG, cmd)


def _sets(args: argparse.Namespace, ranks: int) -> list[str]:
    """The ``--set`` overrides of the study's training on ``ranks`` ranks."""
    return [f"data.downsample={args.downsample}",
            # to the millisecond: 60 x 0.12 min is 7.2 s, not 7.199999999999999
            f"train.time_limit_s={round(60 * args.minutes_per_run, 3)}", "train.epochs=1000",
            f"train.seed={args.seed}",
            # One core per rank, as one GPU per rank in the paper: N ranks use N cores,
            # so the scaling measured is that of adding workers, not of sharing cores.
            "train.threads=1",
            # noise.csv for the report's prediction, from every run (1 rank: halves)
            f"train.noise_scale={'halves' if ranks == 1 else 'ranks'}"]


def _check(args: argparse.Namespace) -> None:
    """Refuse, before anything is simulated, options no training of the study can use.

    Raises
    ------
    LartpcError
        Naming the option: a model that is not one, a downsample that does not divide
        the image or leaves a model's four poolings nothing, a bad setting.
    """
    try:
        side = Geometry(downsample=args.downsample).height
    except ValueError as e:  # "downsample=7: must be a positive divisor of 3600"
        raise LartpcError(f"--{e}") from None
    for model in args.models.split(","):
        if model not in MODELS:
            raise LartpcError(f"--models: unknown model {model!r}: choose from "
                              f"{', '.join(MODELS)}")
        module = importlib.import_module(MODELS[model][0])
        try:  # each model module's trunk_shape: its last pooled map's size
            module.trunk_shape((side, side))
        except LartpcError as e:
            raise LartpcError(f"--downsample {args.downsample}: {e}; choose a smaller "
                              "--downsample") from None
        load_config(f"tiny-{model}", _sets(args, 1))


def _differs(info: dict, data: Path, store: EventStore, cfg: Config, ranks: int) -> str:
    """Why the finished run of record ``info`` (its run.json) is not what the study would
    train now: another store (``store``, opened from ``data``), world size or config
    ('' when it is the same)."""
    now = store_identity(store, cfg.data.max_events)
    had = info.get("store") or {}
    if had != now:
        return (f"made from other events ({had.get('events')}, hash "
                f"{str(had.get('sha256'))[:12]}; {data} holds {now['events']}, hash "
                f"{now['sha256'][:12]})")
    if info.get("world_size") != ranks:
        return f"made on {info.get('world_size')} ranks, not {ranks}"
    want = flat(json.loads(json.dumps(cfg.to_dict(), default=str)))
    # a key the run's record lacks is one an older lartpc did not have yet: the
    # behaviour it kept is its default (as a resume reads it, ABSENT_MEANS)
    have = {**ABSENT_MEANS, **flat(info.get("config") or {})}
    diff = [f"{k}={have[k]!r} (now {want[k]!r})"
            for k in sorted(set(want) & set(have)) if have[k] != want[k]]
    return f"made with other settings: {', '.join(diff)}" if diff else ""


def _set_aside(run: Path, aside: Path, why: str) -> None:
    """Move ``run`` into the folder ``aside`` (never delete a finished run)."""
    aside.mkdir(parents=True, exist_ok=True)
    stem = f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    target, n = aside / stem, 1
    while target.exists():
        target, n = aside / f"{stem}-{n}", n + 1
    run.rename(target)
    _say(f"{run} was {why}: moved to {target}; training it again")


def _train(data: Path, store: EventStore, run: Path, model: str, ranks: int,
           sets: list[str], aside: Path) -> None:
    cfg = load_config(f"tiny-{model}", sets)
    info = read_record(run) if record_path(run).exists() else {}
    if info.get("status") in (Status.COMPLETED, Status.TIME_LIMIT):
        why = _differs(info, data, store, cfg, ranks)
        if not why:
            _say(f"reusing finished run {run}")
            return
        _set_aside(run, aside, why)
    elif run.exists():  # an interrupted run: kept aside, as a finished one would be
        _set_aside(run, aside, f"left {info.get('status') or 'unfinished'} (interrupted)")
    _say(f"training {model} on {ranks} Horovod rank(s) for up to "
         f"{cfg.train.time_limit_s:.0f} s -> {run}")
    _run([tool("horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
          *LARTPC, "train", "--config", f"tiny-{model}", "--data", str(data),
          "--out", str(run), *(a for s in sets for a in ("--set", s))])


def _check_split(store: EventStore, args: argparse.Namespace) -> None:
    """Refuse, before any training, events every training of the study cannot split
    (too few to leave an evaluation event, or a training event for every rank): the
    training's own check, which under horovodrun would end in its traceback."""
    for model in args.models.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            plan_run(load_config(f"tiny-{model}", _sets(args, n)), store, n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("demo"))
    ap.add_argument("--events", type=int, default=350)
    ap.add_argument("--downsample", type=int, default=4,
                    help="bin factor of the 3600x3600 images: a divisor of 3600 that "
                         "leaves every model's poolings a map (SCNet: at most 9, JishNet 12)")
    ap.add_argument("--minutes-per-run", type=float, default=2.5)
    ap.add_argument("--models", default="jishnet,scnet")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        _check(args)
    except LartpcError as e:
        ap.error(str(e))
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    data = events(TAG, args.out / "events", args.events, downsample=args.downsample,
                  seed=args.seed, workers=2)
    runs = args.out / "runs"
    try:
        store = EventStore(data)  # opened once: every training's check and reuse read it
        _check_split(store, args)
    except LartpcError as e:
        ap.exit(2, f"{ap.prog}: error: {data}: {e}\n")
    for model in args.models.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            _train(data, store, runs / f"{model}-n{n}-s{args.seed}", model, n, _sets(args, n),
                   args.out / "stale-runs")
    report = args.out / "report"
    _run([sys.executable, "-m", "lartpc.analysis", "report", str(runs), "--out", str(report)])
    _run([sys.executable, "-m", "lartpc.analysis", "fit", str(runs)])
    for line in _summary(runs):
        _say(line)
    _say(f"done in {(time.time() - t0) / 60:.1f} min; report: {(report / 'report.html').resolve()}")
    return 0


def _summary(runs: Path) -> list[str]:
    """What this machine's runs really show (the report opens with the same lines)."""
    from lartpc.analysis.glance import at_a_glance
    from lartpc.analysis.predict_report import local_prediction
    from lartpc.analysis.runs import RunFolderError
    from lartpc.analysis.tables import analyse

    a = analyse([runs])
    try:
        predictions = local_prediction(a.runs, a.threshold, a.smooth)[0]
    except RunFolderError:  # no noise scale to predict from: the other lines stand
        predictions = []
    return at_a_glance(a, predictions)


if __name__ == "__main__":
    sys.exit(main())
