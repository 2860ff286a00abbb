"""Cluster profiles for ``analysis predict``: each cluster's links (latency alpha and
bandwidth beta inside a node and between nodes), GPUs per node and where a step's
compute time comes from, read from ``analysis/clusters.json``, a ``--cluster-file`` or
the command line; and the allreduce's modelled cost on them (the prediction's hardware
half, :mod:`lartpc.analysis.predict`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from lartpc.analysis.runs import RunFolderError

from lartpc.fsutil import UnsafePathError, plain_name

CLUSTERS_FILE = Path(__file__).with_name("clusters.json")
#: float32 parameters of the published models (counted by lartpc.models at 3600 x 3600)
PARAMETERS = {"jishnet": 1_335_817, "scnet": 1_703_999}
REFERENCE_PROFILE = "summitdev"  # whose measured throughput FP32-scaled profiles start from


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
