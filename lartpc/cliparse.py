"""Parsing shared by the command lines (torch-free: ``analysis`` uses it too)."""

from __future__ import annotations

import argparse
import math
import re

from lartpc import MAX_SEED
from lartpc.errors import LartpcError
from lartpc.geometry import Geometry


def geometry_of(downsample, option: str = "--downsample") -> Geometry:
    """The readout geometry at ``downsample``; LartpcError naming ``option`` if none."""
    try:
        return Geometry(downsample=int(downsample))
    except ValueError as e:
        raise LartpcError(f"{option}: {e}") from None


def check_positive(value, option: str) -> int:
    """``value`` as a whole number above 0; LartpcError naming ``option`` otherwise."""
    if int(value) <= 0:
        raise LartpcError(f"{option}: must be positive, got {value}")
    return int(value)


def check_non_negative(value, option: str) -> int:
    """``value`` as a whole number 0 or above; LartpcError naming ``option`` otherwise."""
    if int(value) < 0:
        raise LartpcError(f"{option}: must be 0 or more, got {value}")
    return int(value)


def check_positive_finite(value, option: str) -> float:
    """``value`` as a finite number above 0 (a time, a threshold, a rate); LartpcError
    naming ``option`` otherwise (nan and inf included)."""
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise LartpcError(f"{option}: must be a positive finite number, got {value}")
    return number


def check_seed(value, option: str = "--seed") -> int:
    """``value`` as a seed the generators take (0..2**63-1, as ``write_dataset`` and
    ``train.seed``); LartpcError naming ``option`` otherwise."""
    if not 0 <= int(value) <= MAX_SEED:
        raise LartpcError(f"{option}: must be in 0..2**63-1, got {value}")
    return int(value)


def int_list(text: str, option: str, *, minimum: int | None = None, distinct: bool = False,
             error: type[Exception] = LartpcError) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``, or ``error`` naming ``option`` and the text.

    ``minimum``: the smallest value allowed; ``distinct``: refuse a repeated value.
    """
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not re.fullmatch(r"-?\d+", t) for t in items):
        raise error(f"{option} {text!r}: expected comma-separated integers, e.g. 1,2,4")
    values = [int(t) for t in items]
    if minimum is not None and min(values) < minimum:
        raise error(f"{option} {text!r}: every value must be at least {minimum}")
    if distinct and len(set(values)) != len(values):
        raise error(f"{option} {text!r}: repeated value")
    return values


def add_batch_per_rank(parser, *, default: int | str = 7, type=int,
                       help: str = "events per rank per step (train.batch_per_rank; default 7)",
                       old: str = "--batch") -> None:
    """``--batch-per-rank``, the command-line name of ``train.batch_per_rank``; ``old``
    is the spelling the commands recorded in BENCHMARKS.md before 2026-11-26 used, still
    read (hidden from --help) so that those commands run as written."""
    parser.add_argument("--batch-per-rank", dest="batch_per_rank", type=type, default=default,
                        help=help)
    parser.add_argument(old, dest="batch_per_rank", type=type, help=argparse.SUPPRESS)
