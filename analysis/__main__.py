"""``lartpc analyze {fit,curves,confusion,report,predict} RUN...`` (also
``python -m lartpc.analysis ...``, which imports no torch); exit code 2 on bad input."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

from lartpc.analysis.metrics import CLOCKS
from lartpc.analysis.runs import RunFolderError

from lartpc.errors import LartpcError
from lartpc.fsutil import output_folder
from lartpc.helpformat import HelpFormatter
from lartpc.pipes import ends_quietly

log = logging.getLogger("lartpc.analysis")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run folders, or folders with run folders (any run.json) below them")
    p.add_argument("--threshold", type=float, default=1.2,
                   help="time-to-loss threshold on the smoothed global loss (default 1.2)")
    p.add_argument("--smooth", type=int, default=None, metavar="STEPS",
                   help="centred rolling-mean window in steps (default min(50, steps//10))")
    p.add_argument("--clock", choices=CLOCKS, default="train",
                   help="what TTL and the epoch rate are measured on: train (default) = "
                   "the steps' own time; wall = the run's own wall time, evaluation and "
                   "checkpoints included")
    p.add_argument("--strict", action="store_true",
                   help="fail on an unusable run folder instead of skipping it with a note")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m lartpc.analysis`` (``lartpc analyze`` adds the same
    commands to its own subcommand, :func:`add_commands`)."""
    parser = argparse.ArgumentParser(
        prog="python -m lartpc.analysis",
        description="Scaling analysis of lartpc run folders (no torch needed).")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_commands(parser)
    return parser


def add_commands(parser: argparse.ArgumentParser) -> None:
    """fit, curves, confusion, report and predict as subcommands of ``parser``."""
    sub = parser.add_subparsers(dest="analysis_command", required=True, metavar="COMMAND")
    p = sub.add_parser("fit", help="per-run DLT, epoch rate, TTL; power-law fits per model",
                       formatter_class=HelpFormatter,
                       description="Per-run metrics and per-model power-law fits, printed; "
                       "their figures (loss, epoch rate, speedup and efficiency, TTL vs N) "
                       "written to --out.")
    _common(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _figures_option(p)
    for name, text in (("curves", "loss vs time (TTL inset), epoch rate, speedup and "
                        "efficiency, and TTL vs N, per model"),
                       ("confusion", "confusion matrices as PNG, CSV and Markdown"),
                       ("report", "one self-contained HTML report with the paper's numbers")):
        p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        _common(p)
        p.add_argument("--out", type=Path, required=True, help="output folder")
    _predict_parser(sub)


def _predict_parser(sub) -> None:
    p = sub.add_parser("predict", formatter_class=HelpFormatter,
                       help="TTL and epoch rate to many GPUs from the noise scale "
                       "and a cluster profile (analysis/predict.py)")
    _common(p)
    p.add_argument("--cluster", help="profile in analysis/clusters.json: summitdev, summit, "
                   "perlmutter, h100-ndr, local-cpu")
    p.add_argument("--cluster-file", type=Path, metavar="FILE",
                   help="cluster profile JSON instead of --cluster: one entry of "
                   "analysis/clusters.json's form, e.g. from `lartpc bench allreduce --out`")
    p.add_argument("--gpus", default=",".join(str(2**k) for k in range(11)),
                   help="comma-separated GPU counts (default 1,2,4,...,1024)")
    p.add_argument("--alpha-us", type=float, help="allreduce latency per step, microseconds")
    p.add_argument("--beta-gbps", type=float, help="link bandwidth, gigaBYTES per second")
    p.add_argument("--compute-ms", type=float, help="compute + data time per step, ms")
    p.add_argument("--allreduce", default="ring", choices=("ring", "tree"),
                   help="allreduce algorithm of the communication model")
    p.add_argument("--train-events", type=int, help="training events (default: the runs')")
    p.add_argument("--base-gpus", type=int, help="predict from the runs at this GPU count "
                   "(default: the smallest with a noise.csv)")
    p.add_argument("--span", type=int, default=20, help="EMA span of the loss and noise curves, "
                   "in noise.csv rows (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _figures_option(p)


def _figures_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="folder for the figures (default: 'report' "
                   "beside the first RUN folder, e.g. runs/ -> report/)")
    p.add_argument("--no-figures", action="store_true", help="print only, write nothing")


def _figures_dir(args: argparse.Namespace) -> Path | None:
    """Where fit/predict draw: --out, else 'report' beside the first RUN (None: none)."""
    if args.no_figures:
        return None
    return args.out or Path(args.runs[0]).resolve().parent / "report"


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be an output folder (None when it can): it is a file, it
    would be made below a file, or its folder may not be written."""
    if folder.exists():
        if not folder.is_dir():
            return "exists and is not a folder"
        where = folder
    else:
        where = folder.parent
        while not where.exists():  # ends at the root at the latest
            where = where.parent
        if not where.is_dir():
            return f"cannot be made: {where} is not a folder"
    if not os.access(where, os.W_OK | os.X_OK):  # a read-only mount says no here too
        return f"cannot write (no permission in {where}, or read-only)"
    return None


def check_options(args: argparse.Namespace) -> None:
    """Refuse bad numbers and an unusable ``--out`` before any run is read, naming the
    option; a default figures folder ('report' beside the first RUN) that cannot be
    written is left out with a warning instead (the numbers are still printed).

    ``--threshold 0`` is allowed: no loss gets below it, so every TTL is censored (what
    the epoch rate alone needs); ``predict`` needs a loss the noise was measured at.
    """
    if not (math.isfinite(args.threshold) and args.threshold >= 0):  # 0: none reaches it
        raise RunFolderError(f"--threshold must be a loss, a finite number >= 0, got "
                             f"{args.threshold}")
    if args.smooth is not None and args.smooth < 1:
        raise RunFolderError(f"--smooth must be at least 1 step, got {args.smooth}")
    if args.analysis_command == "predict":
        from lartpc.analysis.predict import check_options as check_predict

        check_predict(args)
    if getattr(args, "out", None) is not None:  # the user's own link followed here only
        args.out = output_folder(args.out)
        if problem := _unwritable(args.out):
            raise RunFolderError(f"--out {args.out}: {problem}")
        if args.analysis_command == "report":
            from lartpc.analysis.report import check_report_target

            check_report_target(args.out)
    elif (out := _figures_dir(args)) is not None and (problem := _unwritable(out)):
        log.warning("figures not written: %s %s (the default --out; give --out FOLDER or "
                    "--no-figures)", out, problem)
        args.no_figures = True


def _predict(args: argparse.Namespace) -> int:
    from lartpc.analysis.predict import run_predict
    from lartpc.analysis.predict_report import to_text, write_figure
    from lartpc.analysis.runs import load_runs

    skipped: list[str] | None = None if args.strict else []
    runs = load_runs(args.runs, skipped)  # as fit does: one dead job does not stop it
    for s in skipped or []:
        print(f"skipped: {s}", file=sys.stderr)
    results, measured = run_predict(runs, args)
    out = _figures_dir(args)
    fig = write_figure(results, measured, out) if out else None
    if args.json:
        meas = [{"model": m, "gpus": n, **v} for (m, n), v in sorted(measured.items())]
        from lartpc.analysis.tables import json_safe

        # NaN (a quantity that could not be predicted) is null: bare NaN is not JSON
        print(json.dumps(json_safe({"models": results, "measured_runs": meas,
                                    **({"figure": str(fig)} if fig else {}),
                                    **(results[0] if len(results) == 1 else {})}),
                         indent=2, allow_nan=False))
    else:
        print(to_text(results, measured), end="")
        if fig:
            print(f"figure: {fig}")
    return 0


def execute(args: argparse.Namespace) -> int:
    """Run one parsed command; an output folder that cannot be written is a
    :class:`RunFolderError` too (one line, exit 2)."""
    try:
        return run(args)
    except OSError as e:  # an output folder that cannot be written (read-only, full)
        where = f"{e.filename}: " if e.filename else ""
        raise RunFolderError(f"{where}cannot write ({e.strerror or e})") from None


def run(args: argparse.Namespace) -> int:
    """Execute one parsed command."""
    explicit_out = getattr(args, "out", None) is not None
    check_options(args)
    if args.analysis_command == "predict":
        return _predict(args)
    from lartpc.analysis.tables import analyse, to_json, to_text

    a = analyse(args.runs, args.threshold, args.smooth, args.strict, args.clock)
    if args.analysis_command == "fit":
        from lartpc.analysis.report import write_curves

        out, figs = _figures_dir(args), []
        try:
            figs = [str(p) for ps in write_curves(a, out).values() for p in ps] if out else []
        except OSError as e:  # the numbers still print; the figures say why they are missing
            if explicit_out:  # the user asked for them there: a failure, not a note
                raise
            log.warning("figures not written to %s: %s", out, e)
        if args.json:
            print(json.dumps({**to_json(a), "figures": figs}, indent=2, allow_nan=False))
        else:
            print(to_text(a), end="")
            print("".join(f"figure: {f}\n" for f in figs), end="")
    elif args.analysis_command == "curves":
        from lartpc.analysis.report import write_curves

        for paths in write_curves(a, args.out).values():
            for p in paths:
                print(p)
    elif args.analysis_command == "confusion":
        from lartpc.analysis.confusion import unique_names, write_run_confusion

        labels = unique_names(a.runs)  # two runs named alike must not share files
        made = [c for r in a.runs
                if (c := write_run_confusion(r, args.out, labels[Path(r.path)]))]
        if not made:
            raise RunFolderError("no run has a confusion.csv: nothing to write")
        for c in made:
            print(c["markdown"])
    elif args.analysis_command == "report":
        from lartpc.analysis.report import write_report

        print(write_report(a, args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m lartpc.analysis``'s exit status (141, quietly, where stdout's reader
    has gone: :func:`lartpc.pipes.ends_quietly`)."""
    return ends_quietly(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    log.propagate = False
    try:
        return execute(args)
    except LartpcError as e:  # RunFolderError, or a link refused under --out
        print(f"analysis {args.analysis_command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
