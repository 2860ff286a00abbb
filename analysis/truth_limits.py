"""Truth limits beside a confusion matrix.

A run folder may hold ``truth_limits.json``: the output of
``lartpc inspect DATA --truth-limits --json > RUN/truth_limits.json`` for the data the
run was evaluated on. It gives, per class, the share of events no image can classify
(pions and kaons leaving as clean MIP stubs, events with little visible energy), so a
measured confusion matrix can be read against the best any network could do.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)
FILE = "truth_limits.json"


def load_truth_limits(run_dir: str | Path) -> dict | None:
    """The truth limits stored in ``run_dir``, or None (missing or unreadable: warned)."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        lim = data.get("truth_limits", data)
        lim["classes"].items()  # noqa: B018 - shape check
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        log.warning("%s: not a truth-limits file (%s), ignored", path, e)
        return None
    return lim


def truth_limits_html(run_dirs: Iterable[str | Path]) -> str:
    """An HTML table of the first truth limits found in ``run_dirs`` ('' if none)."""
    for d in run_dirs:
        lim = load_truth_limits(d)
        if lim is None:
            continue
        rows = "".join(
            f"<tr><td class='l'>{html.escape(name)}</td><td>{c.get('events', 0)}</td>"
            f"<td>{100 * c.get('exit_without_interaction', 0):.1f}</td>"
            f"<td>{100 * c.get('low_visible_energy', 0):.1f}</td>"
            f"<td>{100 * c.get('indistinguishable', 0):.1f}</td></tr>"
            for name, c in lim["classes"].items())
        ceiling = lim.get("muon_purity_ceiling")
        tail = (f"<p>Muon purity ceiling (exiting π/K stubs called muon): "
                f"{100 * ceiling:.1f} %</p>" if ceiling is not None else "")
        return (f"<h4>Truth limits of the evaluation data (source geometry "
                f"{html.escape(str(lim.get('source_geometry', '?')))}, from "
                f"{html.escape(str(Path(d) / FILE))})</h4><table><tr><th class='l'>class"
                "</th><th>events</th><th>exit, no interaction %</th><th>low visible "
                "energy %</th><th>indistinguishable %</th></tr>" + rows + "</table>" + tail)
    return ""
