"""The local study (``make demo``): the paper's experiment in miniature on this machine.

Simulates a small downsampled event set, trains JishNet and SCNet on 1 and 2 Horovod
ranks under the same wall-clock limit per run (the paper's 4 h, scaled down), and
writes the analysis report. Re-running reuses finished pieces.

    python -m jobs.local.study --out demo [--events 350] [--minutes-per-run 2.5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _say(msg: str) -> None:
    print(f"[study {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _tool(name: str) -> str:
    exe = BIN / name
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def _run(cmd: list[str]) -> None:
    _say("$ " + " ".join(cmd))
    r = subprocess.run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"study: command failed with exit code {r.returncode}: {' '.join(cmd)}")


def _events(out: Path, n: int, downsample: int, seed: int) -> Path:
    data = out / "events"
    if data.exists():
        from lartpc.data.store import EventStore

        store = EventStore(data)
        if len(store) == n and store.geometry.downsample == downsample:
            _say(f"reusing {n} events in {data}")
            return data
        _say(f"{data} holds other events; making new ones")
        shutil.rmtree(data)
    _run([_tool("lartpc"), "simulate", "--out", str(data), "--events", str(n), "--downsample",
          str(downsample), "--seed", str(seed), "--workers", "2"])
    return data


def _train(data: Path, run: Path, model: str, ranks: int, limit_s: float, seed: int) -> None:
    info = run / "run.json"
    if info.exists() and json.loads(info.read_text()).get("status") in ("completed",
                                                                          "time_limit"):
        _say(f"reusing finished run {run}")
        return
    if run.exists():
        shutil.rmtree(run)  # an interrupted demo run: start it again, it is ours
    _say(f"training {model} on {ranks} Horovod rank(s) for up to {limit_s:.0f} s -> {run}")
    _run([_tool("horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
          _tool("lartpc"), "train", "--config", f"tiny-{model}", "--data", str(data),
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
    data = _events(args.out, args.events, args.downsample, args.seed)
    runs = args.out / "runs"
    for model in args.models.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            _train(data, runs / f"{model}-n{n}-s{args.seed}", model, n,
                   60 * args.minutes_per_run, args.seed)
    report = args.out / "report"
    _run([sys.executable, "-m", "analysis", "report", str(runs), "--out", str(report)])
    _run([sys.executable, "-m", "analysis", "fit", str(runs)])
    for line in _summary(runs):
        _say(line)
    _say(f"done in {(time.time() - t0) / 60:.1f} min; report: {(report / 'report.html').resolve()}")
    return 0


def _summary(runs: Path) -> list[str]:
    """What this machine's runs really show (the report opens with the same lines)."""
    from analysis.glance import at_a_glance
    from analysis.predict_report import local_prediction
    from analysis.runs import RunFolderError
    from analysis.tables import analyse

    a = analyse([runs])
    try:
        predictions = local_prediction(a.runs, a.threshold, a.smooth)[0]
    except RunFolderError:  # no noise scale to predict from: the other lines stand
        predictions = []
    return at_a_glance(a, predictions)


if __name__ == "__main__":
    sys.exit(main())
