"""Truth limits beside a confusion matrix.

A run folder may hold ``truth_limits.json``: the output of
``lartpc inspect DATA --truth-limits --json > RUN/truth_limits.json`` for the data the
run was evaluated on. It gives, per class, the share of events no image can classify
(pions and kaons leaving as clean MIP stubs, events with little visible energy) and the
accuracy ceiling that leaves (the best a perfect classifier reaches per class, and the
class-balanced overall), so a measured confusion matrix can be read against the best
any network could do. Files written before the ceilings existed get them derived as
``1 - indistinguishable``.
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections.abc import Iterable
from pathlib import Path

from lartpc.fsutil import UnsafePathError, read_nofollow

log = logging.getLogger(__name__)
FILE = "truth_limits.json"


FRACTIONS = ("exit_without_interaction", "low_visible_energy", "indistinguishable")


def _number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{what} = {v!r}: expected a finite number")
    return float(v)


def _checked(data) -> dict:
    """Only the fields the report shows, each of the right type (ValueError if not)."""
    lim = data.get("truth_limits", data) if isinstance(data, dict) else None
    if not isinstance(lim, dict) or not isinstance(lim.get("classes"), dict):
        raise ValueError("no 'classes' object")
    classes = {}
    for name, c in lim["classes"].items():
        if not isinstance(c, dict):
            raise ValueError(f"classes.{name}: expected an object")
        classes[str(name)] = {"events": int(_number(c.get("events", 0), f"classes.{name}.events")),
                              **{k: _number(c.get(k, 0), f"classes.{name}.{k}")
                                 for k in FRACTIONS}}
    for name, c in classes.items():
        acc = lim["classes"][name].get("accuracy_ceiling")
        c["accuracy_ceiling"] = (1.0 - c["indistinguishable"] if acc is None
                                 else _number(acc, f"classes.{name}.accuracy_ceiling"))
    ceiling = lim.get("muon_purity_ceiling")
    overall = lim.get("overall_accuracy_ceiling")
    present = [c["accuracy_ceiling"] for c in classes.values() if c["events"]]
    if overall is None and present:
        overall = sum(present) / len(present)
    return {"classes": classes, "source_geometry": str(lim.get("source_geometry", "?")),
            "muon_purity_ceiling": None if ceiling is None
            else _number(ceiling, "muon_purity_ceiling"),
            "overall_accuracy_ceiling": None if overall is None
            else _number(overall, "overall_accuracy_ceiling")}


def load_truth_limits(run_dir: str | Path) -> dict | None:
    """The truth limits stored in ``run_dir``, or None (missing, unreadable or of the
    wrong shape: warned and ignored)."""
    path = Path(run_dir) / FILE
    try:
        return _checked(json.loads(read_nofollow(path).decode("utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, UnsafePathError) as e:
        log.warning("%s: not a truth-limits file (%s), ignored", path, e)
        return None


def truth_limits_html(run_dirs: Iterable[str | Path]) -> str:
    """An HTML table of the first truth limits found in ``run_dirs`` ('' if none)."""
    for d in run_dirs:
        lim = load_truth_limits(d)
        if lim is None:
            continue
        rows = "".join(
            f"<tr><td class='l'>{html.escape(name)}</td><td>{c['events']}</td>"
            + "".join(f"<td>{100 * c[k]:.1f}</td>" for k in FRACTIONS)
            + f"<td>{100 * c['accuracy_ceiling']:.1f}</td></tr>"
            for name, c in lim["classes"].items())
        ceiling = lim.get("muon_purity_ceiling")
        overall = lim.get("overall_accuracy_ceiling")
        tail = (f"<p>Overall accuracy ceiling (class-balanced mean of the per-class "
                f"ceilings): {100 * overall:.1f} %</p>" if overall is not None else "")
        tail += (f"<p>Muon purity ceiling (exiting π/K stubs called muon): "
                 f"{100 * ceiling:.1f} %</p>" if ceiling is not None else "")
        return (f"<h4>Truth limits of the evaluation data (source geometry "
                f"{html.escape(lim['source_geometry'])}, from "
                f"{html.escape(str(Path(d) / FILE))})</h4><table><tr><th class='l'>class"
                "</th><th>events</th><th>exit, no interaction %</th><th>low visible "
                "energy %</th><th>indistinguishable %</th><th>accuracy ceiling %</th></tr>"
                + rows + "</table>" + tail)
    return ""
