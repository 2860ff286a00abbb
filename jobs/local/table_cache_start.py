"""What making every event's tables costs when the loader starts (``data.table_cache``).

    python -m lartpc.jobs.local.table_cache_start EVENTS [--copies 10]

Reads ``EVENTS`` (a store, e.g. ``lartpc simulate --events 210 --downsample 1``), takes
its events ``--copies`` times over (a shard of study size from a small store: the
tables are per event, so copies cost what as many new events would), and makes their
tables once in this fresh process, as the sparse loader does at its start. Prints one
JSON object: the tables' MB, the seconds, and the memory it took: the growth of the
process's peak resident set (``ru_maxrss``) over the start (null where it stayed
under the peak of reading the store), and what stays resident
after it (``/proc/self/status`` VmRSS), both in MB beside the tables' own.
"""

from __future__ import annotations

import argparse
import json
import resource

import numpy as np
import torch

from lartpc.data.loader_base import SparseEvents
from lartpc.data.store import EventStore
from lartpc.models.scnet import SCNet


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("events", help="event store (folder of events-*.h5)")
    ap.add_argument("--copies", type=int, default=1, help="times over the store's events")
    args = ap.parse_args(argv)
    if args.copies < 1:
        ap.error(f"--copies must be at least 1, got {args.copies}")
    torch.set_num_threads(1)
    store = EventStore(args.events)
    shape = tuple(store.geometry.shape)
    events = store.read_many(range(len(store)))
    pixels = SparseEvents(events * args.copies, shape)
    del events
    cached = SCNet(image_size=shape, sparse="torch").rulebook_builder(training=True, cache=True)
    rss0 = _rss_mb()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cached.attach(pixels)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cache = cached.cache
    print(json.dumps({
        "events": cache.events, "copies": args.copies, "image": list(shape),
        "tables_mb": round(cache.nbytes / 1e6, 1), "seconds": round(cache.seconds, 2),
        # null where the start stayed under the process's earlier peak (reading the store)
        "peak_growth_mb": round(peak - rss0, 1) if peak > peak0 else None,
        "resident_growth_mb": round(_rss_mb() - rss0, 1),
        "sites": int(np.sum(np.diff(pixels.offsets))),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
