"""Per-run metrics: data-loading time, epoch rate, time-to-loss, final accuracy.

Definitions (also printed in the report):

- **DLT** (data-loading time): earliest first-step ``time`` over all ranks minus
  ``start_time``, i.e. when the first loss becomes visible. ``dlt_max_s`` (the latest rank)
  is kept too; with a synchronous allreduce the two differ only by skew.
- **Epoch rate** (epochs/min, DLT excluded): on the lowest rank, (rows - 1) step intervals
  divided by ``steps_per_epoch``, over (last step time - first step time). Intervals, not
  rows, because the first step's own duration ends at the first timestamp. Pauses between
  steps (evaluation, checkpoints) count as training time; the step interval holding a
  job restart (a run resumed by a later job, ``run.json`` ``segments``) does not, neither
  its steps nor its seconds (see :mod:`lartpc.analysis.segments`).
- **TTL(threshold)**: the run's own wall time from ``start_time`` (DLT included) to the
  first step time at which the smoothed global training loss is below the threshold.
  Own wall time is the time the run's jobs ran: waits in the queue between job segments
  (one segment's ``end_time`` to the next one's ``start_time``) are excluded and given
  as ``queue_wait_s``. Smoothing is a *centred* rolling mean over ``smooth`` steps, so
  it adds no time lag; default window min(50, steps // 10). A run that never gets there
  is *censored*: ``ttl_s`` is None and ``ttl_lower_bound_s`` is its own wall time to
  its last step with a smoothed loss (half a window before its last step: the centred
  mean there would have read steps it did not take).
- **Clock** (issue 37): TTL, its bound and the epoch rate are read on the *training
  clock* by default (``clock="train"``): DLT, then each later step's own duration
  (``data_s + compute_s + comm_s`` of the lowest rank's log), so evaluations,
  checkpoints and restarts between steps do not count. ``clock="wall"`` reads the own
  wall time as above (evaluation and checkpoints included); ``ttl_wall_s`` always holds
  it. A run whose log lacks the durations falls back to the wall clock, with a note.
- **Budget**: with run.json's ``budget_s`` (the study's budget per point, training time
  without DLT), steps after the budget are not looked at, in the smoothing too (a
  centred mean at the budget's last steps would read steps after it): a run that gets
  below the threshold only after it is censored at the budget, as a run stopped there
  would be. Run folders written before the budget have none; a log without step
  durations cannot apply it (said in a note).
- **Accuracy**: last row of ``eval.csv`` that evaluated events; uncertainty is the
  binomial standard error sqrt(p(1-p)/n) and the 95 % Wilson score interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from lartpc.analysis.runs import Run
from lartpc.analysis.segments import Restarts, find_restarts

from lartpc.runfolder.lock import holder_gone
from lartpc.runfolder.schema import LOCK

DEFAULT_SMOOTH_MAX = 50
#: What TTL and the epoch rate are measured on (see the module docstring).
CLOCKS = ("train", "wall")
DURATIONS = ("data_s", "compute_s", "comm_s")


@dataclass
class RunMetrics:
    """What :func:`run_metrics` derives from one run (times in seconds)."""

    name: str
    path: str
    model: str
    world_size: int
    seed: int | None
    status: str
    n_steps: int
    smooth_window: int | None
    dlt_s: float | None
    dlt_max_s: float | None
    epoch_rate_per_min: float | None
    images_per_s_per_gpu: float | None
    ttl_s: float | None
    ttl_censored: bool
    ttl_lower_bound_s: float | None
    final_loss_smoothed: float | None
    accuracy: float | None
    accuracy_se: float | None
    accuracy_wilson95: tuple[float, float] | None
    n_eval: int | None
    queue_wait_s: float = 0.0
    clock: str = "train"  #: what ttl_s, its bound and the epoch rate are measured on
    ttl_wall_s: float | None = None  #: TTL on the own wall time (evaluation included)
    train_time_s: float | None = None  #: run.json's, when recorded (issue 37)
    eval_time_s: float | None = None  #: evaluations' time from run.json, when recorded
    checkpoint_time_s: float | None = None  #: checkpoints' time from run.json, when recorded
    budget_s: float | None = None  #: run.json's train.budget_s, when recorded
    notes: list[str] = field(default_factory=list)
    #: what must be the same for runs to share one fit (:data:`SETTING`), from run.json
    setting: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


#: run.json's settings that runs in one scaling fit must share (the world size varies):
#: the image, the training set, the per-rank minibatch, the loss, the device, the backend
SETTING = ("image", "train_events", "batch_per_rank", "loss", "device", "backend")


def run_setting(meta: dict) -> dict:
    """:data:`SETTING` of one run.json (None where not recorded)."""
    geometry = meta.get("geometry") or {}
    image = (f"{geometry['height']}x{geometry['width']}"
             if "height" in geometry and "width" in geometry else None)
    return {"image": image, **{k: meta.get(k) for k in SETTING[1:]}}


def smoothing_window(n_steps: int, smooth: int | None) -> int:
    """The rolling-mean window: ``smooth`` if given, else min(50, n_steps // 10), at least 1."""
    if smooth is not None:
        if smooth < 1:
            raise ValueError(f"--smooth must be >= 1 step, got {smooth}")
        return smooth
    return max(1, min(DEFAULT_SMOOTH_MAX, n_steps // 10))


def smoothed_loss(steps: pd.DataFrame, window: int) -> pd.Series:
    """Centred rolling mean of ``global_loss`` over ``window`` steps (NaN at the edges)."""
    loss = steps["global_loss"].reset_index(drop=True)
    return loss.rolling(window, center=True, min_periods=window).mean()


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (95 % by default)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def binomial_se(p: float, n: int) -> float:
    """Binomial standard error sqrt(p(1-p)/n) of a fraction ``p`` measured on ``n`` events."""
    return math.sqrt(p * (1 - p) / n) if n > 0 else math.nan


def primary_steps(run: Run) -> pd.DataFrame | None:
    """Step table of the lowest rank, in time order (None when the run logged no steps)."""
    if not run.steps:
        return None
    df = run.steps[min(run.steps)]
    if df.empty:
        return None
    return df.sort_values("time", kind="stable").reset_index(drop=True)


def _accuracy(run: Run, notes: list[str]) -> tuple:
    """(accuracy, se, wilson95, n) of the last eval.csv row with events, else Nones."""
    if run.evals is None or run.evals.empty:
        return None, None, None, None
    rows = run.evals[run.evals["n_events"] > 0]
    if len(rows) < len(run.evals):
        notes.append(f"{run.name}: {len(run.evals) - len(rows)} eval.csv row(s) evaluated "
                     "0 events; ignored")
    if rows.empty:
        return None, None, None, None
    last = rows.iloc[-1]
    acc, n_eval = float(last["accuracy"]), int(last["n_events"])
    return acc, binomial_se(acc, n_eval), wilson_interval(round(acc * n_eval), n_eval), n_eval


def _epoch_rate(run: Run, t: np.ndarray, restarts: Restarts,
                durations: np.ndarray | None = None) -> float | None:
    """Epochs/min over the step intervals that hold no restart (None below 2 steps);
    with ``durations`` (training clock), over the steps' own time after the first."""
    if len(t) < 2:
        return None
    keep = np.ones(len(t) - 1, bool)
    if durations is None:
        keep[restarts.intervals] = False
        span = float(np.diff(t)[keep].sum())
    else:
        span = float(durations[1:].sum())
    if span <= 0:
        return None
    return int(keep.sum()) / run.meta["steps_per_epoch"] / (span / 60.0)


def _censored_bound(on_clock: np.ndarray, sm: np.ndarray, window: int, kept: int,
                    trained: np.ndarray | None, budget: float | None) -> float:
    """The clock a censored run's TTL is known to exceed: at the last of its ``kept``
    steps (those within the budget) with a smoothed loss, which ends half a window
    before its last step (the centred mean's next value, from steps it did not take,
    could have been below). With no smoothed value, before the first step that could
    have one (``window // 2``); with no step within the budget, where the budget ran
    out inside the first step."""
    if kept == 0:
        return max(0.0, float(on_clock[0] - trained[0] + budget))
    seen = np.flatnonzero(np.isfinite(sm))
    last = int(seen[-1]) if seen.size else max(0, min(window // 2, kept) - 1)
    return float(on_clock[last])


def _no_step_bound(run: Run, restarts: Restarts, start: float) -> float | None:
    end = run.meta.get("end_time")
    return None if end is None else restarts.own_time(float(end), start)


def _durations(steps: pd.DataFrame, run: Run, notes: list[str]) -> np.ndarray | None:
    """Each step's own duration, or None (with a note) when the log cannot give them."""
    if any(c not in steps.columns for c in DURATIONS):
        notes.append(f"{run.name}: no step durations in its log; TTL on the wall clock")
        return None
    d = steps[list(DURATIONS)].to_numpy(dtype=float).sum(axis=1)
    if not np.all(np.isfinite(d)):
        notes.append(f"{run.name}: step durations missing in its log; TTL on the wall clock")
        return None
    return d


def _budget(run: Run) -> float | None:
    b = run.meta.get("budget_s")  # absent from run folders written before issue 37
    return float(b) if isinstance(b, int | float) and not isinstance(b, bool) else None


def _run_notes(run: Run, restarts, threshold: float) -> list[str]:
    """What a reader of ``run``'s numbers should know: tolerated reading, restarts, a
    first layer that skipped work, a loss not on the paper's scale."""
    notes = list(run.notes) + [f"{run.name}: {n}" for n in restarts.notes]
    if restarts.wait_s > 0:
        notes.append(f"{run.name}: {len(restarts.waits)} restart(s); {restarts.wait_s:.0f} s "
                     "waiting between job segments excluded from TTL")
    if (run.meta.get("model_options") or {}).get("stem_skip_empty"):
        notes.append(f"{run.name}: JishNet's first layer skipped the images' empty blocks "
                     "(model.stem_skip_empty): the same numbers, but its times are not a "
                     "dense network's (not the study's dense baseline)")
    notes += _status_notes(run)
    loss = run.meta.get("loss")
    if loss is not None and loss != "paper":
        notes.append(f"{run.name}: trained with model.loss = {loss}, not the paper's loss "
                     f"scale: its time to loss {threshold:g} is not comparable with the "
                     "paper's or with runs on that scale")
    return notes


def _status_notes(run: Run) -> list[str]:
    """What the run's ``run.json`` status means for its numbers, where it is not a
    normal end (completed, or stopped at a time limit or by a signal, checkpointed)."""
    status = run.meta.get("status")
    if status == "running":
        if holder_gone(run.path / LOCK):
            return [f"{run.name}: run.json says running but its training process is gone "
                    "(killed before it could write its status): its numbers end at its "
                    "last logged step"]
        return [f"{run.name}: still running: its numbers are provisional"]
    if status == "failed":
        error = str(run.meta.get("error") or "not recorded")
        return [f"{run.name}: ended with an error ({error[:200]}): its numbers end there"]
    if status == "diverged":
        return [f"{run.name}: its loss diverged (non-finite): a threshold it never reached "
                "is not a lower bound of its time to loss (left out of the TTL fit)"]
    return []


def run_metrics(run: Run, threshold: float = 1.2, smooth: int | None = None,
                clock: str = "train") -> RunMetrics:
    """Derive DLT, epoch rate, TTL and final accuracy of one run (see module docstring);
    ``clock`` is one of :data:`CLOCKS`."""
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r}: one of {', '.join(CLOCKS)}")
    start = float(run.meta["start_time"])
    steps = primary_steps(run)
    n_steps = 0 if steps is None else len(steps)
    t = np.empty(0) if steps is None else steps["time"].to_numpy()
    restarts = find_restarts(t, run.meta.get("segments") or [])
    notes = _run_notes(run, restarts, threshold)
    dlt = dlt_max = rate = img_rate = ttl = bound = final = window = ttl_wall = None
    censored, used = True, clock
    budget = _budget(run)
    if steps is not None:
        firsts = [float(df["time"].min()) for df in run.steps.values() if not df.empty]
        dlt, dlt_max = min(firsts) - start, max(firsts) - start
        durations = _durations(steps, run, notes)
        if durations is None:
            used = "wall"
        trained = np.cumsum(durations) if durations is not None else None
        wall = np.array([restarts.own_time(float(x), start) for x in t])
        on_clock = wall if used == "wall" else dlt + trained - trained[0]
        rate = _epoch_rate(run, t, restarts, None if used == "wall" else durations)
        if rate is not None and run.meta.get("train_events"):
            img_rate = rate * run.meta["train_events"] / 60.0 / run.world_size
        window = smoothing_window(n_steps, smooth)
        if window > n_steps:
            notes.append(f"{run.name}: the smoothing window ({window} steps) is longer than "
                         f"its {n_steps} steps: no smoothed loss, so no time to loss "
                         "(censored)")
        within = np.ones(n_steps, bool)
        if budget is not None and trained is not None:
            within = trained <= budget * (1 + 1e-9)
        elif budget is not None:
            notes.append(f"{run.name}: no step durations in its log: its budget of "
                         f"{budget:g} s is not applied to its time to loss")
        # the budget's steps alone: a centred mean at its last steps would read later ones
        kept, full = int(within.sum()), smoothed_loss(steps, window).to_numpy()
        sm = full if kept == n_steps else smoothed_loss(steps.iloc[:kept], window).to_numpy()
        below = np.flatnonzero(sm < threshold)
        if below.size:
            ttl, censored = float(on_clock[below[0]]), False
            ttl_wall = float(wall[below[0]])
        else:
            bound = _censored_bound(on_clock, sm, window, kept, trained, budget)
            if kept < n_steps and (full < threshold).any():
                notes.append(f"{run.name}: below the threshold only after its budget of "
                             f"{budget:g} s: censored at the budget")
        valid = full[np.isfinite(full)]
        final = float(valid[-1]) if valid.size else None
    else:
        bound = _no_step_bound(run, restarts, start)
    acc, se, wilson, n_eval = _accuracy(run, notes)
    return RunMetrics(
        name=run.name, path=str(run.path), model=run.model, world_size=run.world_size,
        seed=run.seed, status=str(run.meta["status"]), n_steps=n_steps, smooth_window=window,
        dlt_s=dlt, dlt_max_s=dlt_max, epoch_rate_per_min=rate, images_per_s_per_gpu=img_rate,
        ttl_s=ttl, ttl_censored=censored, ttl_lower_bound_s=bound, final_loss_smoothed=final,
        accuracy=acc, accuracy_se=se, accuracy_wilson95=wilson, n_eval=n_eval,
        queue_wait_s=restarts.wait_s, clock=used, ttl_wall_s=ttl_wall,
        train_time_s=run.meta.get("train_time_s"), eval_time_s=run.meta.get("eval_time_s"),
        checkpoint_time_s=run.meta.get("checkpoint_time_s"), budget_s=budget, notes=notes,
        setting=run_setting(run.meta))
