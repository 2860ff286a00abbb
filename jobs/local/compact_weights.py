"""Compact weights of a run folder, to commit in place of its 20 MB checkpoint.

    python -m lartpc.jobs.local.compact_weights RUN --seed 1 --source-geometry beam \
        [--dtype float16]

Writes ``RUN/weights.pt`` (:mod:`lartpc.train.weights`): the network's parameters in
``--dtype``, its config, the store it was trained on, its training time, and how its
events are made again (``--seed``, ``--source-geometry``, ``--downsample``, and
``lartpc simulate``'s defaults otherwise; or all of it, classes, momentum range and dead
wires included, read from ``--store``, the store the run trained on; the count from
``run.json``'s store record), which is what ``lartpc evaluate RUN --regenerate DIR``
needs to score its held-out events without the training events. Then run that command
and keep the weights only if it reproduces the run's ``confusion.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lartpc.errors import LartpcError


def made_from(path: Path, record: dict) -> dict:
    """How the events of the generated store at ``path`` were made (the ``events`` of
    :mod:`lartpc.train.weights`), checked to be the store of ``record`` (run.json's)."""
    from lartpc.data.store import EventStore
    from lartpc.sim.generate import CLASSES, MOMENTUM_GEV
    from lartpc.sim.versions import PHYSICS, of_store
    from lartpc.train.segments import store_identity

    store = EventStore(path)
    if store_identity(store, int(record["events"])) != record:
        raise LartpcError(f"--store {path}: not the store the run trained on (its events or "
                          "their hash differ from run.json's store record)")
    a = store.attrs
    if a.get("generator") != "lartpc.sim":
        raise LartpcError(f"--store {path}: not made by lartpc simulate ({a.get('generator')})")
    events = {"seed": int(a["seed"]), "events": int(record["events"]),
              "geometry": str(a.get("source_geometry", "isotropic")),
              "downsample": int(a["downsample"])}
    physics = of_store(a.get("generator_version", ""))
    if physics is None:
        raise LartpcError(f"--store {path}: its generator_version "
                          f"{a.get('generator_version')!r} names no physics version "
                          f"({', '.join(PHYSICS)})")
    # lartpc simulate's defaults, which a store from before these attributes was made with
    low, high = (float(v) for v in MOMENTUM_GEV)
    defaults = {"classes": ",".join(CLASSES), "momentum_gev": [low, high],
                "dead_wire_fraction": 0.0}
    made = {"classes": str(a.get("generated_classes", defaults["classes"])),
            "momentum_gev": [float(a.get("momentum_min_gev", low)),
                             float(a.get("momentum_max_gev", high))],
            "dead_wire_fraction": float(a.get("dead_wire_fraction", 0.0))}
    # physics always: a record without it means sim3 (lartpc.sim.versions.UNRECORDED)
    return {**events, **{k: v for k, v in made.items() if v != defaults[k]},
            "physics": physics}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.compact_weights",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="run folder holding checkpoint.pt and run.json")
    p.add_argument("--store", type=Path, help="the store the run trained on: how its events "
                   "were made is read from it (then no --seed, --source-geometry, --downsample)")
    p.add_argument("--seed", type=int, help="the events' seed")
    p.add_argument("--source-geometry", help="the events' source geometry")
    p.add_argument("--downsample", type=int, default=1)
    p.add_argument("--physics", help="the events' generator physics version (with --seed: "
                   "sim3 or sim4, lartpc.sim.versions)")
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16, float32")
    p.add_argument("--out", type=Path, help="default RUN/weights.pt")
    args = p.parse_args(argv)
    from lartpc.runfolder.record import read_record
    from lartpc.train import weights

    try:
        store = read_record(args.run).get("store") or {}
        if "events" not in store:
            raise LartpcError(f"{args.run}/run.json: no store record (events)")
        if args.store is not None:
            events = made_from(args.store, store)
        elif args.seed is None or args.source_geometry is None or args.physics is None:
            # --physics too: a run's events before 2026-11-30 were sim3, since sim4
            raise LartpcError("give --store, or --seed, --source-geometry and --physics "
                              "(sim3 for a run trained before 2026-11-30)")
        else:
            from lartpc.sim.versions import physics

            events = {"seed": args.seed, "events": int(store["events"]),
                      "geometry": args.source_geometry, "downsample": args.downsample,
                      "physics": physics(args.physics).name}
        out = weights.save(args.run, args.out or args.run / weights.WEIGHTS, args.dtype, events)
    except LartpcError as e:
        print(f"compact_weights: {e}", file=sys.stderr)
        return 2
    print(f"{out}: {out.stat().st_size} bytes ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
