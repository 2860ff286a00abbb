"""``lartpc convert IN.h5 ... --out DIR``: upstream dense HDF5 (or, with ``--from
larcv3``, larcv3 files) -> sparse event store."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="upstream files with image/wires and label/type "
                   "(or larcv3 files with --from larcv3)")
    p.add_argument("--from", dest="source_format", choices=("upstream", "larcv3"),
                   default="upstream", help="input format (default upstream: LArSoft dense "
                   "HDF5); the larcv3 options are listed below")
    p.add_argument("--out", required=True, help="output folder for events-NNNNN.h5")
    p.add_argument("--downsample", type=int, default=1, help="bin factor K (default 1)")
    p.add_argument("--shard-size", type=int, default=1000, help="events per file")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in --out")
    p.add_argument("--time-origin", choices=("file", "generator"), default="file",
                   help="file: keep the file's ticks (upstream: x=0 at time pixel ~267); "
                        "generator: shift so x=0 lands on the generator's pixel ~1067")
    p.add_argument("--trigger-tick", type=int, default=800,
                   help="tick of x=0 in the input files (upstream: 800 = -400 us at 2 MHz)")
    p.add_argument("--charge-scale", type=float, default=1.0,
                   help="factor on summed ADC; (electrons per ADC)/1000 gives the "
                        "generator's unit of 10^3 electrons (default 1: raw ADC sums)")
    from lartpc.commands.larcv3_options import add_larcv3_arguments

    add_larcv3_arguments(p)


def run(args: argparse.Namespace) -> int:
    from lartpc.data.convert import convert

    if args.source_format == "larcv3":
        from lartpc.commands.larcv3_options import run_convert

        return run_convert(args)
    from lartpc.commands.larcv3_options import refuse_larcv3_options

    refuse_larcv3_options(args)
    res = convert(args.inputs, args.out, downsample=args.downsample,
                  shard_size=args.shard_size, overwrite=args.overwrite, progress=True,
                  time_origin=args.time_origin, trigger_tick=args.trigger_tick,
                  charge_scale=args.charge_scale)
    print(f"converted {res.converted} events into {len(res.paths)} file(s) in {args.out}; "
          f"skipped {res.skipped} whose label is not exactly one of the five classes")
    return 0
