"""Parsing shared by the command lines (torch-free: ``analysis`` uses it too)."""

from __future__ import annotations

import re

from lartpc.errors import LartpcError


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
