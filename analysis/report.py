"""Curves for every model, and one self-contained HTML report (PNGs embedded as base64)
with our numbers beside the paper's."""

from __future__ import annotations

import base64
import contextlib
import html
import logging
import math
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

import numpy as np
from lartpc.analysis import plots, scaling_plots
from lartpc.analysis.confusion import unique_names, write_run_confusion
from lartpc.analysis.fit import PowerLawFit, ttl_mean_text
from lartpc.analysis.metrics import RunMetrics
from lartpc.analysis.paper import PAPER, SOURCE, TTL_THRESHOLD
from lartpc.analysis.runcheck import safe_name
from lartpc.analysis.runs import CLASSES, RunFolderError
from lartpc.analysis.tables import (
    DEFINITIONS,
    Analysis,
    count_unit,
    counted,
    gpus_text,
    scaling_head,
    to_text,
)
from lartpc.analysis.truth_limits import truth_limits_html

from lartpc.fsutil import atomic_write, read_nofollow, subfolder

log = logging.getLogger(__name__)
CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:0.6em 0}td,th{border:1px solid #bbb;padding:3px 7px;
text-align:right}th{background:#eee}td.l,th.l{text-align:left}.warn{color:#b00;font-weight:bold}
img{max-width:100%;border:1px solid #ddd}.pair{display:flex;gap:1.5em;align-items:flex-start}
pre{background:#f6f6f6;padding:0.6em;overflow-x:auto;font-size:12px}"""


def write_curves(a: Analysis, out: Path) -> dict[str, list[Path]]:
    """Per model: ``loss_<model>.png`` (with TTL inset), ``epoch_rate_<model>.png``,
    ``speedup_<model>.png`` (speedup and efficiency) and ``ttl_<model>.png``.

    The model name comes from run.json, so it goes through :func:`safe_name`: a file
    name, never a path.
    """
    made: dict[str, list[Path]] = {}
    for model, s in a.models.items():
        pairs = [(r, m) for r, m in zip(a.runs, a.rows, strict=True) if r.model == model]
        runs, rows = [p[0] for p in pairs], [p[1] for p in pairs]
        unit = count_unit(r.meta.get("device") for r in runs)
        # the fit without the censored runs: drawn only where the censored fit replaced it
        dropped = (PowerLawFit(**s["ttl_fit_uncensored_only"])
                   if s["ttl_fit_method"] == "censored" else None)
        made[model] = [
            plots.loss_curves(runs, rows, PowerLawFit(**s["ttl_fit"]), model, a.threshold,
                              out / safe_name(f"loss_{model}.png"), unit),
            plots.epoch_rate(rows, PowerLawFit(**s["epoch_rate_fit"]), model,
                             out / safe_name(f"epoch_rate_{model}.png"), unit),
            scaling_plots.speedup_efficiency(s["scaling"], model,
                                             out / safe_name(f"speedup_{model}.png"), unit,
                                             baseline_gpus=s["baseline_gpus"]),
            scaling_plots.ttl_vs_n(rows, PowerLawFit(**s["ttl_fit"]), dropped, model,
                                   a.threshold, out / safe_name(f"ttl_{model}.png"), unit),
        ]
    return made


def _img(path: Path | str, alt: str) -> str:
    data = base64.b64encode(read_nofollow(path)).decode("ascii")  # a PNG swapped for a link
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _num(v: float | None, fmt: str = "{:.3g}") -> str:
    return "–" if v is None or not np.isfinite(v) else fmt.format(v)


def _exp(v: float | None, err: float | None, ci, method: str | None = None) -> str:
    if v is None:
        return "no fit"
    s = f"{v:+.2f}" + (f" ± {err:.2f}" if err is not None else "")
    how = f", {method}" if method else ""
    return s + (f" (95% CI{how} {ci[0]:+.2f} … {ci[1]:+.2f})" if ci else "")


def _accuracy_at(rows: list[RunMetrics], n: int) -> str:
    """The validation accuracy of the runs (``rows``, their metrics) at ``n`` GPUs: one
    run's with its binomial SE and 95 % Wilson interval (the SE is 0 at 0 or 100 %, the
    interval is not); several runs' mean with the standard error of that mean from
    their spread (seeds and evaluation sampling together), never less than their
    evaluations' binomial SE of the mean: two or three runs' spread, with one or two
    degrees of freedom, is now and then near 0 by chance."""
    done = [r for r in rows if r.accuracy is not None]
    accs = [100 * r.accuracy for r in done]
    ses = [100 * r.accuracy_se for r in done]
    if not accs:
        return "–"
    gpus = gpus_text(n, count_unit(r.setting.get("device") for r in rows))
    if len(accs) == 1:
        lo, hi = (100 * v for v in done[0].accuracy_wilson95)
        return (f"{accs[0]:.1f} % ± {ses[0]:.1f} % (binomial SE, n = {done[0].n_eval} "
                f"events; 95 % Wilson interval {lo:.1f}–{hi:.1f} %; the run at {gpus})")
    spread = float(np.std(accs, ddof=1)) / math.sqrt(len(accs))
    sampling = math.sqrt(sum(v * v for v in ses)) / len(ses)
    sem = max(spread, sampling)
    return (f"{np.mean(accs):.1f} % ± {sem:.1f} % (mean of {len(accs)} runs at {gpus} ± "
            "its SE, " + ("from their spread" if spread >= sampling else
                          f"their evaluations' binomial SE of the mean (their spread "
                          f"gives {spread:.1f} %)")
            + f"; binomial SE of one run {np.mean(ses):.1f} %)")


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>'
                 for i, h in enumerate(head))
    # every cell is text (some of it read from run folders): escaped, never markup
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">'
                                    f"{html.escape(str(c))}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _matrix_table(pct: np.ndarray, counts: np.ndarray | None = None) -> str:
    rows = []
    for i, cls in enumerate(CLASSES):
        cells = [f"{pct[i, j]:.1f}%" + (f" ({counts[i, j]})" if counts is not None else "")
                 for j in range(len(CLASSES))]
        rows.append([cls, *cells])
    return _table(["true \\ predicted", *CLASSES], rows)


def _model_section(a: Analysis, model: str, s: dict, figs: list[Path]) -> str:
    p = PAPER.get(model, {})
    rows = [r for r in a.rows if r.model == model]
    nmax = max(s["gpu_counts"])
    at_max = [r for r in rows if r.world_size == nmax]
    rate = np.mean([r.epoch_rate_per_min for r in at_max if r.epoch_rate_per_min] or [np.nan])
    ips = np.mean([r.images_per_s_per_gpu for r in at_max if r.images_per_s_per_gpu]
                  or [np.nan])
    acc = _accuracy_at(at_max, nmax)
    unit = count_unit(r.setting.get("device") for r in rows)
    mine = "" if unit == "GPU" else " (the paper's: GPUs)"
    prate = ", ".join(f"{v} at {k} GPUs" for k, v in p.get("epoch_rate_per_min", {}).items())
    comp = _table(["quantity", "this study", "paper"], [
        [f"{unit} counts{mine}", str(s["gpu_counts"]), str(p.get("gpu_counts", "–"))],
        [f"TTL({a.threshold:g}) exponent b", _exp(s["ttl_exponent"], s["ttl_exponent_err"],
                                                  s["ttl_exponent_ci95"],
                                                  s.get("ttl_ci_method")),
         _num(p.get("ttl_exponent"), "{:+.1f}") + (f" (threshold {TTL_THRESHOLD})" if p
                                                   else "")],
        *([["TTL exponent, censored runs dropped",
             _exp(s["ttl_fit_uncensored_only"]["exponent"],
                  s["ttl_fit_uncensored_only"]["exponent_err"],
                  s["ttl_fit_uncensored_only"]["exponent_ci95"],
                  s["ttl_fit_uncensored_only"].get("ci_method")), "–"]]
          if s.get("ttl_fit_method") == "censored" else []),
        ["epoch-rate exponent b", _exp(s["epoch_rate_exponent"],
                                       s["epoch_rate_exponent_err"],
                                       s["epoch_rate_exponent_ci95"],
                                       s.get("epoch_rate_ci_method")),
         _num(p.get("epoch_rate_exponent"), "{:+.1f}")],
        ["epochs/min", f"{_num(rate)} at {gpus_text(nmax, unit)}", prate or "–"],
        [f"images/s per {unit}{mine}", f"{_num(ips)} at {gpus_text(nmax, unit)}",
         _num(p.get("images_per_s_per_gpu"))],
        ["validation accuracy", acc,
         f"{100 * p['accuracy']:.1f} % ± {100 * p['accuracy_err']:.1f} % "
         f"({p['accuracy_gpus']} GPUs)" if p else "–"],
        ["censored runs (TTL)", f"{s['n_censored']} of {s['n_runs']}", "–"],
    ])
    scal = _table(["N", "runs", "epochs/min", "speedup", "efficiency", "Karp–Flatt e",
                   "DLT s", "TTL s", "TTL speedup", "censored"],
                  [[str(r["gpus"]), str(r["n_runs"]), _num(r["epoch_rate_mean"], "{:.4g}"),
                    _num(r["speedup"], "{:.2f}"), _num(r["efficiency"], "{:.2f}"),
                    _num(r["karp_flatt"], "{:.3f}"), _num(r["dlt_mean_s"], "{:.1f}"),
                    ttl_mean_text(r, none="–"), _num(r["ttl_speedup"], "{:.2f}"),
                    str(r["n_ttl_censored"])] for r in s["scaling"]])
    head = scaling_head(s, unit)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in s["notes"])
    warns = "".join(f'<li class="warn">{html.escape(w)}</li>' for w in s["warnings"])
    return (f"<h2>{html.escape(p.get('label', model))}</h2>{comp}"
            f"<ul>{warns}{notes}</ul>"
            f'<div>{_img(figs[0], f"{model} loss vs wall time")}</div>'
            f'<div>{_img(figs[1], f"{model} epoch rate vs {unit}s")}</div>'
            f"<h3>{html.escape(head[:1].upper() + head[1:])}</h3>"
            "<p>Speedup, efficiency and Karp–Flatt from the mean epoch rate per N; TTL "
            "speedup relative to the smallest N whose runs all reached the threshold. "
            "Where some run at an N did not reach it, its mean TTL is a lower bound "
            "(“&gt; ”: that run at its bound) and has no speedup.</p>"
            f"{scal}"
            f'<div>{_img(figs[2], f"{model} speedup and efficiency vs {unit}s")}</div>'
            f'<div>{_img(figs[3], f"{model} time to loss vs {unit}s")}</div>')


def _confusion_section(a: Analysis, folder: Path) -> str:
    parts = ["<h2>Confusion matrices (rows true, row-normalised)</h2>",
             "<p>Accuracy = trace / total of each matrix; ± is the binomial standard error "
             "sqrt(p(1−p)/n), brackets the 95 % Wilson interval. For each model the run "
             "with the most GPUs is shown beside the paper's (128 GPUs, 4 h); the others "
             "are below it.</p>"]
    labels = unique_names(a.runs)  # two runs named alike must not share files
    for model in a.models:
        done = [c for r in a.runs if r.model == model
                if (c := write_run_confusion(r, folder, labels[Path(r.path)]))]
        if not done:
            parts.append(f"<p>{html.escape(model)}: no run has confusion.csv.</p>")
            continue
        done.sort(key=lambda c: -c["gpus"])
        first, rest = done[0], done[1:]
        # the paper's matrix only beside runs on the paper's five classes
        p = PAPER.get(model) if tuple(first["classes"]) == CLASSES else None
        paper = (f"<div><h4>paper ({html.escape(p['label'])})</h4>"
                 f"{_matrix_table(np.array(p['confusion_percent']))}<p>accuracy "
                 f"{100 * p['accuracy']:.1f} % ± {100 * p['accuracy_err']:.1f} %</p></div>"
                 if p else "")
        lo, hi = first["wilson95"]
        parts.append(f'<h3>{html.escape(model)}</h3><div class="pair"><div>'
                     f"{_img(first['png'], first['title'])}<p>accuracy "
                     f"{100 * first['accuracy']:.1f} % ± {100 * first['binomial_se']:.1f} % "
                     f"[{100 * lo:.1f}, {100 * hi:.1f}] (n = {first['n_events']})</p></div>"
                     f"{paper}</div>")
        parts.append(truth_limits_html(r.path for r in a.runs if r.model == model))
        if rest:
            parts.append(f"<details><summary>{len(rest)} more {html.escape(model)} "
                         "run(s)</summary>" + "".join(_img(c["png"], c["title"])
                                                      for c in rest) + "</details>")
    return "".join(parts)


#: How every report.html this tool writes begins (unchanged since the first one): an
#: existing report.html that does not is the user's own page, never replaced.
REPORT_HTML = "report.html"
REPORT_HEAD = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>lartpc analysis</title>"
#: The list of files the report wrote into ``--out`` (one relative name a line): the next
#: report into that folder removes those of them it does not write again, nothing else.
REPORT_FILES = ".report-files"
_OWN_FILE = re.compile(r"(confusion/)?[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,199}")


def check_report_target(out: Path) -> None:
    """Refuse to write into ``out`` when its ``report.html`` is a file this tool did not
    write (a link there is replaced, never followed: :func:`atomic_write`).

    Raises
    ------
    RunFolderError
        Naming the file.
    """
    path = out / REPORT_HTML
    if path.is_symlink() or not path.exists():
        return
    try:
        with open(path, "rb") as f:
            head = f.read(len(REPORT_HEAD))
    except OSError as e:
        raise RunFolderError(f"--out {out}: cannot read its {REPORT_HTML} "
                             f"({e.strerror or e})") from None
    if head != REPORT_HEAD.encode():
        raise RunFolderError(f"--out {out}: {path} is not a report lartpc wrote; refusing "
                             "to replace it (move it away or choose another --out)")


def write_report(a: Analysis, out: Path) -> Path:
    """Write ``out/report.html`` (self-contained) plus the PNGs it embeds. Everything is
    made in a folder inside ``out`` first and moved into place at the end, the report
    last: a report that fails or is interrupted halfway (a run's file that cannot be
    read under ``--strict``, Ctrl-C) leaves ``out`` as it was, and no folder it made."""
    check_report_target(out)
    made = [q for q in (out / "confusion", out, *out.parents) if not q.exists()]
    out.mkdir(parents=True, exist_ok=True)
    # before anything is written: a confusion/ planted as a link is refused, not followed
    subfolder(out, "confusion", "the confusion folder")
    stage = Path(tempfile.mkdtemp(prefix=".report-partial-", dir=out))
    try:
        atomic_write(stage / REPORT_HTML, _report(a, stage))
        wrote = [f"confusion/{n}" for n in sorted(os.listdir(stage / "confusion"))]
        wrote += sorted((n for n in os.listdir(stage) if n != "confusion"),
                        key=lambda n: n == REPORT_HTML)
        earlier = _earlier_files(out)
        for name in wrote:
            os.replace(stage / name, out / name)
    except BaseException:  # an error or Ctrl-C before the report: no folder of ours left
        shutil.rmtree(stage, ignore_errors=True)
        for q in made:  # those this call made, innermost first, where still empty
            with contextlib.suppress(OSError):
                q.rmdir()
        raise
    shutil.rmtree(stage, ignore_errors=True)
    atomic_write(out / REPORT_FILES, "".join(f"{n}\n" for n in wrote))
    _remove_stale(out, earlier - set(wrote))
    path = out / REPORT_HTML
    log.info("wrote %s", path)
    return path


def _earlier_files(out: Path) -> set[str]:
    """The files the report last written into ``out`` listed in its :data:`REPORT_FILES`
    (none when there is no such list, or it is not a file lartpc could have written)."""
    try:
        text = read_nofollow(out / REPORT_FILES).decode("utf-8")
    except (OSError, UnicodeDecodeError):  # no list (a first report), or not ours
        return set()
    return {n for n in text.splitlines() if _OWN_FILE.fullmatch(n)}


def _remove_stale(out: Path, names: set[str]) -> None:
    """Remove the files an earlier report wrote into ``out`` that this one did not (the
    confusion files of runs it no longer holds, a model's curves): its page no longer
    shows them. Only regular files by those names; a link or folder is left alone."""
    for name in sorted(names):
        path = out / name
        with contextlib.suppress(OSError):
            if stat.S_ISREG(path.lstat().st_mode):
                path.unlink()
                log.info("removed %s (an earlier report's, not in this one)", path)


def _report(a: Analysis, out: Path) -> str:
    """The report's page, its figures written into ``out`` (and ``out/confusion``)."""
    confusion = subfolder(out, "confusion", "the confusion folder")
    figs = write_curves(a, out)
    defs = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                   for k, v in DEFINITIONS.items())
    body = [f"<h1>LArTPC scaling study: {counted(len(a.runs), 'run')}</h1>",
            f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S')}. TTL threshold "
            f"{a.threshold:g}; smoothing {a.smooth or 'auto'} steps. Paper: "
            f"{html.escape(SOURCE)}.</p>"]
    cpu = sorted(r.name for r in a.runs if str(r.meta.get("device", "")).startswith("cpu"))
    if cpu:
        body.append(f'<p class="warn">{len(cpu)} of the {counted(len(a.runs), "run")} '
                    "trained on CPU ranks: their figures count ranks, and where this "
                    "report's tables say GPUs, read ranks (one rank stands for one GPU of "
                    "the study, one core each at best).</p>")
    if a.notes:
        body.append('<h2>Notes on the input</h2><ul>' + "".join(
            f'<li class="warn">{html.escape(n)}</li>' for n in a.notes) + "</ul>")
    from lartpc.analysis.glance import at_a_glance
    from lartpc.analysis.predict_report import noise_section  # '' when no run measured the noise

    noise_html, predictions = noise_section(a.runs, a.threshold, a.smooth, out, _img,
                                            a.strict)
    glance = at_a_glance(a, predictions)
    if glance:
        body.append("<h2>What these runs show</h2><ul>" + "".join(
            f"<li>{html.escape(t)}</li>" for t in glance) + "</ul>")
    body += [_model_section(a, m, s, figs[m]) for m, s in a.models.items()]
    body.append(noise_html)
    body.append(_confusion_section(a, confusion))
    for model, p in PAPER.items():
        if model not in a.models:
            body.append(f"<h3>Paper only: {html.escape(p['label'])}</h3><p>exponents: "
                        f"TTL {p['ttl_exponent']:+.1f}, epoch rate "
                        f"{p['epoch_rate_exponent']:+.1f}; accuracy "
                        f"{100 * p['accuracy']:.1f} %</p>"
                        + _matrix_table(np.array(p["confusion_percent"])))
    body += ["<h2>All runs</h2><pre>" + html.escape(to_text(a)) + "</pre>",
             f"<h2>Definitions</h2><ul>{defs}</ul>"]
    return f"{REPORT_HEAD}<style>{CSS}</style></head><body>{''.join(body)}</body></html>"

