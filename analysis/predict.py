"""Predict time-to-loss and epoch rate to many GPUs from a few small runs.

Statistical half (measured): synchronous data parallelism at ``b`` images per rank is
one optimizer at B = b N. Steps to a loss follow S(B) = S_min (1 + B_noise / B)
(McCandlish et al. 2018), with B_noise measured in training (``noise.csv``, see
:mod:`lartpc.analysis.noise`) at the loss threshold and S_min from the base runs' measured steps
to that loss: S_min = S_base / (1 + B_noise / B_base). Critical GPU count
N_crit = B_noise / b.

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
independent of N), and not modelled (0) on other clusters. Epoch rate = 60 / epoch
time. Efficiency = TTL(1) / (N TTL(N)); step efficiency = t_step(1) / t_step(N).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from lartpc.analysis.metrics import primary_steps, smoothed_loss, smoothing_window
from lartpc.analysis.noise import (
    DEFAULT_SPAN,
    NoiseAtLoss,
    b_noise_at_loss,
    noise_tables,
    pooled_b_noise,
)
from lartpc.analysis.runs import Run, RunFolderError

from lartpc.cliparse import int_list
from lartpc.fsutil import UnsafePathError, plain_name
from lartpc.runfolder.record import batch_per_rank

log = logging.getLogger(__name__)
CLUSTERS_FILE = Path(__file__).with_name("clusters.json")
#: float32 parameters of the published models (counted by lartpc.models at 3600 x 3600)
PARAMETERS = {"jishnet": 1_335_817, "scnet": 1_703_999}
REFERENCE_PROFILE = "summitdev"  # whose measured throughput FP32-scaled profiles start from
FIT_RANGE = (32, 192)  # the paper's GPU counts
FIT_GPUS = (32, 48, 64, 96, 128, 160, 192)
DEFAULT_GPUS = tuple(2**k for k in range(11))


class PredictError(RunFolderError):
    """Bad input to ``analysis predict`` (one line; the CLI exits 2)."""


@dataclass
class Profile:
    """A cluster: links, GPUs per node, and where the per-step compute time comes from."""

    name: str
    gpus_per_node: int
    alpha_intra_us: float
    beta_intra_GBps: float
    alpha_inter_us: float
    beta_inter_GBps: float
    compute: str  #: runs | images_per_s | fp32_scaled | given
    gpu: str = ""
    fp32_tflops: float | None = None
    images_per_s: dict[str, float] = field(default_factory=dict)
    compute_ms: float | None = None
    sources: list[str] = field(default_factory=list)


def load_profiles(path: Path = CLUSTERS_FILE) -> dict[str, Profile]:
    data = json.loads(Path(path).read_text())
    return {k: Profile(name=k, **v) for k, v in data.items() if not k.startswith("_")}


_LINK_FIELDS = ("alpha_intra_us", "beta_intra_GBps", "alpha_inter_us", "beta_inter_GBps")
_COMPUTES = ("runs", "images_per_s", "fp32_scaled", "given")


def load_profile_file(path: Path | str) -> Profile:
    """One cluster profile from a JSON file (``--cluster-file``): the fields of an entry of
    analysis/clusters.json (``lartpc bench allreduce --out`` writes one), plus an optional
    ``name`` and ``measured`` block. Every problem is a :class:`PredictError` naming the
    file and the field."""
    where = f"--cluster-file {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise PredictError(f"{where}: cannot read ({e.strerror or e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PredictError(f"{where}: not JSON ({e})") from e
    if not isinstance(data, dict):
        raise PredictError(f"{where}: expected one JSON object (a cluster profile)")
    known = {f for f in Profile.__dataclass_fields__} | {"measured", "_doc"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PredictError(f"{where}: unknown field {unknown[0]!r}")
    for f in ("gpus_per_node", *_LINK_FIELDS):
        if f not in data:
            raise PredictError(f"{where}: missing field {f!r}")

    def number(f: str, positive: bool) -> float:
        v = data[f]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
            and (v > 0 if positive else v >= 0)
        if not ok:
            raise PredictError(f"{where}: field {f!r} must be a "
                               f"{'positive' if positive else 'non-negative'} number, got {v!r}")
        return float(v)

    gpn = data["gpus_per_node"]
    if not isinstance(gpn, int) or isinstance(gpn, bool) or gpn < 1:
        raise PredictError(f"{where}: field 'gpus_per_node' must be a whole number >= 1, "
                           f"got {gpn!r}")
    links = {f: number(f, f.startswith("beta")) for f in _LINK_FIELDS}
    compute = data.get("compute", "runs")
    if compute not in _COMPUTES:
        raise PredictError(f"{where}: field 'compute' must be one of {', '.join(_COMPUTES)}, "
                           f"got {compute!r}")
    need = {"images_per_s": "images_per_s", "fp32_scaled": "fp32_tflops",
            "given": "compute_ms"}.get(compute)
    if need and need not in data:
        raise PredictError(f"{where}: missing field {need!r} (compute is {compute!r})")
    for f in ("fp32_tflops", "compute_ms"):
        if f in data:
            number(f, True)
    ips = data.get("images_per_s", {})
    if not isinstance(ips, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for v in ips.values()):
        raise PredictError(f"{where}: field 'images_per_s' must map models to positive numbers")
    name = data.get("name", Path(path).stem)
    sources = data.get("sources", [])
    if not isinstance(name, str) or not name:
        raise PredictError(f"{where}: field 'name' must be a non-empty string")
    try:  # the figure is predict-<name>.png in --out: a name with a path escapes it
        plain_name(name, f"{where}: field 'name'")
    except UnsafePathError as e:
        raise PredictError(str(e)) from None
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        raise PredictError(f"{where}: field 'sources' must be a list of strings")
    return Profile(name=name, gpus_per_node=gpn, **links, compute=compute,
                   gpu=str(data.get("gpu", "")), fp32_tflops=data.get("fp32_tflops"),
                   images_per_s=dict(ips), compute_ms=data.get("compute_ms"),
                   sources=[*sources, f"profile read from {path}"])


def choose_profile(name: str | None, alpha_us: float | None, beta_gbps: float | None,
                   compute_ms: float | None, cluster_file: Path | str | None = None) -> Profile:
    """A named profile or one from ``cluster_file``, optionally overridden by hand, or one
    given wholly by hand."""
    profiles = load_profiles()
    if name is not None and cluster_file is not None:
        raise PredictError("give --cluster NAME or --cluster-file FILE, not both")
    if cluster_file is not None:
        prof = load_profile_file(cluster_file)
    elif name is None:
        if alpha_us is None or beta_gbps is None:
            raise PredictError("give --cluster NAME, --cluster-file FILE, or --alpha-us and "
                               "--beta-gbps "
                               f"(clusters: {', '.join(profiles)})")
        prof = Profile(name="custom", gpus_per_node=1, alpha_intra_us=alpha_us,
                       beta_intra_GBps=beta_gbps, alpha_inter_us=alpha_us,
                       beta_inter_GBps=beta_gbps, compute="runs",
                       sources=["alpha, beta given on the command line"])
    elif name not in profiles:
        raise PredictError(f"unknown cluster {name!r}; known: {', '.join(profiles)}")
    else:
        prof = profiles[name]
    for flag, v in (("alpha-us", alpha_us), ("beta-gbps", beta_gbps),
                    ("compute-ms", compute_ms)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise PredictError(f"--{flag} must be a positive number, got {v}")
    if alpha_us is not None:
        prof = replace(prof, alpha_intra_us=alpha_us, alpha_inter_us=alpha_us)
    if beta_gbps is not None:
        prof = replace(prof, beta_intra_GBps=beta_gbps, beta_inter_GBps=beta_gbps)
    if compute_ms is not None:
        prof = replace(prof, compute="given", compute_ms=compute_ms)
    return prof


def parse_gpus(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4], sorted and distinct; each a whole number >= 1."""
    return sorted(set(int_list(text, "--gpus", minimum=1, error=PredictError)))


def allreduce_s(n: int, nbytes: float, prof: Profile, algo: str = "ring") -> float:
    """Seconds for one allreduce of ``nbytes`` over ``n`` GPUs (0 for one GPU)."""
    if n <= 1:
        return 0.0
    inside = n <= prof.gpus_per_node
    alpha = 1e-6 * (prof.alpha_intra_us if inside else max(prof.alpha_intra_us,
                                                           prof.alpha_inter_us))
    beta = 1e9 * (prof.beta_intra_GBps if inside else min(prof.beta_intra_GBps,
                                                          prof.beta_inter_GBps))
    if algo == "ring":
        return 2 * (n - 1) / n * nbytes / beta + 2 * (n - 1) * alpha
    if algo == "tree":
        return 2 * math.log2(n) * alpha + 2 * nbytes / beta
    raise PredictError(f"--allreduce {algo!r}: expected ring or tree")


@dataclass
class Inputs:
    """What the base runs of one model measured (times in seconds)."""

    model: str
    base_gpus: int
    batch_per_rank: int
    b_noise: float
    noise: list[NoiseAtLoss]
    steps_to_loss: float | None  #: None when no base run reached the threshold
    step_s: float  #: mean data_s + compute_s (+ comm_s on one GPU, where nothing is exchanged)
    pause_s_per_epoch: float  #: time between steps not in them (evaluation, checkpoints)
    dlt_s: float
    train_events: int
    grad_bytes: float
    runs: list[str]


def _step_and_pause(runs: list[Run]) -> tuple[float, float]:
    """Mean step time and mean pause per epoch (evaluation, checkpoint) of the runs' first
    ranks, the first step (warm-up) left out."""
    steps, pauses = [], []
    for r in runs:
        df = primary_steps(r)
        if df is None or len(df) < 3:
            continue
        cols = ["data_s", "compute_s"] + (["comm_s"] if r.world_size == 1 else [])
        each = df[cols].sum(axis=1).to_numpy()[1:]
        steps.append(each.mean())
        wall = np.diff(df["time"].to_numpy())
        epochs = max(1, int(df["epoch"].iloc[-1] - df["epoch"].iloc[0]))
        pauses.append(max(0.0, float(wall.sum() - df[cols + ["comm_s"] * (r.world_size > 1)]
                                     .sum(axis=1).to_numpy()[1:].sum())) / epochs)
    if not steps:
        raise PredictError("the base runs have fewer than 3 logged steps: no step time")
    return float(np.mean(steps)), float(np.mean(pauses))


def _steps_to_loss(run: Run, threshold: float, smooth: int | None) -> int | None:
    steps = primary_steps(run)
    if steps is None:
        return None
    sm = smoothed_loss(steps, smoothing_window(len(steps), smooth)).to_numpy()
    below = np.flatnonzero(sm < threshold)
    return int(below[0]) + 1 if below.size else None


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
    threshold, step time, pauses and DLT from all of them (with or without the
    measurement). Runs at other sizes are not used."""
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
        reached = [s for r in base_runs if (s := _steps_to_loss(r, threshold, smooth))]
        dlts = [min(float(df["time"].min()) for df in r.steps.values()) - r.meta["start_time"]
                for r in base_runs if r.steps]
        params = base_runs[0].meta.get("parameters") or PARAMETERS.get(model)
        if params is None:
            raise PredictError(f"unknown parameter count for model {model!r}")
        fp16 = (base_runs[0].meta.get("config") or {}).get("train", {}).get(
            "grad_compression") == "fp16"
        step_s, pause_s = _step_and_pause(base_runs)
        out[model] = Inputs(
            model=model, base_gpus=base, batch_per_rank=b, b_noise=pooled_b_noise(at),
            noise=at, steps_to_loss=float(np.mean(reached)) if reached else None,
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


def predict(inp: Inputs, prof: Profile, gpus: list[int], algo: str = "ring",
            train_events: int | None = None) -> dict:
    """The prediction for one model on one cluster, as a JSON-ready dict."""
    events = train_events or inp.train_events
    if events < 1:
        raise PredictError(f"{inp.model}: number of training events unknown; give "
                           "--train-events")
    t_comp, comp_src = compute_time_s(inp, prof)
    local = prof.compute == "runs"
    dlt, pause = (inp.dlt_s, inp.pause_s_per_epoch) if local else (0.0, 0.0)
    b = inp.batch_per_rank
    s_min = None if inp.steps_to_loss is None else \
        inp.steps_to_loss / (1 + inp.b_noise / (b * inp.base_gpus))

    def point(n: int) -> dict:
        t_ar = allreduce_s(n, inp.grad_bytes, prof, algo)
        t_step = t_comp + t_ar
        steps = None if s_min is None else s_min * (1 + inp.b_noise / (b * n))
        per_epoch = math.ceil(events / (b * n))
        ttl = None if steps is None else dlt + steps * (t_step + pause / per_epoch)
        return {"gpus": n, "batch": b * n, "step_s": t_step, "allreduce_s": t_ar,
                "steps_to_loss": steps, "ttl_s": ttl,
                "epochs_per_min": 60.0 / (per_epoch * t_step + pause)}

    pts = [point(n) for n in gpus]
    ttl1 = point(1)["ttl_s"]
    for p in pts:
        p["efficiency"] = None if ttl1 is None else ttl1 / (p["gpus"] * p["ttl_s"])
        p["step_efficiency"] = t_comp / p["step_s"]
    fit = [point(n) for n in FIT_GPUS]
    if s_min is None and not local:  # without DLT the exponent does not depend on S_min
        s_min = 1.0
        fit = [point(n) for n in FIT_GPUS]
        s_min = None
    return {
        "model": inp.model, "cluster": prof.name, "gpu": prof.gpu, "allreduce": algo,
        "threshold_loss": None, "b_noise": inp.b_noise, "n_crit": inp.b_noise / b,
        "b_noise_is_lower_bound": any(v.lower_bound for v in inp.noise),
        "batch_per_rank": b, "s_min": s_min, "train_events": events,
        "gradient_bytes": inp.grad_bytes, "compute_s_per_step": t_comp,
        "dlt_s": dlt, "pause_s_per_epoch": pause, "predicted": pts,
        "ttl_exponent": fit_exponent(FIT_GPUS, [p["ttl_s"] for p in fit]),
        "epoch_rate_exponent": fit_exponent(FIT_GPUS, [p["epochs_per_min"] for p in fit]),
        "fit_range": list(FIT_RANGE),
        "measured": {
            "b_noise": f"noise.csv of {', '.join(v.run for v in inp.noise)} "
                       f"({inp.base_gpus} GPU(s)): mean "
                       "tr(Sigma) / mean |G|^2 over the rows nearest the threshold loss"
                       + (" (a lower bound: |G|^2 not resolved)" if any(
                           v.lower_bound for v in inp.noise) else "")
                       + "; B_noise taken as B_simple",
            "noise_per_run": [vars(v) for v in inp.noise],
            "s_min": f"steps to the threshold in {', '.join(inp.runs)}" if s_min else
                     "not available: no base run reached the threshold",
            **({"compute": comp_src} if prof.compute == "runs" else {}),
            **({"dlt": "measured in the base runs",
                "pauses": "evaluation/checkpoint time per epoch measured in the base runs, "
                          "assumed the same at every N"} if local else {})},
        "assumed": {
            # a published throughput (the paper's) is taken, not measured here
            **({"compute": comp_src} if prof.compute != "runs" else {}),
            **({} if local else {"dlt": "not modelled (0)", "pauses": "not modelled (0)"}),
            "steps": "S(B) = S_min (1 + B_noise / B), fitted for SGD; here Adam, fixed lr",
            "allreduce": f"{algo} allreduce, links from {prof.name}: "
                         + "; ".join(prof.sources),
            "gradient_bytes": "parameters x 4 (x 2 with fp16 compression), one allreduce "
                              "per step, no overlap with compute"},
    }


def measured_points(runs: list[Run], threshold: float, smooth: int | None,
                    clock: str = "train") -> dict:
    """(model, N) -> measured mean TTL and epoch rate over the runs at that N."""
    from lartpc.analysis.metrics import run_metrics

    acc: dict[tuple[str, int], list] = {}
    for r in runs:
        acc.setdefault((r.model, r.world_size), []).append(
            run_metrics(r, threshold, smooth, clock))
    out = {}
    for key, ms in acc.items():
        ttl = [m.ttl_s for m in ms if m.ttl_s is not None]
        rate = [m.epoch_rate_per_min for m in ms if m.epoch_rate_per_min is not None]
        out[key] = {"ttl_s": float(np.mean(ttl)) if ttl else None,
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


def noise_text(r: dict) -> str:
    """``B_noise 18.3 at loss 1.2, N_crit 2.61`` for one of :func:`run_predict`'s
    results, saying what the numbers are: ``>`` where B_noise is a lower bound (|G|^2
    not resolved), and the loss it was taken at where a run never reached the
    threshold (its lowest-loss rows, not the threshold's)."""
    bound = ">" if r["b_noise_is_lower_bound"] else ""
    used = r["measured"].get("noise_per_run") or []
    short = [v["run"] for v in used if not v["reached"]]
    at = f"at loss {r['threshold_loss']:g}"
    if short:
        at = (f"at loss {float(np.mean([v['loss'] for v in used])):.3g} (loss "
              f"{r['threshold_loss']:g} not reached by {', '.join(short)}: its lowest rows)")
    return f"B_noise {bound}{r['b_noise']:.3g} {at}, N_crit {bound}{r['n_crit']:.3g}"


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
