"""Compact weights of a run folder, to commit in place of its 20 MB checkpoint.

    python -m lartpc.jobs.local.compact_weights RUN --seed 1 --source-geometry beam \
        [--dtype float16]

Writes ``RUN/weights.pt`` (:mod:`lartpc.train.weights`): the network's parameters in
``--dtype``, its config, the store it was trained on, its training time, and how its
events are made again (``--seed``, ``--source-geometry``, ``--downsample``; the count from
``run.json``'s store record), which is what ``lartpc evaluate RUN --regenerate DIR``
needs to score its held-out events without the training events. Then run that command
and keep the weights only if it reproduces the run's ``confusion.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lartpc.errors import LartpcError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.compact_weights",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="run folder holding checkpoint.pt and run.json")
    p.add_argument("--seed", type=int, required=True, help="the events' seed")
    p.add_argument("--source-geometry", required=True, help="the events' source geometry")
    p.add_argument("--downsample", type=int, default=1)
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16, float32")
    p.add_argument("--out", type=Path, help="default RUN/weights.pt")
    args = p.parse_args(argv)
    from lartpc.runfolder.record import read_record
    from lartpc.train import weights

    try:
        store = read_record(args.run).get("store") or {}
        if "events" not in store:
            raise LartpcError(f"{args.run}/run.json: no store record (events)")
        events = {"seed": args.seed, "events": int(store["events"]),
                  "geometry": args.source_geometry, "downsample": args.downsample}
        out = weights.save(args.run, args.out or args.run / weights.WEIGHTS, args.dtype, events)
    except LartpcError as e:
        print(f"compact_weights: {e}", file=sys.stderr)
        return 2
    print(f"{out}: {out.stat().st_size} bytes ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
