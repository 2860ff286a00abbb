"""Where a training step's host time goes (issue 36): two views of the same loop.

    py-spy record -r 200 --format raw -o spy.txt -- python -m lartpc train --config \\
        tiny-scnet --data EV --out RUN --set data.downsample=8 --set train.time_limit_s=40 \\
        --set train.epochs=1000 --set train.device=cpu --set dist.backend=none
    python -m lartpc.jobs.local.host_profile spy spy.txt --run RUN     # ms per step, by part
    python -m lartpc.jobs.local.host_profile ops --data EV --set data.downsample=8

``spy`` sorts py-spy's sampled Python stacks (raw/collapsed format) into the parts of
the loop (forward with spconv's rulebooks apart, backward, optimizer, read-backs, vote,
sinks, loader, epoch-end evaluation and checkpoint) and gives each in milliseconds per
training step (the run folder's rank-000.csv counts the steps). Native code is
charged to the Python frame that called it. ``ops`` runs ``--steps`` trainer steps
under torch.profiler after as many untimed ones and prints the ops by self time, then
the allocations, fills, copies and scalar read-backs per step, and the main thread's
aten calls per step (on a GPU each computing one is about one kernel launch).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

#: (part, substrings a stack must all hold): the first that matches takes the sample.
PARTS = (
    ("forward: spconv rulebooks (get_indice_pairs)", ("forward_backward", "get_indice_pairs")),
    ("forward: the rest, loss included", ("forward_backward", "_call_impl")),
    ("backward", ("forward_backward", "backward")),
    ("optimizer step (Adam)", ("step_optimizer",)),
    ("zero_grad", ("zero_grad",)),
    ("set_lr", ("set_lr",)),
    ("stop vote (the step's one allreduce)", ("Trainer._agree",)),
    ("time-limit check", ("time_left",)),
    ("sinks.on_step (CSV row, console, TensorBoard)", ("on_step",)),
    ("waiting for the batch (main thread)", ("Trainer.batches",)),
    ("rest of Trainer.step (loss/accuracy read-back, record)", ("Trainer.step",)),
    ("epoch end: checkpoint", ("Checkpointer.save",)),
    ("epoch end: evaluation and its files", ("evaluate",)),
    ("epoch end: evaluation and its files", ("on_eval",)),
    ("loader thread: building batches", ("_produce",)),
    ("loader thread: waiting to hand over", ("prefetch",)),
)


def spy_parts(lines, parts=PARTS) -> dict[str, int]:
    """Samples per part (and ``other``: start-up, imports, the rest) of py-spy raw lines
    ``frame;frame;... count``."""
    out: dict[str, int] = {}
    for line in lines:
        line = line.rstrip()
        if not line:
            continue
        stack, n = line.rsplit(" ", 1)
        name = next((p for p, subs in parts if all(s in stack for s in subs)), "other")
        out[name] = out.get(name, 0) + int(n)
    return out


def spy_table(samples: dict[str, int], steps: int, rate_hz: float) -> str:
    total = sum(samples.values())
    rows = ["| part | ms per step | share of samples |", "|---|---|---|"]
    names = list(dict.fromkeys([p for p, _ in PARTS] + ["other"]))
    for name in names:
        n = samples.get(name, 0)
        rows.append(f"| {name} | {1e3 * n / rate_hz / steps:.2f} | {100 * n / total:.1f} % |")
    return "\n".join(rows) + "\n"


def _steps_of(run: Path) -> int:
    from lartpc.runfolder.schema import rank_csv_name

    text = (run / rank_csv_name(0)).read_text()
    return max(0, len(text.splitlines()) - 1)


#: aten ops that compute nothing: views, metadata, allocations (counted apart above)
NO_WORK = frozenset(f"aten::{n}" for n in (
    "empty", "empty_strided", "as_strided", "view", "_reshape_alias", "reshape", "detach",
    "lift_fresh", "resolve_conj", "resolve_neg", "_unsafe_view", "alias", "t", "transpose",
    "expand", "permute", "slice", "select", "unsqueeze", "squeeze", "flatten", "result_type",
    "is_nonzero", "set_", "_local_scalar_dense", "to", "contiguous", "numpy_T"))


def main_thread_work(events, steps: int) -> tuple[float, float]:
    """(aten calls per step, those that compute) in the main thread (the profiler records
    the thread that started it, not the loader's). A call is an outermost aten op (not
    called by another); it computes when it or an op it calls is not a view, an
    allocation or a read-back (``NO_WORK``): on a GPU about one kernel launch each (a
    composite such as cross-entropy a few)."""
    def computes(e) -> bool:
        return e.name not in NO_WORK or any(computes(c) for c in e.cpu_children
                                            if c.name.startswith("aten::"))

    calls = [e for e in events if e.name.startswith("aten::")
             and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return len(calls) / steps, sum(map(computes, calls)) / steps


def ops(data: Path, sets: list[str], steps: int, config: str) -> str:
    """torch.profiler's table over ``steps`` trainer steps after as many warm-up steps,
    and the per-step counts of allocations, fills, copies and read-backs."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    from lartpc import dist
    from lartpc.config import load_config
    from lartpc.data.store import EventStore
    from lartpc.train.parts import set_threads
    from lartpc.train.plan import plan_run
    from lartpc.train.segments import Segment
    from lartpc.train.trainer import Trainer

    cfg = load_config(config, ["train.epochs=1000", *sets])
    world = dist.init("none", cfg.train.device)
    set_threads(cfg, world)
    store = EventStore(data)
    with tempfile.TemporaryDirectory(prefix="lartpc-host-profile-") as tmp:
        t = Trainer.build(Segment(cfg, store, plan_run(cfg, store, 1), world, Path(tmp),
                                  time.time()))

        def run(n: int) -> None:
            while n:
                for batch, data_s in t.batches():
                    t.step(batch, data_s)
                    n -= 1
                    if not n:
                        return
                t.state.next_epoch()

        run(steps)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]
                     if world.device.type == "cuda" else [ProfilerActivity.CPU]) as prof:
            run(steps)
            if world.device.type == "cuda":
                torch.cuda.synchronize()
        t.close()
    ka = prof.key_averages()
    lines = [ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60),
             f"per step ({steps} profiled):"]
    for name in ("aten::empty", "aten::empty_strided", "aten::zeros", "aten::zero_",
                 "aten::fill_", "aten::copy_", "aten::_local_scalar_dense",
                 "cudaStreamSynchronize", "cudaLaunchKernel"):
        e = next((x for x in ka if x.key == name), None)
        if e is not None:
            lines.append(f"  {name}: {e.count / steps:.1f} calls, self CPU "
                         f"{e.self_cpu_time_total / steps / 1e3:.3f} ms")
    calls, work = main_thread_work(prof.events(), steps)
    lines.append(f"  main thread: {calls:.1f} aten calls, {work:.1f} of them computing "
                 "(not only views, allocations or read-backs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sp = sub.add_parser("spy", help="py-spy raw stacks of a training -> ms per step by part")
    sp.add_argument("raw", type=Path)
    sp.add_argument("--run", type=Path, required=True, help="the profiled run folder")
    sp.add_argument("--rate", type=float, default=200.0, help="py-spy's -r (samples/s)")
    op = sub.add_parser("ops", help="torch.profiler over trainer steps")
    op.add_argument("--data", type=Path, required=True)
    op.add_argument("--config", default="tiny-scnet")
    op.add_argument("--steps", type=int, default=20)
    op.add_argument("--set", dest="sets", action="append", default=[],
                    metavar="SECTION.KEY=VALUE")
    args = ap.parse_args(argv)
    if args.what == "spy":
        with open(args.raw, encoding="utf-8") as f:
            print(spy_table(spy_parts(f), _steps_of(args.run), args.rate), end="")
    else:
        print(ops(args.data, args.sets, args.steps, args.config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
