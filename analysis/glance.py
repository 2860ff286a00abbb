"""What a set of runs can really show, in a few sentences: the opening of the report and
the demo's closing summary.

On a small host (the 2-core demo machine) three things are measured honestly: sparse
against dense images/s per rank on the same events, the gradient noise scale, and the
forecast built on it. Scaling across ranks is not: ranks that share one host's cores
measure contention for them, and the summary says so instead of quoting a speedup.
"""

from __future__ import annotations

import numpy as np
from lartpc.analysis.tables import Analysis


def _per_rank_rate(a: Analysis, model: str) -> tuple[float, int] | None:
    """Median images/s per rank of ``model``'s runs at its smallest rank count."""
    rows = [m for m in a.rows if m.model == model and m.images_per_s_per_gpu]
    if not rows:
        return None
    n0 = min(m.world_size for m in rows)
    return float(np.median([m.images_per_s_per_gpu for m in rows if m.world_size == n0])), n0


def _same_events(a: Analysis, models: list[str]) -> bool:
    """True when every run of ``models`` trained on one store (its recorded identity)."""
    ids = {str(r.meta.get("store")) for r in a.runs if r.model in models}
    return len(ids) == 1 and "None" not in ids


def sparse_vs_dense(a: Analysis) -> str | None:
    """SCNet against JishNet images/s per rank, when both were run."""
    s, d = _per_rank_rate(a, "scnet"), _per_rank_rate(a, "jishnet")
    if s is None or d is None:
        return None
    where = "on the same events" if _same_events(a, ["scnet", "jishnet"]) else \
        "on different event sets (compare with care)"
    return (f"Sparse against dense, {where}: SCNet {s[0]:.3g} images/s per rank "
            f"({s[1]} rank{'s' if s[1] > 1 else ''}), JishNet {d[0]:.3g} "
            f"({d[1]} rank{'s' if d[1] > 1 else ''}): {s[0] / d[0]:.3g}x per rank.")


def shared_host(a: Analysis) -> list[str]:
    """One line per model whose multi-rank runs put every rank on one host whose cores
    they filled: their epoch rate against the smallest N measures contention."""
    lines = []
    for model in sorted({m.model for m in a.rows}):
        pairs = [(r, m) for r, m in zip(a.runs, a.rows, strict=True) if m.model == model]
        crowded = [(r, m) for r, m in pairs if m.world_size > 1
                   and r.meta.get("local_size") == m.world_size and r.meta.get("host_cpus")
                   and m.world_size * (r.meta.get("threads_per_rank") or 1)
                   >= r.meta["host_cpus"]]
        if not crowded:
            continue
        r, m = crowded[0]
        ratio = ""
        summary = a.models.get(model, {})
        row = next((x for x in summary.get("scaling", []) if x["gpus"] == m.world_size), None)
        # speedups are relative to the smallest N with an epoch rate: only a 1-rank one
        if row and row["speedup"] is not None and summary.get("baseline_gpus") == 1:
            ratio = (f" (its {m.world_size}-rank epoch rate is {row['speedup']:.3g}x the "
                     "1-rank one)")
        lines.append(f"{model}: the {m.world_size}-rank runs ran on one host with "
                     f"{r.meta['host_cpus']} cores, every core busy{ratio}; ranks sharing "
                     "a host's cores and memory bandwidth measure contention, so these "
                     "scaling numbers are not the study's (that needs one GPU, or one "
                     "host's cores, per rank).")
    return lines


def noise_lines(predictions: list[dict] | None) -> list[str]:
    """The noise scale and what it forecasts, from :func:`lartpc.analysis.predict.run_predict`."""
    from lartpc.analysis.predict import noise_text

    out = []
    for r in predictions or []:
        if r.get("b_noise") is None or r.get("n_crit") is None:
            continue
        out.append(f"{r['model']}: gradient noise scale {noise_text(r)} ranks (N_crit = "
                   "B_noise / minibatch): beyond that, more ranks at this per-rank "
                   "minibatch barely shorten the time to loss.")
    return out


def at_a_glance(a: Analysis, predictions: list[dict] | None = None) -> list[str]:
    """The sentences above, those that the runs support."""
    first = sparse_vs_dense(a)
    return ([first] if first else []) + noise_lines(predictions) + shared_host(a)
