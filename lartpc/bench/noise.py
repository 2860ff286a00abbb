"""``lartpc bench noise``: what measuring the gradient noise scale costs per step.

One process times training steps (forward, backward, Adam step, the meter's record)
interleaved as off / ranks / halves, so the three see the same machine load, and
reports the median of each and the overhead of a measured step relative to an
unmeasured one, also divided by ``--every`` (the cost at train.noise_every_steps).
``ranks`` is timed on a one-process stand-in world of size 2 whose collectives are the
identity: it covers the hooks and the norms, not the one 16-byte allreduce of a real job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from lartpc.cliparse import add_batch_per_rank, check_positive, check_seed
from lartpc.config import MAX_THREADS, choices


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="jishnet", choices=choices("model.name"))
    add_batch_per_rank(parser)
    parser.add_argument("--size", type=int, default=None,
                        help="image side without --data (default 400, downsample 9); with "
                        "--data, the store's (given, it must match)")
    parser.add_argument("--data", default=None, help="event store to read the batch from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument("--every", type=int, default=10,
                        help="train.noise_every_steps to report the amortised cost for")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")


def _time_steps(args, batch, shape) -> dict[str, list[float]]:
    import torch

    from lartpc.dist.world import World
    from lartpc.models import build
    from lartpc.models.losses import build_loss
    from lartpc.train.noise import NoiseMeter

    def nullctx():
        from contextlib import nullcontext

        return nullcontext()

    loss_fn = build_loss("paper")
    setups = {}
    for mode, world in (("off", World()), ("ranks", World(size=2)), ("halves", World())):
        torch.manual_seed(args.seed)
        model = build(args.model, image_size=shape)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)
        setups[mode] = (model, opt, NoiseMeter(mode, 1, world, model, None))
    times: dict[str, list[float]] = {m: [] for m in setups}
    for i in range(args.steps + 1):  # the first round warms up
        for mode, (model, opt, meter) in setups.items():
            t0 = time.perf_counter()
            opt.zero_grad()
            _, loss = meter.forward_backward(model, loss_fn, batch, nullctx, i)
            opt.step()
            meter.record(i, 0, float(loss))
            if i:
                times[mode].append(time.perf_counter() - t0)
    return times


def run(args: argparse.Namespace) -> int:
    from lartpc.errors import LartpcError

    if not 1 <= args.threads <= MAX_THREADS:  # torch crashes creating that many threads
        raise LartpcError(f"--threads = {args.threads}: must be in 1..{MAX_THREADS}")
    for value, option in ((args.batch_per_rank, "--batch-per-rank"), (args.steps, "--steps"),
                          (args.every, "--every")):
        check_positive(value, option)
    check_seed(args.seed)
    from lartpc.bench.model import batch_from_events, check_size, load_events

    check_size(args.size)
    if args.data is None and args.size is None:
        args.size = 400
    import torch  # after the checks: a bad option is one line at once

    from lartpc.models import build

    torch.set_num_threads(args.threads)
    events, shape = load_events(args)
    kind = build(args.model, image_size=shape).input_kind
    batch = batch_from_events(events, shape, kind)
    times = _time_steps(args, batch, shape)
    off = statistics.median(times["off"])
    out = {"model": args.model, "shape": list(shape), "batch_per_rank": args.batch_per_rank,
           "threads": args.threads, "steps": args.steps, "every": args.every,
           "median_step_s": {m: round(statistics.median(t), 5) for m, t in times.items()}}
    for mode in ("ranks", "halves"):
        extra = (statistics.median(times[mode]) - off) / off
        out[f"{mode}_overhead_measured_step"] = round(extra, 4)
        out[f"{mode}_overhead_at_every"] = round(extra / args.every, 4)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0
