"""Tables, figures and the report section of the noise-scale prediction
(lartpc.analysis.predict)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from lartpc.analysis.noise import binned, noise_tables, smoothed
from lartpc.analysis.predict import FIT_RANGE, noise_text, run_predict
from lartpc.analysis.runs import Run, RunFolderError

from lartpc.fsutil import atomic_write


def _fmt(v, spec: str) -> str:
    """``v`` formatted by ``spec``; a missing value is a '-' at the same width."""
    if v is None:
        width = "".join(c for c in spec.split(".")[0] if c.isdigit())
        return "-".rjust(int(width or 0))
    return format(v, spec)


_LABELS = {"b_noise": "B_noise", "s_min": "steps to the threshold", "compute": "step time",
           "dlt": "data-loading time", "pauses": "pauses", "steps": "steps vs batch",
           "allreduce": "allreduce", "gradient_bytes": "gradient bytes"}


def _range(v: list | None) -> str:
    """``lo..hi`` of a predicted range, '-' without one, 17 wide."""
    return "-".rjust(17) if v is None else f"{v[0]:.1f}..{v[1]:.1f}".rjust(17)


def _measured_ttl(m: dict) -> str:
    """The measured mean TTL, ``>bound`` where a run at that N is censored, 12 wide."""
    if m.get("ttl_s") is None and m.get("ttl_lower_bound_s") is not None:
        return f">{m['ttl_lower_bound_s']:.1f}".rjust(12)
    return _fmt(m.get("ttl_s"), "12.1f")


def _bound_notes(r: dict, measured: dict[tuple[str, int], dict]) -> list[str]:
    """What a measured ``>`` TTL is, per GPU count of ``r``'s model."""
    return [f"  measured, TTL at {n} GPU(s): a lower bound, {m['ttl_censored']} of "
            f"{m['runs']} runs censored (the mean of their TTLs and censoring times; a "
            "mean over the runs that reached it would be biased low)"
            for (model, n), m in sorted(measured.items())
            if model == r["model"] and m.get("ttl_censored")]


def to_text(results: list[dict], measured: dict[tuple[str, int], dict]) -> str:
    """A table per model; measured points (other runs of the same model) beside."""
    lines = []
    for r in results:
        ttl = ("TTL not predicted (no steps to the threshold)" if r["ttl_exponent"] is None
               else f"TTL ~ N^{r['ttl_exponent']:.2f}")
        exps = (f"fitted over {r['fit_range'][0]}-{r['fit_range'][1]} GPUs: {ttl}, "
                f"epoch rate ~ N^{_fmt(r['epoch_rate_exponent'], '.2f')}")
        lines += [f"{r['model']} on {r['cluster']} ({r['allreduce']} allreduce): "
                  f"{noise_text(r)}, "
                  f"step {r['compute_s_per_step'] * 1e3:.1f} ms + allreduce", exps,
                  f"{'GPUs':>6} {'TTL s':>10} {'TTL range s':>17} {'epochs/min':>11} "
                  f"{'effic.':>7} {'allreduce ms':>13} {'meas. TTL s':>12} "
                  f"{'meas. ep/min':>13}"]
        for p in r["predicted"]:
            m = measured.get((r["model"], p["gpus"]), {})
            lines.append(f"{p['gpus']:>6} {_fmt(p['ttl_s'], '10.1f')} "
                         f"{_range(p.get('ttl_s_range'))} "
                         f"{p['epochs_per_min']:>11.3g} {_fmt(p['efficiency'], '7.2f')} "
                         f"{p['allreduce_s'] * 1e3:>13.3f} {_measured_ttl(m)} "
                         f"{_fmt(m.get('epochs_per_min'), '13.3g')}")
        lines += [f"  measured, {_LABELS.get(k, k)}: {v}" for k, v in r["measured"].items()
                  if k != "noise_per_run"] + _bound_notes(r, measured)
        lines += [f"  assumed, {_LABELS.get(k, k)}: {v}" for k, v in r["assumed"].items()]
        lines.append("")
    return "\n".join(lines)


def _measured_marks(ax, r: dict, measured: dict[tuple[str, int], dict], key: str,
                    color) -> bool:
    """The measured ``key`` of ``r``'s model beside its prediction (open triangles: a
    mean TTL only bounded below, runs at that N censored); whether any was drawn."""
    mine = [(n, m) for (model, n), m in measured.items() if model == r["model"]]
    pts = [(n, m[key]) for n, m in mine if m.get(key)]
    bounds = [(n, m["ttl_lower_bound_s"]) for n, m in mine
              if key == "ttl_s" and m.get("ttl_lower_bound_s")]
    if pts:
        ax.plot(*zip(*pts, strict=True), "o", color=color, label=f"{r['model']} measured")
    if bounds:
        ax.plot(*zip(*bounds, strict=True), "^", mfc="none", color=color,
                label=f"{r['model']} measured, lower bound")
    return bool(pts or bounds)


def _ttl_band(ax, r: dict, color) -> None:
    """The predicted TTL's range from B_noise's uncertainty, shaded."""
    spans = [(p["gpus"], *p["ttl_s_range"]) for p in r["predicted"] if p.get("ttl_s_range")]
    if spans:
        ax.fill_between(*zip(*spans, strict=True), color=color, alpha=0.15, lw=0)


def write_figure(results: list[dict], measured: dict[tuple[str, int], dict],
                 out: Path) -> Path:
    """``predict-<cluster>.png``: predicted TTL and epoch rate vs N, measured points."""
    from lartpc.analysis.plots import plt  # Agg

    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    drawn = [False, False]  # a log axis with nothing positive on it cannot be drawn
    for r in results:
        ns = [p["gpus"] for p in r["predicted"]]
        for i, (ax, key) in enumerate(zip(axes, ("ttl_s", "epochs_per_min"), strict=True)):
            ys = [p[key] for p in r["predicted"]]
            line, = ax.plot(ns, [np.nan if y is None else y for y in ys], "-",
                            label=f"{r['model']} predicted")
            drawn[i] |= any(y is not None and y > 0 for y in ys)
            drawn[i] |= _measured_marks(ax, r, measured, key, line.get_color())
        _ttl_band(axes[0], r, line.get_color())
        axes[0].axvline(r["n_crit"], ls=":", color=line.get_color())
    for ax, title, ok in zip(axes, ("time to loss (s); dotted: N_crit, shaded: B_noise range",
                                       "epochs / min"),
                             drawn, strict=True):
        ax.set(xscale="log", yscale="log" if ok else "linear", xlabel="GPUs", title=title)
        if not ok:
            ax.text(0.5, 0.5, "not predicted", transform=ax.transAxes, ha="center")
        ax.axvspan(*FIT_RANGE, color="0.9")
        ax.legend(fontsize=8)
    fig.suptitle(f"predicted on {results[0]['cluster']} (grey: the paper's 32-192 GPUs)")
    path = out / f"predict-{results[0]['cluster']}.png"
    fig.tight_layout()
    try:  # replaces a link planted at path, never writes through it
        atomic_write(path, lambda f: fig.savefig(f, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return path


def write_noise_figure(curves: list[tuple[Run, object]], out: Path,
                       span: int) -> Path | None:
    """``noise_scale.png``: smoothed B_noise against training step and against loss, of
    each (run, noise table) in ``curves`` (:func:`~lartpc.analysis.noise.noise_tables`)."""
    from lartpc.analysis.plots import plt  # Agg

    if not curves:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r, df in curves:
        s, b = smoothed(df, span), binned(df, span=span)
        ok = s["b_noise"] > 0
        line, = axes[0].plot(s["step"][ok], s["b_noise"][ok], label=r.name)
        ok = b["b_noise"] > 0
        axes[1].errorbar(b["loss"][ok], b["b_noise"][ok], yerr=b["b_noise_se"][ok], fmt="o-",
                         color=line.get_color(), label=r.name)
    axes[0].set(xlabel="step", ylabel="B_noise (images)", yscale="log",
                title="noise scale over training (EMA of each estimate)")
    axes[1].set(xlabel="smoothed loss", yscale="log",
                title="against loss (ratio of means per bin, ±1 SE)")
    axes[1].invert_xaxis()
    for text in axes[0].legend(fontsize=7).get_texts():
        text.set_parse_math(False)  # run folder names: a '$' must not start mathtext
    fig.tight_layout()
    path = out / "noise_scale.png"
    try:
        atomic_write(path, lambda f: fig.savefig(f, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return path


def local_prediction(runs: list[Run], threshold: float, smooth: int | None,
                     strict: bool = False):
    """:func:`run_predict` from 1 to 1,024 ranks with this machine's profile (local-cpu);
    raises :class:`~lartpc.analysis.runs.RunFolderError` when the runs measured no noise scale
    or one it cannot resolve."""
    from argparse import Namespace

    args = Namespace(gpus="1,2,4,8,16,32,64,128,256,512,1024", cluster="local-cpu",
                     alpha_us=None, beta_gbps=None, compute_ms=None, allreduce="ring",
                     train_events=None, base_gpus=None, span=20, threshold=threshold,
                     smooth=smooth, strict=strict)
    return run_predict(runs, args)


def noise_section(runs: list[Run], threshold: float, smooth: int | None, out: Path,
                  img, strict: bool = False) -> tuple[str, list[dict]]:
    """The report's noise-scale section ('' when no run measured it): B_noise over
    training, N_crit, and the prediction on this machine beside the measured points;
    with the prediction's results (empty without one). A ``noise.csv`` that cannot be
    read leaves its run out with a warning (``strict``: the report fails)."""
    skipped: list[tuple] = []
    fig = write_noise_figure(noise_tables(runs, strict, skipped), out, 20)
    warn = "".join(f'<p class="warn">Not used for the noise scale: {html.escape(s)}</p>'
                   for _, s in skipped)
    runs = [r for r in runs if all(r is not bad for bad, _ in skipped)]
    if fig is None:
        return (f"<h2>Gradient noise scale</h2>{warn}" if warn else ""), []
    parts = ["<h2>Gradient noise scale and predicted scaling</h2>", warn,
             img(fig, "noise scale")]
    try:
        results, measured = local_prediction(runs, threshold, smooth, strict)
    except RunFolderError as e:  # PredictError, or a noise scale the runs cannot resolve
        return "".join(parts) + f"<p>No prediction: {html.escape(str(e))}</p>", []
    pred = write_figure(results, measured, out)
    lines = [f"{r['model']}: {noise_text(r)} ranks; predicted with the runs' own measured "
             "step time and an assumed Gloo link (the local-cpu profile): "
             + ("TTL not predicted (no run reached the threshold)"
                if r["ttl_exponent"] is None else f"TTL ~ N^{r['ttl_exponent']:.2f}")
             + f", epoch rate ~ N^{_fmt(r['epoch_rate_exponent'], '.2f')} over "
             f"{FIT_RANGE[0]}-{FIT_RANGE[1]} ranks" for r in results]
    parts += ["<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in lines) + "</ul>",
              img(pred, "predicted TTL and epoch rate"),
              "<p>Other clusters: <code>lartpc analyze predict RUNS --cluster "
              "summitdev|summit|perlmutter|h100-ndr</code>.</p>"]
    return "".join(parts), results
