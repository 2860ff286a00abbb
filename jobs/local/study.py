"""The local study (``make demo``): the paper's experiment in miniature on this machine.

Simulates a small downsampled event set, trains JishNet and SCNet on 1 and 2 Horovod
ranks under the same wall-clock limit per run (the paper's 4 h, scaled down), and
writes the analysis report. Re-running reuses finished pieces.

    python -m lartpc.jobs.local.study --out demo [--events 350] [--minutes-per-run 2.5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from lartpc.jobs.local.steps import events, run, say, tool

from lartpc.bench.train import LARTPC
from lartpc.runfolder.record import read_record, record_path
from lartpc.runfolder.schema import Status

TAG = "study"


def _say(msg: str) -> None:
    say(TAG, msg)


def _run(cmd: list[str]) -> None:
    run(TAG, cmd)


def _train(data: Path, run: Path, model: str, ranks: int, limit_s: float, seed: int) -> None:
    if record_path(run).exists() and read_record(run).get("status") in (Status.COMPLETED,
                                                                         Status.TIME_LIMIT):
        _say(f"reusing finished run {run}")
        return
    if run.exists():
        shutil.rmtree(run)  # an interrupted demo run: start it again, it is ours
    _say(f"training {model} on {ranks} Horovod rank(s) for up to {limit_s:.0f} s -> {run}")
    _run([tool("horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
          *LARTPC, "train", "--config", f"tiny-{model}", "--data", str(data),
          "--out", str(run), "--set", f"train.time_limit_s={limit_s}",
          "--set", "train.epochs=1000", "--set", f"train.seed={seed}",
          # One core per rank, as one GPU per rank in the paper: N ranks use N cores,
          # so the scaling measured is that of adding workers, not of sharing cores.
          "--set", "train.threads=1",
          # noise.csv for the report's prediction, from every run (1 rank: halves)
          "--set", f"train.noise_scale={'halves' if ranks == 1 else 'ranks'}"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("demo"))
    ap.add_argument("--events", type=int, default=350)
    ap.add_argument("--downsample", type=int, default=4)
    ap.add_argument("--minutes-per-run", type=float, default=2.5)
    ap.add_argument("--models", default="jishnet,scnet")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    data = events(TAG, args.out / "events", args.events, downsample=args.downsample,
                  seed=args.seed, workers=2)
    runs = args.out / "runs"
    for model in args.models.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            _train(data, runs / f"{model}-n{n}-s{args.seed}", model, n,
                   60 * args.minutes_per_run, args.seed)
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
