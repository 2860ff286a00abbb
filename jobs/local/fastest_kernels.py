"""The fastest accurate launch of JishNet's fused kernels, from ``stem_check``'s results.

    python -m lartpc.jobs.local.fastest_kernels OUT/stem-check/stem-check.json \\
        OUT/stage2-check/stage2-check.json > OUT/fastest-kernels.json

Reads what ``jobs/local/stem_check.py`` measured on a GPU (the stem's file, the second
stage's file, either may be missing: that stage then keeps the model's default) and
prints one JSON object: for each stage the launch whose whole training step was
fastest among those whose accuracy held, and the ``lartpc bench model`` flags that run
it (``flags``, one string), so that the same lease can time the whole network at its
best setting (``jobs/local/gpu_issues.sh``).

Accuracy held means every relative error that check recorded for that way of computing
(the stem's sums: per tap, ``dot``, ``band``, ``patch`` or ``hoist``; the second stage's
``hybrid``, ``igrad``, ``map`` or ``triton`` backward, the first three also with ``:vec``, the
forward's channels padded: output and gradients, against the layers in float64, in float32,
float32 under bf16 autocast and bf16) is at most :data:`TOLERANCE`, or no larger than
the published layers' own error in the same precision and quantity (``stem_check``'s
rows with ``way: library``; files from before those rows hold to TOLERANCE alone).
bf16's own rounding is 4e-3. On an H200 the default stem's errors were up to 1.7e-3 and
the stem's ``dot`` variant's weight gradient under bf16 autocast 2.8e-2 (TF32 products);
the library's own weight gradient under bf16 autocast was 6.5e-2 from float64 on this
project's CPU (oneDNN, 3 events at 3600²; BENCHMARKS.md), so where a GPU's library row
says the same, ``dot`` is no less accurate than the study's own training path and may be
picked. The library stage competes too: where it is faster than every accurate fused
launch, it is the choice.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lartpc.models.kernel_settings import (
    BACKWARDS,
    STEM_SUMS,
    VEC_BACKWARDS,
    parse_stage2_kernel,
    parse_stem_kernel,
)

#: the largest relative error (output, gradients) a way of computing may show
TOLERANCE = 1e-2
ERRORS = ("output_rel", "input_grad_rel", "weight_grad_rel", "bias_grad_rel")


#: how each stage's check names its ways of computing (the first: the value a row
#: without the field means, from before the field existed): every way the options
#: accept, so that a way added there is judged here too
WAYS = {1: ("sums", STEM_SUMS),
        2: ("backward", BACKWARDS + tuple(f"{b}:vec" for b in VEC_BACKWARDS))}


def _label(value) -> str:
    """A way's name in the output: the stem's sums (``per_tap`` for ``taps``) or the
    second stage's backward."""
    return "per_tap" if value == "taps" else value


def _way(row: dict, stage: int):
    """A row's way of computing: the stem's sums, or the second stage's backward with
    ``:vec`` where its forward's channels were padded (which sums in another order)."""
    name, (default, *_) = WAYS[stage]
    if stage == 1 and "sums" not in row and "dot" in row:  # files from before ``sums``
        return "dot" if row["dot"] else "taps"
    way = default if row.get(name) is None else row[name]
    return f"{way}:vec" if stage == 2 and row.get("vec") else way


def kernel_of(row: dict, stage: int) -> str | None:
    """The launch a timing row measured, spelled as ``model.stem_kernel`` or
    ``model.stage2_kernel`` (rows from before stem_check wrote ``kernel`` carry its
    parts); None for the library's row."""
    if row.get("kernel"):
        text = row["kernel"]
    elif not row.get("block"):
        return None
    elif stage == 1:
        text = f"{row['block']}:{row['num_warps']}:{_way(row, 1)}".removesuffix(":taps")
    else:
        text = f"{row['block']}:{row['num_warps']}:{row['block_k']}:{_way(row, 2)}"
    return str((parse_stem_kernel if stage == 1 else parse_stage2_kernel)(text, "kernel"))


def _precision(row: dict) -> tuple[str, bool]:
    return row["dtype"], bool(row.get("autocast_bf16"))


def _accurate(rows: list[dict], stage: int, value) -> dict:
    """Whether every error of way ``value``'s accuracy rows is within its bound, the
    largest error among them (None: no such row, which is not accurate), and whether
    an error past TOLERANCE was let through because the library was as far off."""
    library = {(*_precision(r), k): r[k] for r in rows if r.get("way") == "library"
               for k in ERRORS if k in r}
    errors = [(r[k], max(TOLERANCE, library.get((*_precision(r), k), 0.0)))
              for r in rows if r.get("way") != "library" and _way(r, stage) == value
              for k in ERRORS if k in r]
    worst = max((e for e, _ in errors), default=None)
    return {"within_tolerance": bool(errors) and all(e <= bound for e, bound in errors),
            "largest_relative_error": worst,
            "within_library": any(TOLERANCE < e <= bound for e, bound in errors)}


def pick(check: dict, stage: int) -> dict:
    """The choice for one stage from its ``stem_check`` result ``check`` (``accuracy``
    and ``timings`` rows)."""
    verdict = {v: _accurate(check.get("accuracy", []), stage, v) for v in WAYS[stage][1]}
    # (launch or None for the library, row) of every timed step
    timed = [(kernel_of(r, stage), r) for r in check.get("timings", []) if r.get("step_ms")]
    usable = [(k, r) for k, r in timed
              if k is None or verdict[_way(r, stage)]["within_tolerance"]]
    kernel, best = min(usable, key=lambda kr: kr[1]["step_ms"], default=(None, None))
    return {"stage": stage, "way": "fused" if kernel else "library", "kernel": kernel,
            "step_ms": best and best["step_ms"],
            "images_per_s": best and best.get("images_per_s"),
            "accuracy": {_label(v): held for v, held in verdict.items()},
            "left_out": [k for k, r in timed
                         if k and not verdict[_way(r, stage)]["within_tolerance"]]}


def _options(stem: dict | None, stage2: dict | None) -> list[tuple[str, str]]:
    """The model options (``model.`` keys, values) for the choices. A stage without a
    check (its part failed or did not run) gets none and so the model's default: a
    kernel that broke its check is not run again in the network's timing."""
    out = []
    for name, choice in (("stem", stem), ("stage2", stage2)):
        if choice is None:
            continue
        out.append((name, choice["way"]))
        if choice["way"] == "fused":
            out.append((f"{name}_kernel", choice["kernel"]))
    return out


def flags(stem: dict | None, stage2: dict | None) -> list[str]:
    """``lartpc bench model`` flags for the choices (:func:`_options`)."""
    return [a for key, value in _options(stem, stage2)
            for a in (f"--{key.replace('_', '-')}", value)]


def settings(stem: dict | None, stage2: dict | None) -> list[str]:
    """The same choices as ``--set`` overrides of a training (``lartpc train``,
    ``lartpc bench train``)."""
    return [a for key, value in _options(stem, stage2) for a in ("--set", f"model.{key}={value}")]


def _read(path: Path | None, stage: int) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        check = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"fastest_kernels: {path}: not a stem_check result ({e})") from None
    if not isinstance(check, dict) or not check.get("timings"):
        raise SystemExit(f"fastest_kernels: {path}: no timing rows (`timings`); not a "
                         "stem_check result")
    if check.get("stage", 1) != stage:
        raise SystemExit(f"fastest_kernels: {path}: stem_check of stage {check.get('stage', 1)}"
                         f", expected stage {stage}")
    return check


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stem_check", type=Path, help="stem-check.json (stage 1); may be missing")
    ap.add_argument("stage2_check", type=Path, nargs="?", default=None,
                    help="stage2-check.json (stage 2); may be missing")
    args = ap.parse_args(argv)
    checks = (_read(args.stem_check, 1), _read(args.stage2_check, 2))
    stem, stage2 = (None if c is None else pick(c, s)
                    for s, c in zip((1, 2), checks, strict=True))
    print(json.dumps({"tolerance": TOLERANCE, "stem": stem, "stage2": stage2,
                      "flags": " ".join(flags(stem, stage2)),
                      "train_flags": " ".join(settings(stem, stage2))}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
