"""From run folders to one analysis: per-run metrics, per-model fits; text and JSON forms."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from lartpc.analysis.fit import summarize, ttl_mean_text
from lartpc.analysis.metrics import DEFAULT_SMOOTH_MAX, RunMetrics, run_metrics
from lartpc.analysis.runs import Run, load_runs

DEFINITIONS = {
    "dlt": "earliest first-step time over ranks minus start_time (first loss visible); "
           "dlt_max_s uses the latest rank",
    "epoch_rate": "epochs/min on the lowest rank: step intervals / steps_per_epoch over "
                  "their summed duration; data loading and the interval holding a job "
                  "restart excluded",
    "ttl": "the run's own wall time from start_time to the first step where the centred "
           "rolling mean of global_loss over smooth_window steps is below the threshold; "
           "data loading included; waits in the queue between job segments of a resumed "
           "run (a segment's end_time to the next start_time) excluded (queue_wait_s); "
           "runs that never get there are censored (ttl_lower_bound_s = own wall time to "
           "the last step) and enter the TTL fit as lower bounds (censored fit)",
    "clock": "--clock train (default): TTL, its bound and the epoch rate count DLT and then "
             "the steps' own time (data_s + compute_s + comm_s), not evaluation, "
             "checkpoints or restarts; --clock wall: the own wall time as described under "
             "ttl; ttl_wall_s is always the wall-clock TTL. With run.json's budget_s, a run "
             "below the threshold only after its budget is censored at the budget",
    "smooth_window": f"--smooth STEPS, or min({DEFAULT_SMOOTH_MAX}, steps // 10) per run",
    "fit": "least squares of log y on log N over all runs (TTL with censored runs: a "
           "censored normal fit of log TTL, maximum likelihood, the censored runs as "
           "lower bounds); exponent_err from the covariance (the censored fit's: the "
           "observed information); ci95 = exponent +/- t(0.975, n-2) exponent_err (the "
           "censored fit's: profile likelihood), ci_method says which; "
           "exponent_ci95_bootstrap (in ttl_fit / epoch_rate_fit) resamples runs within "
           "each N, a check that covers less than 95 % with 2-3 runs per N",
    "breakdown_warning": "quadratic term in log N significant at the 5 % level (t test)",
    "scaling": "relative to the smallest N with an epoch rate (baseline_gpus): p = N/N0, speedup = "
               "rate(N)/rate(N0), efficiency = speedup/p, Karp-Flatt = "
               "(1/speedup - 1/p)/(1 - 1/p); ttl_speedup = TTL(N0)/TTL(N)",
    "accuracy": "last eval.csv row that evaluated events; accuracy_se = binomial sqrt(p(1-p)/n), "
                "accuracy_wilson95 = 95 % Wilson score interval",
}


@dataclass
class Analysis:
    """Everything the commands print or draw, computed once."""

    runs: list[Run]
    rows: list[RunMetrics]
    models: dict[str, dict]
    threshold: float
    smooth: int | None
    skipped: list[str] = field(default_factory=list)
    strict: bool = False  #: an unusable input fails the command instead of being skipped
    clock: str = "train"  #: what TTL and the epoch rate are measured on (metrics.CLOCKS)

    @property
    def notes(self) -> list[str]:
        """Skipped run folders, then what was tolerated in the runs that were read."""
        return ([f"skipped: {s}" for s in self.skipped]
                + [n for r in self.rows for n in r.notes])


def analyse(paths: list[str | Path], threshold: float = 1.2, smooth: int | None = None,
            strict: bool = False, clock: str = "train") -> Analysis:
    """Read all run folders under ``paths`` and compute metrics and per-model fits.

    Unusable run folders are skipped with a note (``Analysis.skipped``) unless ``strict``.
    """
    skipped: list[str] | None = None if strict else []
    runs = load_runs(paths, skipped)
    rows = [run_metrics(r, threshold, smooth, clock) for r in runs]
    return Analysis(runs, rows, summarize(rows), threshold, smooth, skipped or [], strict,
                    clock)


def json_safe(obj):
    """JSON-safe copy: tuples to lists, NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(a: Analysis) -> dict:
    """The ``fit --json`` document."""
    return json_safe({
        "threshold": a.threshold,
        "clock": a.clock,
        "smooth": a.smooth if a.smooth is not None else "auto",
        "definitions": DEFINITIONS,
        "models": a.models,
        "runs": [r.to_dict() for r in a.rows],
        "skipped": a.skipped,
    })


def _f(v: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def counted(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def gpus_text(n: int, unit: str = "GPU") -> str:
    """``1 GPU``, ``2 GPUs`` (``2 ranks`` with ``unit`` rank)."""
    return counted(n, unit)


def count_unit(devices) -> str:
    """What N counts for runs on these ``devices`` (run.json's): ``GPU``, or ``rank``
    when any of them trained on CPU ranks (a rank stands for one GPU of the study)."""
    return "rank" if any(str(d or "").startswith("cpu") for d in devices) else "GPU"


def scaling_head(s: dict, unit: str = "GPU") -> str:
    """What a model's speedups are relative to: its ``baseline_gpus`` (the smallest N
    with an epoch rate), or that no run has an epoch rate, so there are none."""
    if s["baseline_gpus"] is None:
        return ("scaling: no run has an epoch rate (each logged fewer than 2 steps), so "
                "no speedups")
    return f"scaling relative to N0 = {gpus_text(s['baseline_gpus'], unit)}"


def _exp(value: float | None, err: float | None, ci: tuple | list | None,
         method: str | None = None) -> str:
    if value is None:
        return "no fit"
    s = f"{value:+.3f}" + (f" ± {err:.3f}" if err is not None else " (no error)")
    if ci:
        s += f"  [95% {method or 'interval'} {ci[0]:+.3f}, {ci[1]:+.3f}]"
    return s


def _dropped_line(s: dict) -> list[str]:
    """The TTL exponent without the censored runs, where the censored fit replaced it."""
    if s.get("ttl_fit_method") != "censored":
        return []
    d = s["ttl_fit_uncensored_only"]
    return ["  censored runs dropped: " + _exp(d["exponent"], d["exponent_err"],
                                                d["exponent_ci95"], d.get("ci_method"))
            + f" ({d['n_points']} runs; biased toward the fast runs)"]


def _apart(r: RunMetrics) -> str:
    """Evaluation + checkpoint seconds from run.json ('-' for older run folders)."""
    if r.eval_time_s is None or r.checkpoint_time_s is None:
        return "-"
    return f"{r.eval_time_s:.0f}+{r.checkpoint_time_s:.0f}"


def to_text(a: Analysis) -> str:
    """Human-readable tables: per run, then per model fits and scaling."""
    out = [f"TTL threshold {a.threshold:g}; smoothing "
           f"{a.smooth if a.smooth else f'auto (min({DEFAULT_SMOOTH_MAX}, steps // 10))'} "
           "steps; DLT = earliest "
           "first step over ranks - start_time; "
           + ("training clock: TTL and ep/min count the steps' own time, not evaluation "
              "or checkpoints (--clock wall counts them)" if a.clock == "train" else
              "wall clock: TTL and ep/min include evaluation and checkpoints"), ""]
    unit = count_unit(r.setting.get("device") for r in a.rows)
    head = (f"{'run':<28} {'model':<8} {'N':>4} {'status':<10} {'steps':>6} {'DLT s':>8} "
            f"{'ep/min':>8} {'img/s/' + unit:>10} {'TTL s':>10} {'TTL wall':>8} "
            f"{'eval+ckpt s':>11} {'acc %':>12}")
    out += [head, "-" * len(head)]
    for r in a.rows:
        ttl = (f">{r.ttl_lower_bound_s:.0f} cens" if r.ttl_censored and r.ttl_lower_bound_s
               else "censored" if r.ttl_censored else f"{r.ttl_s:.0f}")
        acc = (f"{100 * r.accuracy:.1f}±{100 * r.accuracy_se:.1f}" if r.accuracy is not None
               else "-")
        out.append(f"{r.name[:28]:<28} {r.model:<8} {r.world_size:>4} {r.status:<10} "
                   f"{r.n_steps:>6} {_f(r.dlt_s, '{:.1f}'):>8} "
                   f"{_f(r.epoch_rate_per_min, '{:.4g}'):>8} "
                   f"{_f(r.images_per_s_per_gpu, '{:.3g}'):>10} {ttl:>10} "
                   f"{_f(r.ttl_wall_s, '{:.0f}'):>8} {_apart(r):>11} {acc:>12}")
    for model, s in a.models.items():
        unit = count_unit(r.setting.get("device") for r in a.rows if r.model == model)
        out += ["", f"== {model}: {counted(s['n_runs'], 'run')}, N = {s['gpu_counts']}, "
                    f"{s['n_censored']} censored",
                "TTL exponent:        " + _exp(s["ttl_exponent"], s["ttl_exponent_err"],
                                               s["ttl_exponent_ci95"], s.get("ttl_ci_method"))
                + (" (censored fit)" if s.get("ttl_fit_method") == "censored" else ""),
                *_dropped_line(s),
                "epoch-rate exponent: " + _exp(s["epoch_rate_exponent"],
                                               s["epoch_rate_exponent_err"],
                                               s["epoch_rate_exponent_ci95"],
                                               s.get("epoch_rate_ci_method")),
                f"{scaling_head(s, unit)}:",
                f"  {'N':>5} {'runs':>4} {'ep/min':>8} {'speedup':>8} {'eff':>6} "
                f"{'K-F e':>7} {'TTL s':>9} {'TTL spdup':>9} {'cens':>4}"]
        for row in s["scaling"]:
            out.append(f"  {row['gpus']:>5} {row['n_runs']:>4} "
                       f"{_f(row['epoch_rate_mean'], '{:.4g}'):>8} "
                       f"{_f(row['speedup'], '{:.2f}'):>8} {_f(row['efficiency'], '{:.2f}'):>6} "
                       f"{_f(row['karp_flatt'], '{:.3f}'):>7} "
                       f"{ttl_mean_text(row):>9} "
                       f"{_f(row['ttl_speedup'], '{:.2f}'):>9} {row['n_ttl_censored']:>4}")
        out += [f"note: {n}" for n in s["notes"]]
        out += [f"WARNING: {w}" for w in s["warnings"]]
    if a.notes:
        out += ["", "Run notes:"] + [f"note: {n}" for n in a.notes]
    return "\n".join(out) + "\n"
