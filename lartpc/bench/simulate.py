"""``lartpc bench simulate``: events per second per worker at full resolution."""

from __future__ import annotations

import argparse
import json
import logging
import time

from lartpc.cliparse import check_positive, check_seed, geometry_of

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=100, help="events to generate (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--downsample", type=int, default=1, help="default 1 (full resolution)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--physics", default=None,
                   help="the generator's physics version (default the latest)")


def run(args: argparse.Namespace) -> int:
    check_positive(args.events, "--events")
    check_seed(args.seed)
    check_positive(args.workers, "--workers")
    geom = geometry_of(args.downsample)
    from lartpc.sim.versions import physics

    version = physics(args.physics).name
    import tempfile  # after the options' check: a bad one is one line at once
    from pathlib import Path

    import numpy as np

    from lartpc import CLASSES
    from lartpc.data import EventStore
    from lartpc.sim import simulate_event, write_dataset

    simulate_event(0, args.seed, geom, physics=version)  # warm the tables and imports
    per_class: dict[str, list[float]] = {c: [] for c in CLASSES}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        write_dataset(d, args.events, seed=args.seed, downsample=args.downsample,
                      workers=args.workers, shard_size=max(1, args.events // args.workers),
                      physics=version)
        wall = time.perf_counter() - t0
        nbytes = sum(p.stat().st_size for p in Path(d).glob("events-*.h5"))
        store = EventStore(d)
        pix = store.pixel_counts()
    n_single = min(args.events, 25)  # per-class timing, single process
    for i in range(n_single):
        t = time.perf_counter()
        ev = simulate_event(i, args.seed, geom, physics=version)
        per_class[CLASSES[ev.label]].append(time.perf_counter() - t)
    rate = args.events / wall
    print(json.dumps({
        "benchmark": "simulate", "physics": version, "events": args.events,
        "workers": args.workers,
        "downsample": args.downsample, "image": list(geom.shape), "wall_s": round(wall, 3),
        "events_per_s": round(rate, 2), "events_per_s_per_worker": round(rate / args.workers, 2),
        "bytes_per_event": round(nbytes / args.events), "median_active_pixels": int(np.median(pix)),
        "ms_per_event_by_class": {c: round(1000 * float(np.mean(v)), 1)
                                  for c, v in per_class.items() if v},
    }))
    return 0
