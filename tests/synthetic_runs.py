"""Synthetic run folders with known scaling, for tests and for checking the report by eye.

Nothing here is a result: each folder is generated from the epoch rate, time-to-loss and
data-loading time it is given, so the fits can be checked against the truth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from lartpc.analysis.runs import CLASSES, EVAL_COLUMNS, STEP_COLUMNS

from lartpc.runfolder.record import write_record
from lartpc.runfolder.schema import CONFUSION_CSV, CONFUSION_HEADER, EVAL_CSV, rank_csv_name

LOSS_START = math.log(5.0)  # chance level of a 5-class cross-entropy
LOSS_FLOOR = 1.0


def write_synthetic_run(folder: str | Path, *, model: str, world_size: int,
                        epoch_rate_per_min: float, ttl_s: float, dlt_s: float,
                        time_limit_s: float, threshold: float = 1.2, seed: int = 0,
                        train_events: int = 15000, batch_per_rank: int = 7,
                        loss_noise: float = 0.03, eval_events: int = 500,
                        confusion_percent: list[list[float]] | None = None,
                        start_time: float = 1.7e9) -> Path:
    """Write one run folder whose smoothed loss crosses ``threshold`` at ``ttl_s``.

    The noiseless loss decays exponentially from ln 5 (first step, at ``dlt_s``) towards 1.0
    with the time constant that puts the threshold crossing at ``ttl_s`` after start; steps
    are spaced to give ``epoch_rate_per_min``; the run stops at ``time_limit_s``.
    """
    if ttl_s <= dlt_s:
        raise ValueError("ttl_s must exceed dlt_s")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    steps_per_epoch = math.ceil(train_events / (batch_per_rank * world_size))
    dt = 60.0 / (epoch_rate_per_min * steps_per_epoch)
    n = int((time_limit_s - dlt_s) / dt) + 1
    t = start_time + dlt_s + dt * np.arange(n)
    tau = (ttl_s - dlt_s) / math.log((LOSS_START - LOSS_FLOOR) / (threshold - LOSS_FLOOR))
    clean = LOSS_FLOOR + (LOSS_START - LOSS_FLOOR) * np.exp(-(t - t[0]) / tau)
    global_loss = clean + rng.normal(0, loss_noise, n)
    global_acc = np.clip(0.2 + 0.75 * (LOSS_START - clean) / (LOSS_START - LOSS_FLOOR)
                         + rng.normal(0, 0.02, n), 0, 1)
    step = np.arange(n)
    header = ",".join(STEP_COLUMNS)
    for rank in range(world_size):
        cols = [t + 1e-3 * rank, step // steps_per_epoch, np.full(n, rank),
                step % steps_per_epoch, np.full(n, batch_per_rank),
                global_loss + rng.normal(0, 3 * loss_noise, n), global_loss,
                np.clip(global_acc + rng.normal(0, 0.05, n), 0, 1), global_acc,
                np.full(n, 0.1 * dt), np.full(n, 0.8 * dt), np.full(n, 0.1 * dt)]
        np.savetxt(folder / rank_csv_name(rank), np.column_stack(cols), delimiter=",",
                   header=header, comments="",
                   fmt=["%.3f", "%d", "%d", "%d", "%d"] + ["%.5f"] * 7)
    end = t[-1] + 1.0
    reached = bool(np.any(clean < threshold))
    conf = np.asarray(confusion_percent if confusion_percent is not None
                      else np.eye(len(CLASSES)) * 80 + 4, dtype=float)
    per_class = eval_events // len(CLASSES)
    counts = np.stack([rng.multinomial(per_class, row / row.sum()) for row in conf])
    acc_cls = counts.diagonal() / counts.sum(axis=1)
    n_epochs = int(step[-1] // steps_per_epoch) + 1
    rows = []
    for e in range(n_epochs):
        i = min(n - 1, (e + 1) * steps_per_epoch - 1)
        # accuracy grows with training; the last evaluation matches the confusion matrix
        frac = (e + 1) / n_epochs
        acc = 0.2 + frac * (acc_cls.mean() - 0.2)
        rows.append([e, t[i] + 0.5, clean[i], acc, per_class * len(CLASSES),
                     *(0.2 + frac * (acc_cls - 0.2)), i + 1,
                     (i + 1) * batch_per_rank * world_size])
    np.savetxt(folder / EVAL_CSV, np.array(rows), delimiter=",",
               header=",".join(EVAL_COLUMNS), comments="",
               fmt=["%d", "%.3f", "%.5f", "%.5f", "%d"] + ["%.5f"] * len(CLASSES)
               + ["%d", "%d"])
    with (folder / CONFUSION_CSV).open("w") as f:
        f.write(",".join(CONFUSION_HEADER) + "\n")
        for cls, row in zip(CLASSES, counts, strict=True):
            f.write(cls + "," + ",".join(str(int(v)) for v in row) + "\n")
    meta = {
        "model": model, "world_size": world_size, "start_time": start_time, "end_time": end,
        "status": "completed" if reached else "time_limit", "steps_per_epoch": steps_per_epoch,
        "train_events": train_events, "eval_events": per_class * len(CLASSES), "loss": "paper",
        "config": {"model": {"name": model},
                   "train": {"seed": seed, "batch_per_rank": batch_per_rank}},
        "geometry": {"synthetic": True}, "versions": {}, "git_sha": "synthetic",
        "host": "synthetic", "backend": "none",
    }
    write_record(folder, meta)
    return folder


def write_synthetic_study(root: str | Path, *, model: str, gpus: list[int], seeds: int,
                          rate_c: float, rate_b: float, ttl_a: float, ttl_b: float,
                          dlt_a: float, time_limit_s: float, noise: float = 0.05,
                          seed: int = 0, **kwargs) -> list[Path]:
    """One run per (N, seed) with epoch rate ``rate_c*N^rate_b`` and TTL ``ttl_a*N^ttl_b``.

    Both get independent multiplicative log-normal noise of relative size ``noise``; the
    data-loading time is ``dlt_a / N`` (each rank loads 1/N of the data).
    """
    rng = np.random.default_rng(seed)
    paths = []
    for n in gpus:
        for s in range(seeds):
            rate = rate_c * n ** rate_b * math.exp(rng.normal(0, noise))
            ttl = ttl_a * n ** ttl_b * math.exp(rng.normal(0, noise))
            paths.append(write_synthetic_run(
                Path(root) / f"{model}-n{n:03d}-s{s}", model=model, world_size=n,
                epoch_rate_per_min=rate, ttl_s=ttl, dlt_s=dlt_a / n, time_limit_s=time_limit_s,
                seed=int(rng.integers(2**31)), **kwargs))
    return paths


def requeue(folder: Path, after: int, wait_s: float, restart_s: float,
            skew_s: float) -> tuple[int, float]:
    """Make ``folder`` a run resumed by a second job after step ``after``.

    The first job ends 0.1 s after its last step; the second starts ``wait_s`` later
    (queue), and logs its first step ``restart_s`` after that. Its recorded start is
    ``skew_s`` early, as psutil's rounded process start is.
    """
    csv = folder / "rank-000.csv"
    df = pd.read_csv(csv)
    last = float(df["time"].iloc[after - 1])
    dt = float(df["time"].iloc[after] - last)
    shift = 0.1 + wait_s + restart_s - dt
    df.loc[after:, "time"] += shift
    df.to_csv(csv, index=False, float_format="%.3f")
    ev = pd.read_csv(folder / "eval.csv")
    ev.loc[ev["time"] > last, "time"] += shift
    ev.to_csv(folder / "eval.csv", index=False, float_format="%.5f")
    meta = json.loads((folder / "run.json").read_text())
    meta["segments"] = [{"start_time": meta["start_time"], "end_time": last + 0.1},
                        {"start_time": last + 0.1 + wait_s - skew_s, "end_time": None}]
    (folder / "run.json").write_text(json.dumps(meta))
    return after, shift
