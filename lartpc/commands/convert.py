"""``lartpc convert IN.h5 ... --out DIR``: upstream dense HDF5 -> sparse event store."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="upstream files with image/wires and label/type")
    p.add_argument("--out", required=True, help="output folder for events-NNNNN.h5")
    p.add_argument("--downsample", type=int, default=1, help="bin factor K (default 1)")
    p.add_argument("--shard-size", type=int, default=1000, help="events per file")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in --out")


def run(args: argparse.Namespace) -> int:
    from lartpc.data.convert import convert
    from lartpc.errors import LartpcError

    try:
        res = convert(args.inputs, args.out, downsample=args.downsample,
                      shard_size=args.shard_size, overwrite=args.overwrite, progress=True)
    except ValueError as e:  # Geometry rejects a bad downsample
        raise LartpcError(f"--downsample: {e}") from None
    print(f"converted {res.converted} events into {len(res.paths)} file(s) in {args.out}; "
          f"skipped {res.skipped} whose label is not exactly one of the five classes")
    return 0
