"""``lartpc bench train``: short real trainings at several rank counts, one JSON object.

Each point is a real ``horovodrun -np N lartpc train`` on the same events (``--backend
torch``: ``torchrun``; ``none``: one plain ``lartpc train`` process, for one-GPU
throughput where Horovod is not built); the numbers come from its run folder (the same
readers the analysis uses). Threads per rank are
the configured default (cores divided by ranks; SCNet on CPU one) unless ``--set
train.threads=K`` says otherwise; each point reports what it used.

Beside the loop's median step every point reports the bare step
(:mod:`lartpc.bench.bare_step`: forward, backward and optimizer on the first point's
batches, no loop) and ``loop_overhead``, loop step / bare step - 1: what the loop
around the step costs (``--bare-steps 0`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from lartpc.cliparse import (
    add_batch_per_rank,
    check_positive,
    check_positive_finite,
    geometry_of,
    int_list,
)
from lartpc.config import Config, choices, load_config
from lartpc.errors import LartpcError

log = logging.getLogger(__name__)

#: fewer measured steps than this and a point's rates are flagged (``few_steps``): a run
#: whose start-up took most of ``--seconds`` (a GPU lease of 2026-11-28 reported 1,879
#: images/s from two steps)
FEW_STEPS = 50

DEVICES = choices("train.device", without=("auto",))

BIN = Path(sys.executable).parent
#: ``lartpc`` through this interpreter: works in a venv and from a bare working tree on
#: PYTHONPATH (an offline GPU host with the GPU bundle), where no ``lartpc`` script exists.
LARTPC = [sys.executable, "-m", "lartpc"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=choices("model.name"), required=True)
    parser.add_argument("--ranks", default="1,2", help="comma-separated rank counts")
    parser.add_argument("--data", type=Path, help="event folder (default: simulate one)")
    parser.add_argument("--events", type=int, default=210, help="events to simulate")
    parser.add_argument("--downsample", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0, help="time limit per training")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    add_batch_per_rank(parser)
    parser.add_argument("--config", default=None,
                        help="training preset or TOML file (default tiny-MODEL)")
    parser.add_argument("--loader", default="auto",
                        choices=choices("data.loader"),
                        help="batch path (data.loader); auto = the preset's")
    parser.add_argument("--backend", choices=choices("dist.backend", without=("auto",)),
                        default="horovod",
                        help="launcher of each point (none: one plain process, --ranks 1)")
    parser.add_argument("--compare-torch", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the largest rank count under torchrun "
                             "(with --backend horovod)")
    parser.add_argument("--bare-steps", type=int, default=30,
                        help="timed bare steps beside the loop (after 5 untimed; 0: none)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE")


#: the launcher program of each backend, beside this interpreter (none: no launcher)
LAUNCHERS = {"horovod": "horovodrun", "torch": "torchrun"}


def _launch(backend: str, n: int, train_args: list[str]) -> list[str]:
    if backend == "none":
        return [*LARTPC, *train_args]
    if backend == "horovod":
        return [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
                *LARTPC, *train_args]
    # --standalone: a free port of this host (a fixed one failed a second bench beside it)
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n),
            "-m", "lartpc", *train_args]


def check_launcher(backend: str) -> None:
    """Refuse a backend whose launcher is not installed beside this interpreter."""
    name = LAUNCHERS.get(backend)
    if name and not (BIN / name).is_file():
        raise LartpcError(f"--backend {backend}: {BIN / name} not found (install it, or "
                          "--backend none for one plain process)")


def point_sets(args, backend: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The ``--set`` overrides of one point's ``lartpc train``: the bench's settings in
    ``args``, then the user's ``--set``, then ``extra``."""
    loader = [] if args.loader == "auto" else [f"data.loader={args.loader}"]
    return [f"data.downsample={args.downsample}", "train.epochs=1000",
            f"train.time_limit_s={args.seconds}", f"train.batch_per_rank={args.batch_per_rank}",
            f"train.device={args.device}", f"dist.backend={backend}", *loader,
            *args.overrides, *extra]


def point_config(args, backend: str, extra: tuple[str, ...] = ()) -> Config:
    """The config one point trains with, resolved as ``lartpc train`` resolves it (a bad
    ``--config`` or ``--set`` raises here, naming it, before any rank starts)."""
    return load_config(args.config or f"tiny-{args.model}", point_sets(args, backend, extra))


def check_points(configs: list[Config], data: Path, ranks: list[int]) -> None:
    """What each point's ``lartpc train`` checks before its backend starts (the data,
    the model at the data's image, the split), here, once, with the same code: a bad
    input is then one line, not a launcher's report of failed ranks."""
    from lartpc.train.plan import plan_run
    from lartpc.train.run import prepare

    with tempfile.TemporaryDirectory(prefix="lartpc-bench-check-") as tmp:
        store = prepare(configs[0], data, Path(tmp) / "run")
    for cfg in configs:
        for n in ranks:
            plan_run(cfg, store, n)


#: a line a failed ``lartpc`` process printed about its error (Horovod's launcher puts
#: ``[1]<stderr>:`` before each line of rank 1, torchrun may put ``[rank1]:``)
_ERROR_LINE = re.compile(r"^(?:\[\d+\]<std(?:err|out)>:|\[rank\d+\]:)?"
                         r"(lartpc [\w ]+: error: .*)$", re.MULTILINE)
#: a line of a rank's output in Horovod's launcher output
_RANK_LINE = re.compile(r"^\[\d+\]<std(?:err|out)>:.*$", re.MULTILINE)


def rank_error(output: str) -> str | None:
    """The first error line a rank printed in a launcher's ``output``, or None."""
    m = _ERROR_LINE.search(output)
    return m.group(1) if m else None


def rank_output(output: str, lines: int = 30) -> str:
    """The last ``lines`` lines the ranks printed in Horovod's launcher ``output``
    (without the launcher's own traceback), or the end of ``output`` if none is marked."""
    marked = _RANK_LINE.findall(output)
    return "\n".join(marked[-lines:]) if marked else output[-3000:]


def train_point(args, data: Path, out: Path, n: int, backend: str,
                extra: tuple[str, ...] = (), threshold: float = 1.2) -> dict:
    """One real training on ``n`` ranks (``backend`` none: one plain process) with the
    bench's settings in ``args`` plus ``extra`` overrides; its measured numbers."""
    train_args = ["train", "--config", args.config or f"tiny-{args.model}", "--data",
                  str(data), "--out", str(out)]
    for s in point_sets(args, backend, extra):
        train_args += ["--set", s]
    r = subprocess.run(_launch(backend, n, train_args), capture_output=True, text=True)
    if r.returncode != 0:
        # the rank's own error, not the launcher's traceback about a rank that failed
        error = rank_error(f"{r.stderr}\n{r.stdout}")
        if error:
            raise LartpcError(f"training on {n} rank(s) with {backend} failed: {error}")
        raise LartpcError(f"training on {n} rank(s) with {backend} failed (exit "
                          f"{r.returncode}):\n{rank_output(r.stdout + r.stderr)}")
    return measure_run(out, threshold)


def measure_run(out: Path, threshold: float = 1.2) -> dict:
    """The bench numbers of one finished run folder (rank 0's steps, the first one left
    out: it carries warm-up costs); ``threshold`` is the TTL loss."""
    from lartpc.analysis.metrics import run_metrics
    from lartpc.analysis.runs import load_run

    run = load_run(out)
    m = run_metrics(run, threshold=threshold)
    n = int(run.meta["world_size"])
    steps = run.steps[0].iloc[1:]
    if len(steps) < FEW_STEPS:
        log.warning("%s: %d step(s) measured (start-up %.1f s of the run): its rates are "
                    "those few steps'; give it more --seconds", out, len(steps),
                    m.dlt_s or 0.0)
    step_s = (steps["data_s"] + steps["compute_s"] + steps["comm_s"])
    total = float(step_s.sum())
    return {
        "ranks": n, "backend": run.meta.get("backend"),
        "threads_per_rank": run.meta.get("threads_per_rank"),
        "steps": m.n_steps, "few_steps": len(steps) < FEW_STEPS, "dlt_s": m.dlt_s,
        "epoch_rate_per_min": m.epoch_rate_per_min,
        # None (JSON null), never 0 or NaN, for what a run too short did not measure
        "images_per_s": None if m.images_per_s_per_gpu is None else m.images_per_s_per_gpu * n,
        "step_s_median": _median(step_s),
        "data_s_median": _median(steps["data_s"]),
        "compute_s_median": _median(steps["compute_s"]),
        "comm_s_median": _median(steps["comm_s"]),
        # share of the step spent waiting for the next batch (the issue's <= 5 %)
        "data_wait_fraction": float(steps["data_s"].sum()) / total if total > 0 else None,
        "loader": run.meta.get("loader"),
        "rulebooks": run.meta.get("rulebooks", run.meta.get("config", {}).get("data", {})
                                  .get("rulebooks", "forward")),  # as resolved (auto)
        "sparse": run.meta.get("config", {}).get("model", {}).get("sparse", "spconv"),
        # data.table_cache: every event's tables made once, each batch's joined from them
        "table_cache": bool(run.meta.get("config", {}).get("data", {}).get("table_cache")),
        # train.cuda_graph: captures, replays, eager steps (None: not asked for)
        "cuda_graph": run.meta.get("cuda_graph"),
        "ttl_threshold": threshold, "ttl_s": m.ttl_s, "ttl_censored": m.ttl_censored,
        "ttl_lower_bound_s": m.ttl_lower_bound_s, "final_loss_smoothed": m.final_loss_smoothed,
        "smooth_window": m.smooth_window, "accuracy": m.accuracy, "n_eval": m.n_eval,
    }


def _median(values) -> float | None:
    """The median of a column of step times; None when there is none."""
    return float(values.median()) if len(values) else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either was not measured (or b is 0)."""
    return None if a is None or not b else a / b


def measure_bare(out: Path, data: Path, steps: int) -> dict:
    """The bare step (:mod:`lartpc.bench.bare_step`) of the finished run in ``out``:
    its recorded config, data and threads per rank."""
    from lartpc.bench import bare_step as bare
    from lartpc.config import config_from_dict
    from lartpc.runfolder.record import read_record

    meta = read_record(out)
    cfg = config_from_dict(meta["config"], f"{out}/run.json")
    return bare.measure(cfg, data, steps=steps, threads=meta.get("threads_per_rank"))


def add_overhead(point: dict, bare: dict) -> None:
    """The bare step beside ``point``'s loop step, and the loop's overhead over it."""
    point["bare_step_s_median"] = bare["bare_step_s_median"]
    r = ratio(point["step_s_median"], bare["bare_step_s_median"])
    point["loop_overhead"] = None if r is None else r - 1.0


def check_options(args) -> None:
    """The bench's own numbers, each named, before anything runs (``--ranks``,
    ``--bare-steps`` and ``--batch-per-rank`` lists are checked by their commands)."""
    check_positive_finite(args.seconds, "--seconds")
    geometry_of(args.downsample)
    if args.data is None:
        check_positive(args.events, "--events")
    elif not args.data.exists():
        raise LartpcError(f"--data {args.data}: no such event file or folder")


def run(args: argparse.Namespace) -> int:
    ranks = int_list(args.ranks, "--ranks", minimum=1, distinct=True)  # one folder each
    if args.backend == "none" and ranks != [1]:
        raise LartpcError(f"--ranks {args.ranks}: only 1 with --backend none")
    if args.bare_steps < 0:
        raise LartpcError(f"--bare-steps {args.bare_steps}: expected 0 or more")
    check_positive(args.batch_per_rank, "--batch-per-rank")
    check_options(args)
    check_launcher(args.backend)
    compare = args.compare_torch and args.backend == "horovod"
    if compare:
        check_launcher("torch")
    configs = [point_config(args, args.backend)]
    if compare:
        configs.append(point_config(args, "torch"))
    with tempfile.TemporaryDirectory(prefix="lartpc-bench-train-") as tmp:
        tmp = Path(tmp)
        data = args.data
        if data is None:
            from lartpc.sim import write_dataset

            data = tmp / "events"
            write_dataset(data, args.events, seed=0, downsample=args.downsample,
                          workers=os.cpu_count() or 1)
        check_points(configs, data, ranks)
        points = [train_point(args, data, tmp / f"{args.backend}-{n}", n, args.backend)
                  for n in ranks]
        base = points[0]
        for p in points:
            p["scaling_efficiency"] = ratio(p["images_per_s"], None if base["images_per_s"]
                                            is None else base["images_per_s"] * p["ranks"]
                                            / base["ranks"])
        result = {
            "model": args.model, "config": args.config or f"tiny-{args.model}",
            "device": args.device, "backend": args.backend, "downsample": args.downsample,
            "batch_per_rank": args.batch_per_rank, "seconds_per_run": args.seconds,
            "cores": os.cpu_count(),
            "note": "threads_per_rank per point (default cores / ranks, SCNet on CPU 1); "
                    "efficiency relative to the first point; bare_step: forward, backward "
                    "and optimizer of the first point's config on its first batches, no "
                    "loop, with its threads; loop_overhead = step_s_median / "
                    "bare_step_s_median - 1, for the points of the first point's ranks and "
                    "threads only (the bare step is not the others'); null: not "
                    "measured (a run too short); times on the training clock (evaluation "
                    "and checkpoints left out)",
            "points": points,
        }
        if compare:
            n = max(ranks)
            t = train_point(args, data, tmp / f"torch-{n}", n, "torch")
            h = next(p for p in points if p["ranks"] == n)
            result["torch_point"] = t
            result["horovod_over_torch_step_time"] = ratio(h["step_s_median"],
                                                           t["step_s_median"])
        if args.bare_steps:
            bare = measure_bare(tmp / f"{args.backend}-{ranks[0]}", data, args.bare_steps)
            result["bare_step"] = bare
            first = points[0]
            for p in [*points, *([result["torch_point"]] if "torch_point" in result else [])]:
                if (p["ranks"], p["threads_per_rank"]) == (first["ranks"],
                                                           first["threads_per_rank"]):
                    add_overhead(p, bare)
    print(json.dumps(result, indent=2, allow_nan=False))
    return 0


