"""A copy of an event store with every event turned to face one way, by the image alone.

    python -m lartpc.jobs.local.orient_store fid/events-isotropic-ds1 fid-or/events-isotropic-ds1

Every event goes through the start-finding stage of :mod:`lartpc.data.orient` (the
rule and why), once, into a copy on disk; ``data.orient=start`` applies the same stage
when a loader reads its shard, so a store as it is can be used instead. The copy
keeps the source's file attributes (so ``python -m lartpc.jobs.local.fidelity`` takes
it as the store of that seed when it sits at ``OUT/events-GEOMETRY-ds1``) and adds
``oriented_by``. Prints JSON: how many events were mirrored on each axis, and how often
the found direction's wire component has the sign of the truth direction's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
from pathlib import Path

import numpy as np

from lartpc.data.orient import check_resolution, orient
from lartpc.data.staging import existing_shards, replace_store
from lartpc.data.store import EventStore, write_shard
from lartpc.errors import LartpcError

KEPT_ATTRS = ("source_geometry", "dead_wire_fraction")  #: the generator's extra attributes


def _orient_shard(job: tuple[Path, Path]) -> list[int]:
    src, dst = job
    store = EventStore(src)
    geom, attrs = store.geometry, store.attrs
    events, counts = store.read_many(range(len(store))), np.zeros(3, int)
    for ev in events:
        counts += orient(ev, geom)
    write_shard(dst, events, geom, generator=str(attrs.get("generator", "")),
                generator_version=str(attrs.get("generator_version", "")),
                seed=int(attrs.get("seed", -1)),
                attrs={**{k: attrs[k] for k in KEPT_ATTRS if k in attrs},
                       "oriented_by": "find_start"})
    return [len(events), *counts.tolist()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="event store (full resolution)")
    ap.add_argument("out", type=Path, help="new folder for the oriented copy")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers {args.workers}: must be at least 1")
    try:
        store = EventStore(args.source)
        check_resolution(store.geometry, str(args.source))
        if args.out.resolve() == args.source.resolve():
            raise LartpcError(f"{args.out}: is the source; give a new folder")
        out = args.out
        with replace_store(out, overwrite=False) as stage:
            jobs = [(p, stage / p.name) for p in store.paths]
            if args.workers == 1 or len(jobs) == 1:
                counts = list(map(_orient_shard, jobs))
            else:
                with mp.get_context("spawn").Pool(min(args.workers, len(jobs))) as pool:
                    counts = pool.map(_orient_shard, jobs)
    except LartpcError as e:
        ap.exit(2, f"orient_store: {e}\n")
    n, wire, time, agree = (int(v) for v in np.sum(counts, axis=0))
    print(json.dumps({"events": n, "shards": len(existing_shards(out)),
                      "mirrored_wire_axis": wire, "mirrored_time_axis": time,
                      "found_wire_sign_agrees_with_truth": agree / max(n, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
