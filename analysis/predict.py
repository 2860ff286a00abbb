"""Predict time-to-loss and epoch rate to many GPUs from a few small runs.

Statistical half (measured): synchronous data parallelism at ``b`` images per rank is
one optimizer at B = b N. Steps to a loss follow S(B) = S_min (1 + B_noise / B)
(McCandlish et al. 2018), with B_noise measured in training (``noise.csv``, see
:mod:`lartpc.analysis.noise`) at the loss threshold and S_min from the base runs' measured steps
to that loss: S_min = S_base / (1 + B_noise / B_base), given only when every base run
reached the loss within its budget (as :func:`~lartpc.analysis.metrics.run_metrics`
censors it; a mean over the runs that did would be biased low). Critical GPU count
N_crit = B_noise / b. B_noise is measured only where |G|^2 is resolved (its mean at least
2 standard errors above 0), else it is a lower bound; its 95 % interval (log space, or
from the bound to infinity) is carried to N_crit and to the predicted steps and TTL
(``*_range``: B_noise's uncertainty alone, the base runs' steps and step time taken as
exact). S(B) is monotone in B_noise, so the range is S at the interval's two ends.

Hardware half (modelled): t_step(N) = t_compute + t_data + t_allreduce(N), with

* ring allreduce (default): 2 (N-1)/N bytes / beta + 2 (N-1) alpha;
* tree allreduce: 2 log2(N) alpha + 2 bytes / beta;

beta and alpha of the slowest link in use (between GPUs of a node while N fits one node,
else the network). Gradient bytes: the model's float32 parameters (2 bytes each with
fp16 gradient compression). t_compute + t_data come from the runs (measured: their mean
per-step time), from a profile's measured per-GPU throughput (SummitDev, the paper's),
from it scaled by FP32 peak (assumed), or from ``--compute-ms`` (given).

Epoch time = ceil(events / (b N)) t_step(N) + P and TTL(N) = DLT + S(b N) (t_step(N)
+ P / steps per epoch), where P (evaluation and checkpoint pauses per epoch) and DLT
are measured in the base runs when compute is measured on the same machine (assumed
independent of N; a job restart's step interval, which holds a queue wait, is no pause),
and not modelled (0) on other clusters. Epoch rate = 60 / epoch
time. Efficiency = TTL(1) / (N TTL(N)); step efficiency = t_step(1) / t_step(N).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np
from lartpc.analysis.fit import mean_ttl
from lartpc.analysis.metrics import (
    primary_steps,
    run_metrics,
    smoothed_loss,
    smoothing_window,
)
from lartpc.analysis.noise import (
    DEFAULT_SPAN,
    NoiseAtLoss,
    b_noise_at_loss,
    noise_tables,
    pooled_b_noise,
)
from lartpc.analysis.profiles import (
    PARAMETERS,
    REFERENCE_PROFILE,
    PredictError,
    Profile,
    allreduce_s,
    choose_profile,
    load_profiles,
)
from lartpc.analysis.runs import Run, RunFolderError
from lartpc.analysis.segments import find_restarts

from lartpc.cliparse import int_list
from lartpc.runfolder.record import batch_per_rank

log = logging.getLogger(__name__)
FIT_RANGE = (32, 192)  # the paper's GPU counts
FIT_GPUS = (32, 48, 64, 96, 128, 160, 192)
DEFAULT_GPUS = tuple(2**k for k in range(11))


def parse_gpus(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4], sorted and distinct; each a whole number >= 1."""
    return sorted(set(int_list(text, "--gpus", minimum=1, error=PredictError)))


@dataclass
class Inputs:
    """What the base runs of one model measured (times in seconds)."""

    model: str
    base_gpus: int
    batch_per_rank: int
    b_noise: float
    b_noise_range: tuple[float, float]  #: 95 % interval; (bound, inf) for a lower bound
    noise: list[NoiseAtLoss]
    steps_to_loss: float | None  #: None unless every base run reached the threshold
    reached: list[str]  #: the base runs that reached it (within their budget)
    step_s: float  #: mean data_s + compute_s (+ comm_s on one GPU, where nothing is exchanged)
    pause_s_per_epoch: float  #: time between steps not in them (evaluation, checkpoints)
    dlt_s: float
    train_events: int
    grad_bytes: float
    runs: list[str]


def _step_and_pause(runs: list[Run]) -> tuple[float, float]:
    """Mean step time and mean pause per epoch (evaluation, checkpoint) of the runs' first
    ranks, the first step (warm-up) left out. A step interval that holds a job restart
    (:func:`~lartpc.analysis.segments.find_restarts`: the queue wait and start-up of a
    resumed run) is left out of the pauses, its seconds and its step, as the epoch rate
    leaves it out."""
    steps, pauses = [], []
    for r in runs:
        df = primary_steps(r)
        if df is None or len(df) < 3:
            continue
        cols = ["data_s", "compute_s"] + (["comm_s"] if r.world_size == 1 else [])
        steps.append(df[cols].sum(axis=1).to_numpy()[1:].mean())
        t = df["time"].to_numpy()
        keep = np.ones(len(t) - 1, bool)
        keep[find_restarts(t, r.meta.get("segments") or []).intervals] = False
        inside = df[["data_s", "compute_s", "comm_s"]].sum(axis=1).to_numpy()[1:]
        epochs = max(1, int(df["epoch"].iloc[-1] - df["epoch"].iloc[0]))
        pauses.append(max(0.0, float((np.diff(t) - inside)[keep].sum())) / epochs)
    if not steps:
        raise PredictError("the base runs have fewer than 3 logged steps: no step time")
    return float(np.mean(steps)), float(np.mean(pauses))


def _steps_to_loss(run: Run, threshold: float, smooth: int | None) -> int | None:
    """Steps until the smoothed loss is first below ``threshold``; None where
    :func:`~lartpc.analysis.metrics.run_metrics` finds the time to loss censored (never
    below, or below only after the run's ``budget_s``), so that fit and predict agree."""
    if run_metrics(run, threshold, smooth).ttl_censored:
        return None
    steps = primary_steps(run)
    sm = smoothed_loss(steps, smoothing_window(len(steps), smooth)).to_numpy()
    return int(np.flatnonzero(sm < threshold)[0]) + 1


def _base_steps(runs: list[Run], threshold: float,
                smooth: int | None) -> tuple[float | None, list[str]]:
    """Mean steps to ``threshold`` of ``runs`` (None unless every one reached it) and the
    names of those that did."""
    steps = [(r.name, _steps_to_loss(r, threshold, smooth)) for r in runs]
    reached = [name for name, s in steps if s is not None]
    if len(reached) < len(steps):
        return None, reached
    return float(np.mean([s for _, s in steps])), reached


def steps_at(s_base: float, b_noise: float, batch: int, n: int, base: int) -> float:
    """S(B) = S_min (1 + B_noise / B) at B = ``batch`` n, with S_min = s_base /
    (1 + B_noise / (``batch`` ``base``)) from the steps measured at ``base`` GPUs; as
    B_noise -> inf, s_base base / n."""
    if math.isinf(b_noise):
        return s_base * base / n
    return s_base * (1 + b_noise / (batch * n)) / (1 + b_noise / (batch * base))


def _noise_scales(noisy: list, threshold: float, span: int, strict: bool) -> list:
    """B_noise of each (run, noise table) that resolves one."""
    at, why = [], []
    for r, df in noisy:
        try:
            at.append(b_noise_at_loss(r.name, df, threshold, span))
        except RunFolderError as e:
            if strict:
                raise
            why.append(str(e))
            log.warning("%s: not used for the noise scale", e)
    if not at:
        raise PredictError("no run resolves a noise scale: " + "; ".join(why))
    return at


def _batch(run: Run) -> int:
    return int(batch_per_rank(run.meta) or 7)


def gather_inputs(runs: list[Run], threshold: float, smooth: int | None = None,
                  span: int = DEFAULT_SPAN, base_gpus: int | None = None,
                  strict: bool = False) -> dict[str, Inputs]:
    """Per model, the inputs measured by its base runs: the runs at ``base_gpus`` (default
    the smallest world size with a noise.csv) and the same minibatch. The noise scale
    comes from those with a noise.csv (a run whose noise.csv resolves none, such as one
    that diverged at once, is left out with a warning; ``strict``: an error); steps to the
    threshold (only when every one of them reached it), step time, pauses and DLT from
    all of them (with or without the measurement). Runs at other sizes are not used."""
    out = {}
    for model in sorted({r.model for r in runs}):
        mine = [r for r in runs if r.model == model]
        noisy = noise_tables(mine, strict)
        if not noisy:
            raise PredictError(f"no {model} run has a noise.csv (train with --set "
                               "train.noise_scale=halves, or on 2 or more ranks); runs: "
                               + ", ".join(r.name for r in mine))
        base = base_gpus or min(r.world_size for r, _ in noisy)
        noisy = [(r, df) for r, df in noisy if r.world_size == base]
        if not noisy:
            raise PredictError(f"no {model} run at {base} GPU(s) has a noise.csv")
        at = _noise_scales(noisy, threshold, span, strict)
        b = _batch(noisy[0][0])
        if len({_batch(r) for r, _ in noisy}) > 1:
            raise PredictError(f"{model} runs at {base} GPU(s) with a noise.csv differ in "
                               "minibatch: give the runs of one minibatch")
        base_runs = [r for r in mine if r.world_size == base and _batch(r) == b]
        steps, reached = _base_steps(base_runs, threshold, smooth)
        dlts = [min(float(df["time"].min()) for df in r.steps.values()) - r.meta["start_time"]
                for r in base_runs if r.steps]
        params = base_runs[0].meta.get("parameters") or PARAMETERS.get(model)
        if params is None:
            raise PredictError(f"unknown parameter count for model {model!r}")
        fp16 = (base_runs[0].meta.get("config") or {}).get("train", {}).get(
            "grad_compression") == "fp16"
        step_s, pause_s = _step_and_pause(base_runs)
        pooled = pooled_b_noise(at)
        out[model] = Inputs(
            model=model, base_gpus=base, batch_per_rank=b, b_noise=pooled.b_noise,
            b_noise_range=pooled.interval(), noise=at, steps_to_loss=steps, reached=reached,
            step_s=step_s, pause_s_per_epoch=pause_s,
            dlt_s=float(np.mean(dlts)) if dlts else 0.0,
            train_events=int(base_runs[0].meta.get("train_events") or 0),
            grad_bytes=params * (2 if fp16 else 4), runs=[r.name for r in base_runs])
    return out


def compute_time_s(inp: Inputs, prof: Profile) -> tuple[float, str]:
    """Compute + data seconds per step on ``prof``'s GPU, and where the number comes from."""
    if prof.compute == "given":
        return prof.compute_ms / 1e3, "given by hand (--compute-ms)"
    if prof.compute == "runs":
        return inp.step_s, f"mean data_s + compute_s per step of {', '.join(inp.runs)}"
    ref = prof if prof.compute == "images_per_s" else load_profiles()[REFERENCE_PROFILE]
    if inp.model not in ref.images_per_s:
        raise PredictError(f"cluster {prof.name}: no per-GPU throughput for {inp.model}")
    t = inp.batch_per_rank / ref.images_per_s[inp.model]
    if prof.compute == "images_per_s":
        return t, f"{prof.name}'s published {ref.images_per_s[inp.model]} images/s per GPU"
    return t * ref.fp32_tflops / prof.fp32_tflops, (
        f"{ref.name}'s published step time scaled by FP32 peak "
        f"{ref.fp32_tflops}/{prof.fp32_tflops} TFLOP/s")


def fit_exponent(ns, ys) -> float | None:
    """Slope of log y on log N (None with fewer than two finite positive points)."""
    pts = [(n, y) for n, y in zip(ns, ys, strict=True) if y and y > 0 and math.isfinite(y)]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def _steps_text(inp: Inputs) -> str:
    """Where S_min comes from, or why there is none: the base runs that reached the
    threshold within their budget, and those that did not."""
    if inp.steps_to_loss is not None:
        return (f"{inp.steps_to_loss:.0f} (mean) in {', '.join(inp.runs)} at "
                f"{inp.base_gpus} {'rank' if inp.base_gpus == 1 else 'ranks'}, a minibatch "
                f"of {inp.batch_per_rank * inp.base_gpus}; S_min (steps at an unbounded "
                "batch) derived from them through B_noise")
    missed = [r for r in inp.runs if r not in inp.reached]
    if not inp.reached:
        return "not available: no base run reached the threshold within its budget"
    return (f"not available: only {len(inp.reached)} of {len(inp.runs)} base runs reached "
            f"the threshold within their budget ({', '.join(inp.reached)}; not "
            f"{', '.join(missed)}), and a mean over those that did would be biased low")


def _noise_source(inp: Inputs) -> str:
    """Where B_noise comes from, the rule that calls it measured, and its interval."""
    lo, hi = inp.b_noise_range
    bound = any(v.lower_bound for v in inp.noise)
    return (f"noise.csv of {', '.join(v.run for v in inp.noise)} ({inp.base_gpus} GPU(s)): "
            "mean tr(Sigma) / mean |G|^2 over the rows nearest the threshold loss, "
            "a measurement only where |G|^2 is resolved (its mean >= 2 standard errors)"
            + ("; not so in every run here: a 2-sigma lower bound, no upper limit" if bound
               else f"; 95 % interval {lo:.3g} to {hi:.3g} (log-space delta-method SE)")
            + "; B_noise taken as B_simple")


def predict(inp: Inputs, prof: Profile, gpus: list[int], algo: str = "ring",
            train_events: int | None = None) -> dict:
    """The prediction for one model on one cluster, as a JSON-ready dict; ``*_range``:
    the steps and TTL at the two ends of B_noise's interval (``b_noise_range``)."""
    events = train_events or inp.train_events
    if events < 1:
        raise PredictError(f"{inp.model}: number of training events unknown; give "
                           "--train-events")
    t_comp, comp_src = compute_time_s(inp, prof)
    local = prof.compute == "runs"
    dlt, pause = (inp.dlt_s, inp.pause_s_per_epoch) if local else (0.0, 0.0)
    b, base = inp.batch_per_rank, inp.base_gpus

    def point(n: int, s_base: float | None) -> dict:
        t_ar = allreduce_s(n, inp.grad_bytes, prof, algo)
        t_step = t_comp + t_ar
        per_epoch = math.ceil(events / (b * n))
        steps = [None if s_base is None else steps_at(s_base, bn, b, n, base)
                 for bn in (inp.b_noise, *inp.b_noise_range)]
        ttl = [None if x is None else dlt + x * (t_step + pause / per_epoch) for x in steps]
        return {"gpus": n, "batch": b * n, "step_s": t_step, "allreduce_s": t_ar,
                "steps_to_loss": steps[0], "ttl_s": ttl[0],
                "steps_to_loss_range": None if s_base is None else sorted(steps[1:]),
                "ttl_s_range": None if s_base is None else sorted(ttl[1:]),
                "epochs_per_min": 60.0 / (per_epoch * t_step + pause)}

    s_base = inp.steps_to_loss
    pts = [point(n, s_base) for n in gpus]
    ttl1 = point(1, s_base)["ttl_s"]
    for p in pts:
        p["efficiency"] = None if ttl1 is None else ttl1 / (p["gpus"] * p["ttl_s"])
        p["step_efficiency"] = t_comp / p["step_s"]
    # without DLT the exponent does not depend on the steps' scale
    fit = [point(n, 1.0 if s_base is None and not local else s_base) for n in FIT_GPUS]
    bound = any(v.lower_bound for v in inp.noise)
    return {
        "model": inp.model, "cluster": prof.name, "gpu": prof.gpu, "allreduce": algo,
        "threshold_loss": None, "b_noise": inp.b_noise, "n_crit": inp.b_noise / b,
        "b_noise_range": list(inp.b_noise_range),
        "n_crit_range": [x / b for x in inp.b_noise_range],
        "b_noise_is_lower_bound": bound, "batch_per_rank": b,
        "s_min": None if s_base is None else s_base / (1 + inp.b_noise / (b * base)),
        "train_events": events,
        "gradient_bytes": inp.grad_bytes, "compute_s_per_step": t_comp,
        "dlt_s": dlt, "pause_s_per_epoch": pause, "predicted": pts,
        "ttl_exponent": fit_exponent(FIT_GPUS, [p["ttl_s"] for p in fit]),
        "epoch_rate_exponent": fit_exponent(FIT_GPUS, [p["epochs_per_min"] for p in fit]),
        "fit_range": list(FIT_RANGE),
        "measured": {
            "b_noise": _noise_source(inp),
            "noise_per_run": [vars(v) for v in inp.noise],
            "s_min": _steps_text(inp),
            **({"compute": comp_src} if prof.compute == "runs" else {}),
            **({"dlt": "measured in the base runs",
                "pauses": "evaluation/checkpoint time per epoch measured in the base runs, "
                          "assumed the same at every N"} if local else {})},
        "assumed": {
            # a published throughput (the paper's) is taken, not measured here
            **({"compute": comp_src} if prof.compute != "runs" else {}),
            **({} if local else {"dlt": "not modelled (0)", "pauses": "not modelled (0)"}),
            "steps": "S(B) = S_min (1 + B_noise / B), fitted for SGD; here Adam, fixed lr",
            "ranges": "steps and TTL ranges from B_noise's interval alone (the base runs' "
                      "steps and step time taken as exact)",
            "allreduce": f"{algo} allreduce, links from {prof.name}: "
                         + "; ".join(prof.sources),
            "gradient_bytes": "parameters x 4 (x 2 with fp16 compression), one allreduce "
                              "per step, no overlap with compute"},
    }


def measured_points(runs: list[Run], threshold: float, smooth: int | None,
                    clock: str = "train") -> dict:
    """(model, N) -> the runs at that N: their mean epoch rate and mean TTL. Where any of
    them is censored (:func:`~lartpc.analysis.metrics.run_metrics`) ``ttl_s`` is None and
    ``ttl_lower_bound_s`` the mean of the TTLs and the censored runs' bounds: a lower
    bound of the mean TTL (a mean over the runs that reached it would be biased low);
    neither where a censored run has no bound (it diverged), as
    :func:`~lartpc.analysis.fit.mean_ttl` gives the scaling table's."""
    acc: dict[tuple[str, int], list] = {}
    for r in runs:
        acc.setdefault((r.model, r.world_size), []).append(
            run_metrics(r, threshold, smooth, clock))
    out = {}
    for key, ms in acc.items():
        ttl, bound = mean_ttl(ms)  # as analyze fit's scaling table takes it
        rate = [m.epoch_rate_per_min for m in ms if m.epoch_rate_per_min is not None]
        out[key] = {"ttl_s": None if bound else ttl,
                    "ttl_lower_bound_s": ttl if bound else None,
                    "runs": len(ms), "ttl_censored": sum(m.ttl_censored for m in ms),
                    "epochs_per_min": float(np.mean(rate)) if rate else None}
    return out


def check_options(args) -> tuple[list[int], Profile]:
    """The GPU counts and the cluster profile of parsed ``predict`` options, each checked
    (the command calls this before it reads a run).

    Raises
    ------
    PredictError
        Naming the option: a span, event or GPU count below 1, a non-finite or
        non-positive threshold or link figure, an unknown cluster, a bad cluster file.
    """
    if not (math.isfinite(args.threshold) and args.threshold > 0):
        raise PredictError(f"--threshold must be a positive number (the loss the noise "
                           f"scale is read at), got {args.threshold}")
    if args.span < 1:
        raise PredictError(f"--span must be at least 1 row, got {args.span}")
    if args.train_events is not None and args.train_events < 1:
        raise PredictError(f"--train-events must be >= 1, got {args.train_events}")
    base = getattr(args, "base_gpus", None)
    if base is not None and base < 1:
        raise PredictError(f"--base-gpus must be >= 1, got {base}")
    gpus = parse_gpus(args.gpus)
    prof = choose_profile(args.cluster, args.alpha_us, args.beta_gbps, args.compute_ms,
                          getattr(args, "cluster_file", None))
    return gpus, prof


def _interval(r: dict, key: str) -> str:
    """`` (95 % lo to hi)`` of ``r[key + '_range']`` where it has both ends, else ''."""
    lo, hi = r.get(f"{key}_range") or (None, None)
    ok = all(isinstance(x, float | int) and math.isfinite(x) for x in (lo, hi))
    return f" (95 % {lo:.3g} to {hi:.3g})" if ok else ""


def noise_text(r: dict) -> str:
    """``B_noise 18.3 (95 % 9.1 to 37) at loss 1.2, N_crit 2.61 (95 % 1.3 to 5.3)`` for
    one of :func:`run_predict`'s results, saying what the numbers are: ``>`` where
    B_noise is a lower bound (|G|^2 not resolved: its mean under 2 standard errors), its
    95 % interval where it was measured, and the loss it was taken at where a run never
    reached the threshold (its lowest-loss rows, not the threshold's)."""
    bound = ">" if r["b_noise_is_lower_bound"] else ""
    used = r["measured"].get("noise_per_run") or []
    short = [v["run"] for v in used if not v["reached"]]
    at = f"at loss {r['threshold_loss']:g}"
    if short:
        at = (f"at loss {float(np.mean([v['loss'] for v in used])):.3g} (loss "
              f"{r['threshold_loss']:g} not reached by {', '.join(short)}: its lowest rows)")
    return (f"B_noise {bound}{r['b_noise']:.3g}{_interval(r, 'b_noise')} {at}, "
            f"N_crit {bound}{r['n_crit']:.3g}{_interval(r, 'n_crit')}")


def run_predict(runs: list[Run], args) -> tuple[list[dict], dict]:
    """Everything ``python -m lartpc.analysis predict`` computes, from parsed arguments."""
    gpus, prof = check_options(args)
    inputs = gather_inputs(runs, args.threshold, args.smooth, args.span, args.base_gpus,
                           getattr(args, "strict", False))
    results, clock = [], getattr(args, "clock", "train")
    for inp in inputs.values():
        if clock == "train":  # training time: the pauses are evaluation and checkpoints
            inp = replace(inp, pause_s_per_epoch=0.0)
        res = predict(inp, prof, gpus, args.allreduce, args.train_events)
        res["threshold_loss"], res["clock"] = args.threshold, clock
        results.append(res)
    # measured points belong beside predictions for the machine they were measured on
    measured = measured_points(runs, args.threshold, args.smooth,
                               getattr(args, "clock", "train")) \
        if prof.compute == "runs" else {}
    return results, measured
