"""A copy of an event store with every event turned to face one way, by the image alone.

    python -m lartpc.jobs.local.orient_store fid/events-isotropic-ds1 fid-or/events-isotropic-ds1

A diagnostic for the isotropic fidelity gap, not part of the study. In beam events a
shower starts at its upstream end, always on the same side of the image; in isotropic
ones the start is either end of a track pointing anywhere. This finds each event's start
and projected direction with :func:`lartpc.jobs.local.dedx_check.find_start` (no truth)
and mirrors the event on the wire axis when that direction points to lower wires, and
on the time axis when it points to earlier times, so that the start the rule finds lies
at the low-wire, early end. Training on the copy asks whether the network's trouble is
finding the start. Mirroring moves the event in the image (into wire and time ranges the
detector leaves empty), the charge and truth are kept as they are, and the truth
direction is not mirrored. The copy keeps the source's file attributes (so ``python -m
lartpc.jobs.local.fidelity`` takes it as the store of that seed when it sits at
``OUT/events-GEOMETRY-ds1``) and adds ``oriented_by``. Prints JSON: how many events
were mirrored on each axis, and how often the found direction's wire component has the
sign of the truth direction's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
from lartpc.jobs.local.dedx_check import find_start

from lartpc.data.staging import existing_shards, prepare_out, staged_shards
from lartpc.data.store import EventStore, write_shard
from lartpc.errors import LartpcError

KEPT_ATTRS = ("source_geometry", "dead_wire_fraction")  #: the generator's extra attributes


def orient(ev, geom) -> tuple[bool, bool, bool]:
    """Mirror ``ev`` in place; (mirrored on the wire axis, on the time axis, the found
    direction's wire component has the truth direction's sign)."""
    if len(ev.charge) == 0:
        return False, False, False
    _, (dx, dz) = find_start(geom, ev.row.astype(float), ev.col.astype(float), ev.charge)
    flip_wire, flip_time = bool(dz < 0), bool(dx < 0)
    if flip_wire:
        ev.col = (geom.width - 1 - ev.col).astype(np.int16)
    if flip_time:
        ev.row = (geom.height - 1 - ev.row).astype(np.int16)
    truth_dz = float(np.asarray(ev.truth.get("direction", (0.0, 0.0, 0.0)))[2])
    return flip_wire, flip_time, bool(np.sign(dz) == np.sign(truth_dz))


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
        if store.geometry.downsample != 1:
            raise LartpcError(f"{args.source}: downsample {store.geometry.downsample}; "
                              "find_start needs full-resolution events (downsample 1)")
        if args.out.resolve() == args.source.resolve():
            raise LartpcError(f"{args.out}: is the source; give a new folder")
        out = prepare_out(args.out, overwrite=False)
        with staged_shards(out) as stage:
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
