"""``lartpc export --to larcv3 STORE FILE``: an event store as one larcv3 file."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", dest="target_format", choices=("larcv3",), required=True,
                   help="output format")
    p.add_argument("store", help="event store (folder of events-NNNNN.h5, or one file)")
    p.add_argument("output", help="larcv3 file to write")
    p.add_argument("--producer", default="lartpc",
                   help="producer name of the sparse2d tensors and particles (default lartpc)")
    p.add_argument("--projection", type=int, default=0, help="projection id (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing file")


def run(args: argparse.Namespace) -> int:
    from lartpc.data.larcv3 import export

    n = export(args.store, args.output, producer=args.producer, projection=args.projection,
               overwrite=args.overwrite, progress=True)
    print(f"wrote {n} events to {args.output} (larcv3: sparse2d and particle of producer "
          f"{args.producer!r}, projection {args.projection})")
    return 0
