"""Truth limits beside a confusion matrix.

A run folder may hold ``truth_limits.json``: the output of
``lartpc inspect DATA --truth-limits --json > RUN/truth_limits.json`` for the data the
run was evaluated on. It gives, per class, the share of events a fixed rule on truth
counts as lost (pions and kaons leaving as clean MIP stubs, called muon; events with
little visible energy) and that reference rule's recall per class and class-balanced
overall (:mod:`lartpc.sim.limits`): a reference to read a confusion matrix beside, not
a bound on it (a network can beat it). Files written before issue 39 call these
``accuracy_ceiling``, ``overall_accuracy_ceiling`` and ``muon_purity_ceiling``, and
files older still have none (derived as ``1 - indistinguishable``); both are read.
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
        key, acc = _field(lim["classes"][name], "reference_rule_recall")
        c["reference_rule_recall"] = (1.0 - c["indistinguishable"] if acc is None
                                      else _number(acc, f"classes.{name}.{key}"))
    purity_key, purity = _field(lim, "reference_rule_muon_purity")
    overall_key, overall = _field(lim, "reference_rule_overall")
    present = [c["reference_rule_recall"] for c in classes.values() if c["events"]]
    if overall is None and present:
        overall = sum(present) / len(present)
    return {"classes": classes, "source_geometry": str(lim.get("source_geometry", "?")),
            "reference_rule_muon_purity": None if purity is None
            else _number(purity, purity_key),
            "reference_rule_overall": None if overall is None
            else _number(overall, overall_key)}


#: Compatibility reader: the names these fields had before issue 39 (they are the
#: recall of a reference rule, not a ceiling).
OLD_NAMES = {"reference_rule_recall": "accuracy_ceiling",
             "reference_rule_overall": "overall_accuracy_ceiling",
             "reference_rule_muon_purity": "muon_purity_ceiling"}


def recall(class_limits: dict) -> float | None:
    """The reference rule's recall of one class's truth limits (the ``classes`` entry
    of a results JSON), new name or old."""
    return _field(class_limits, "reference_rule_recall")[1]


def _field(obj: dict, key: str) -> tuple[str, object]:
    """(the name found, its value) of ``key`` in ``obj``, or of its old name."""
    if obj.get(key) is None and obj.get(OLD_NAMES[key]) is not None:
        return OLD_NAMES[key], obj[OLD_NAMES[key]]
    return key, obj.get(key)


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
            + f"<td>{100 * c['reference_rule_recall']:.1f}</td></tr>"
            for name, c in lim["classes"].items())
        purity = lim.get("reference_rule_muon_purity")
        overall = lim.get("reference_rule_overall")
        tail = (f"<p>Reference rule, overall (class-balanced mean of its recall per class; "
                f"a reference, not a bound): {100 * overall:.1f} %</p>"
                if overall is not None else "")
        tail += (f"<p>Reference rule's muon purity (exiting π/K stubs called muon): "
                 f"{100 * purity:.1f} %</p>" if purity is not None else "")
        return (f"<h4>Truth limits of the evaluation data (source geometry "
                f"{html.escape(lim['source_geometry'])}, from "
                f"{html.escape(str(Path(d) / FILE))})</h4><table><tr><th class='l'>class"
                "</th><th>events</th><th>exit, no interaction %</th><th>low visible "
                "energy %</th><th>indistinguishable %</th><th>reference rule recall %</th></tr>"
                + rows + "</table>" + tail)
    return ""
