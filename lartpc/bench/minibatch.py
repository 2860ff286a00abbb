"""``lartpc bench minibatch``: throughput and time-to-loss against the minibatch size.

The paper left open whether SCNet, cheap per image, would reach a loss sooner with
larger minibatches than its 7 per GPU. Each point here is a real single-process
``lartpc train`` of ``--seconds`` on the same events, at minibatch B and learning rate
``lr x f(B / base)`` (``--lr-scaling``: none, linear or sqrt), one run per seed. From
its run folder come images/s (median step time, and the epoch rate) and TTL, on the
training clock: data loading plus the steps' own time (evaluation and checkpoints left
out) until the smoothed training loss is below ``--threshold``, censored when the time
ran out first. Beside each point's median step
is its bare step (:mod:`lartpc.bench.bare_step`, as in ``lartpc bench train``) and the
loop's overhead over it (``--bare-steps 0``: none).

One JSON object goes to stdout; with ``--out DIR`` the run folders are kept there with
``minibatch.json``, ``minibatch.csv``, ``minibatch.md`` and ``minibatch.png`` (images/s,
smoothed loss against wall time, TTL). ``--from DIR`` measures the runs of such a
finished scan again, without training, at another ``--threshold``: a scan whose runs
all stayed above 1.2 can still be compared at a loss they reached.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lartpc.cliparse import add_batch_per_rank, check_positive, check_positive_finite
from lartpc.config import choices
from lartpc.errors import LartpcError
from lartpc.fsutil import atomic_write

DEVICES = choices("train.device", without=("auto",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=choices("model.name"), default="scnet")
    add_batch_per_rank(parser, default="7,14,28,56,112,256", type=str, old="--batches",
                       help="comma-separated minibatch sizes (train.batch_per_rank)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (runs per size)")
    parser.add_argument("--base-batch", type=int, default=7,
                        help="the minibatch the config's learning rate is meant for")
    parser.add_argument("--lr-scaling", choices=choices("train.lr_scaling"), default="sqrt",
                        help="learning rate x (B / base)^p, p = 0, 1 or 1/2 (default sqrt)")
    parser.add_argument("--threshold", type=float, default=1.2,
                        help="TTL loss threshold (the paper's 1.2 with its loss)")
    parser.add_argument("--data", type=Path, help="event folder (default: simulate one)")
    parser.add_argument("--events", type=int, default=700, help="events to simulate")
    parser.add_argument("--downsample", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=120.0, help="time limit per run")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--config", default=None,
                        help="training preset or TOML file (default tiny-MODEL)")
    parser.add_argument("--loader", default="auto",
                        choices=choices("data.loader"))
    parser.add_argument("--out", type=Path, default=None,
                        help="keep run folders, table and plot here (a new folder)")
    parser.add_argument("--from", dest="from_dir", type=Path, default=None,
                        help="a finished scan's --out folder: measure its runs again at "
                             "--threshold instead of training")
    parser.add_argument("--bare-steps", type=int, default=30,
                        help="timed bare steps beside each training (0: none)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE")


def scaled_lr(base_lr: float, batch: int, base_batch: int, scaling: str) -> float:
    power = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}[scaling]
    return base_lr * (batch / base_batch) ** power


def _median(values) -> float | None:
    """The median of the values measured (None: not measured, left out); None when no
    run measured it."""
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def summarise(points: list[dict]) -> list[dict]:
    """One row per minibatch size: medians over seeds; TTL median only when every seed
    got there, else the number that did and the smallest censored bound."""
    rows = []
    for b in sorted({p["batch_per_rank"] for p in points}):
        ps = [p for p in points if p["batch_per_rank"] == b]
        ttls = [p["ttl_s"] for p in ps if not p["ttl_censored"]]
        bounds = [p["ttl_lower_bound_s"] for p in ps if p["ttl_censored"]]
        rows.append({
            "batch_per_rank": b, "lr": ps[0]["lr"], "runs": len(ps),
            "images_per_s": _median(p["images_per_s_steps"] for p in ps),
            "images_per_s_epochs": _median(p["images_per_s"] for p in ps),
            "step_s": _median(p["step_s_median"] for p in ps),
            "data_wait_fraction": _median(p["data_wait_fraction"] for p in ps),
            "loop_overhead": _median(p["loop_overhead"] for p in ps)
            if all("loop_overhead" in p for p in ps) else None,
            "ttl_reached": len(ttls),
            "ttl_s": statistics.median(ttls) if len(ttls) == len(ps) else None,
            "ttl_s_all": [p["ttl_s"] for p in ps],
            "ttl_censored_bound_s": min(bounds) if bounds else None,
            "final_loss_smoothed": statistics.median(
                p["final_loss_smoothed"] for p in ps if p["final_loss_smoothed"] is not None)
            if any(p["final_loss_smoothed"] is not None for p in ps) else None,
            "accuracy": statistics.median(p["accuracy"] for p in ps
                                          if p["accuracy"] is not None)
            if any(p["accuracy"] is not None for p in ps) else None,
        })
    return rows


def markdown(result: dict) -> str:
    head = (f"{result['model']} minibatch scan on {result['device']} "
            f"({result['image_size']}x{result['image_size']}, {result['seconds_per_run']:g} s "
            f"per run, lr x (B/{result['base_batch']})^"
            f"{ {'none': 0, 'linear': 1, 'sqrt': 0.5}[result['lr_scaling']]}, "
            f"TTL threshold {result['threshold']:g})"
            + "".join(f", {o}" for o in result.get("overrides", [])) + "\n\n")
    lines = ["| minibatch | lr | images/s | step ms | loop overhead | data wait | TTL s | "
             "final loss | accuracy |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r["ttl_s"] is not None:
            ttl = f"{r['ttl_s']:.0f}"
        elif r["ttl_reached"]:
            ttl = f"{r['ttl_reached']}/{r['runs']} reached"
        else:
            ttl = f"> {r['ttl_censored_bound_s']:.0f} (censored)"
        cells = [_cell(r["images_per_s"], "{:.1f}"), _cell(r["step_s"], "{:.1f}", 1e3),
                 _cell(r.get("loop_overhead"), "{:+.0f} %", 100),
                 _cell(r["data_wait_fraction"], "{:.1f} %", 100), ttl,
                 _cell(r["final_loss_smoothed"], "{:.3f}"), _cell(r["accuracy"], "{:.0f} %", 100)]
        lines.append(f"| {r['batch_per_rank']} | {r['lr']:.3g} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _cell(v: float | None, fmt: str, scale: float = 1.0) -> str:
    return "–" if v is None else fmt.format(scale * v)


def run(args: argparse.Namespace) -> int:
    if args.out is not None and args.out.exists():
        raise LartpcError(f"--out {args.out}: exists; choose a new folder "
                          "(nothing there is overwritten)")
    check_positive_finite(args.threshold, "--threshold")
    result = _remeasure(args) if args.from_dir is not None else _scan(args)
    print(json.dumps(result, indent=2, allow_nan=False))
    return 0


def _scan(args: argparse.Namespace) -> dict:
    """Train every (minibatch, seed) point; write the outputs when ``--out`` is given."""
    from lartpc.bench.train import (
        add_overhead,
        check_options,
        check_points,
        measure_bare,
        point_config,
        train_point,
    )
    from lartpc.cliparse import int_list
    from lartpc.config import load_config

    # one run folder per (minibatch, seed): a repeat would resume the earlier run
    batches = int_list(args.batch_per_rank, "--batch-per-rank", minimum=1, distinct=True)
    seeds = int_list(args.seeds, "--seeds", minimum=0, distinct=True)
    check_positive(args.base_batch, "--base-batch")
    check_options(args)  # --seconds, --downsample, --events or --data, as bench train's
    if args.bare_steps < 0:
        raise LartpcError(f"--bare-steps {args.bare_steps}: expected 0 or more")
    config = args.config or f"tiny-{args.model}"
    base_lr = load_config(config, args.overrides).train.lr
    # every point's args and config, resolved as its training will resolve it
    runs = []
    for b in batches:
        lr = scaled_lr(base_lr, b, args.base_batch, args.lr_scaling)
        point_args = copy.copy(args)
        point_args.batch_per_rank, point_args.config = b, config
        for s in seeds:
            extra = (f"train.lr={lr!r}", f"train.seed={s}")
            runs.append((b, s, lr, point_args, extra, point_config(point_args, "none", extra)))
    with tempfile.TemporaryDirectory(prefix="lartpc-bench-minibatch-") as tmp, \
            _staged(args.out) as staged:
        work = Path(tmp) if staged is None else staged
        data = args.data
        if data is None:
            from lartpc.sim import write_dataset

            data = Path(tmp) / "events"
            write_dataset(data, args.events, seed=0, downsample=args.downsample,
                          workers=os.cpu_count() or 1)
        check_points([cfg for *_, cfg in runs], data, [1])
        points = []
        for b, s, lr, point_args, extra, _ in runs:
            run = run_folder(b, s)
            p = train_point(point_args, data, work / run, 1, "none", extra=extra,
                            threshold=args.threshold)
            if args.bare_steps:
                add_overhead(p, measure_bare(work / run, data, args.bare_steps))
            points.append(_point(p, run, b, s, lr))
        result = {
            "model": args.model, "config": config, "device": args.device,
            "image_size": 3600 // args.downsample, "seconds_per_run": args.seconds,
            "base_batch": args.base_batch, "base_lr": base_lr, "lr_scaling": args.lr_scaling,
            "threshold": args.threshold, "seeds": seeds, "overrides": list(args.overrides),
            "note": NOTE, "rows": summarise(points), "points": points,
        }
        if staged is not None:
            _write_outputs(result, staged, staged)
    return result


@contextlib.contextmanager
def _staged(out: Path | None) -> Iterator[Path | None]:
    """A folder beside ``out`` for the scan's runs and outputs, renamed to ``out`` when
    the scan succeeds and removed when it fails: a failed scan leaves no ``--out`` that
    could be neither redone nor remeasured (None: no ``--out``)."""
    if out is None:
        yield None
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    try:
        os.rename(stage, out)
    except OSError as e:  # --out made meanwhile by someone else: theirs stays
        raise LartpcError(f"--out {out}: cannot move the scan there ({e.strerror}); it is "
                          f"in {stage}") from None


def _remeasure(args: argparse.Namespace) -> dict:
    """The runs of the finished scan in ``--from``, measured again at ``--threshold``."""
    from lartpc.bench.train import add_overhead, measure_run

    src = args.from_dir
    try:
        old = json.loads((src / "minibatch.json").read_text())
        points = []
        for p in old["points"]:
            b = p.get("batch_per_rank", p.get("batch"))  # "batch": scans before 2026-11-26
            run = run_folder(b, p["seed"])
            points.append(_point(measure_run(src / run, args.threshold), run, b,
                                 p["seed"], p["lr"]))
            if "bare_step_s_median" in p:  # the steps are the same: so is the overhead
                add_overhead(points[-1], p)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LartpcError(f"--from {src}: not a finished `lartpc bench minibatch --out` "
                          f"folder ({e})") from e
    result = {**old, "threshold": args.threshold, "remeasured_from": str(src),
              "rows": summarise(points), "points": points}
    if args.out is not None:
        args.out.mkdir(parents=True)
        _write_outputs(result, args.out, src)
    return result


NOTE = ("images_per_s = B / median step time (steps after the first); images_per_s_epochs "
        "from the epoch rate and TTL on the training clock: data loading plus the steps' own "
        "time (evaluation and checkpoint pauses left out; scans before 2026-11-26 counted "
        "them); loop_overhead = median step / bare step - 1 (lartpc bench train); null: "
        "not measured (a run too short)")


def run_folder(batch: int, seed: int) -> str:
    """Where a scan keeps the run of one point, relative to its ``--out``."""
    return f"runs/b{batch:03d}-s{seed}"


def _point(measured: dict, run: str, batch: int, seed: int, lr: float) -> dict:
    step = measured["step_s_median"]
    measured.update(run=run, batch_per_rank=batch, seed=seed, lr=lr,
                    images_per_s_steps=None if step is None else batch / step)
    return measured


def _write_outputs(result: dict, out: Path, scan_dir: Path) -> None:
    import pandas as pd

    from lartpc.analysis.plots import minibatch_scan
    from lartpc.analysis.runs import load_run

    table = pd.DataFrame([{k: v for k, v in r.items() if k != "ttl_s_all"}
                          for r in result["rows"]])
    # through atomic_write: a link planted at an output is replaced, never written through
    atomic_write(out / "minibatch.csv", table.to_csv(index=False))
    atomic_write(out / "minibatch.md", markdown(result))
    atomic_write(out / "minibatch.json", json.dumps(result, indent=2, allow_nan=False))
    runs = [load_run(scan_dir / p["run"]) for p in result["points"]]
    minibatch_scan(result, runs, out / "minibatch.png")
