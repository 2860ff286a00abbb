"""The larcv3 side of ``lartpc convert --from larcv3``: its options and its run."""

from __future__ import annotations

import argparse


def add_larcv3_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--from larcv3")
    g.add_argument("--producer", default="lartpc",
                   help="sparse2d producer holding the images (default lartpc)")
    g.add_argument("--projection", type=int, default=0,
                   help="projection id of the tensor to take (default 0)")
    g.add_argument("--particles", default=None,
                   help="particle producer whose first particle labels the event "
                        "(default: the --producer name)")
    g.add_argument("--classes", default=None, metavar="TOML",
                   help="PDG -> class mapping: a [classes] table of name = [pdg, ...] in "
                        "label order (default: the study's five: gamma 22, electron +-11, "
                        "muon -13, pion 211, kaon 321)")


def refuse_larcv3_options(args: argparse.Namespace) -> None:
    """``--from upstream``: the larcv3 options, when given, would be ignored: refused.

    Raises
    ------
    LartpcError
        Naming the first such option.
    """
    from lartpc.errors import LartpcError

    for opt, value, default in (("--producer", args.producer, "lartpc"),
                                ("--projection", args.projection, 0),
                                ("--particles", args.particles, None),
                                ("--classes", args.classes, None)):
        if value != default:
            raise LartpcError(f"{opt}: applies to --from larcv3 only")


def run_convert(args: argparse.Namespace) -> int:
    from lartpc.data.larcv3 import ClassMap, convert_larcv3
    from lartpc.errors import LartpcError

    for opt, value, default in (("--time-origin", args.time_origin, "file"),
                                ("--trigger-tick", args.trigger_tick, 800),
                                ("--charge-scale", args.charge_scale, 1.0)):
        if value != default:
            raise LartpcError(f"{opt}: applies to --from upstream only")
    res = convert_larcv3(args.inputs, args.out, producer=args.producer,
                         projection=args.projection, particles=args.particles,
                         class_map=ClassMap.load(args.classes), downsample=args.downsample,
                         shard_size=args.shard_size, overwrite=args.overwrite, progress=True)
    print(f"converted {res.converted} events into {len(res.paths)} file(s) in {args.out}; "
          f"skipped {res.skipped}: {res.reasons}")
    return 0
