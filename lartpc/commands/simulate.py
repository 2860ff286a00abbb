"""``lartpc simulate``: generate synthetic single-particle events into an event store."""

from __future__ import annotations

import argparse

from lartpc.errors import LartpcError


def parse_range(text: str) -> tuple[float, float]:
    """'1.5:4.5' -> (1.5, 4.5)."""
    try:
        lo, hi = (float(v) for v in text.split(":"))
    except ValueError:
        raise LartpcError(f"--momentum-gev {text!r}: expected LOW:HIGH, e.g. 1.5:4.5") from None
    return lo, hi


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder for events-NNNNN.h5 shards")
    p.add_argument("--events", type=int, required=True, help="number of events")
    p.add_argument("--seed", type=int, default=0, help="dataset seed (default 0)")
    p.add_argument("--classes", default="gamma,electron,muon,pion,kaon",
                   help="comma-separated classes, cycled for balance (default all five)")
    p.add_argument("--momentum-gev", default="1.5:4.5", help="uniform momentum range LOW:HIGH")
    p.add_argument("--downsample", type=int, default=1,
                   help="bin the 3600x3600 image by K in both axes (default 1)")
    p.add_argument("--workers", type=int, default=1, help="processes (output is identical)")
    p.add_argument("--shard-size", type=int, default=1000, help="events per file")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in --out")
    p.add_argument("--source-geometry", default="isotropic",
                   help="where particles start and go (the store's source_geometry; the "
                        "detector image is the store's geometry): isotropic: vertex uniform "
                        "in the volume, any direction; beam: vertex uniform in a box along "
                        "the beam axis (500 cm), within 5 degrees of it "
                        "(lartpc.sim.generate.draw_source)")
    # --geometry: its name before 2026-11-26, still read (commands in docs/results JSON)
    p.add_argument("--geometry", dest="source_geometry", help=argparse.SUPPRESS)
    p.add_argument("--dead-wire-fraction", type=float, default=0.0,
                   help="fraction of collection wires that read nothing (default 0)")
    p.add_argument("--physics", default=None,
                   help="the generator's physics version: sim4 (default, the latest) or "
                        "sim3 (the events of runs made before sim4; "
                        "lartpc.sim.versions)")


def run(args: argparse.Namespace) -> int:
    from lartpc.sim import write_dataset
    from lartpc.sim.readout import ReadoutConfig

    try:
        readout = ReadoutConfig(dead_wire_fraction=args.dead_wire_fraction)
    except ValueError as e:
        raise LartpcError(f"--dead-wire-fraction: {e}") from None
    paths = write_dataset(args.out, args.events, seed=args.seed, downsample=args.downsample,
                          classes=args.classes, momentum_gev=parse_range(args.momentum_gev),
                          workers=args.workers, shard_size=args.shard_size,
                          progress=args.events >= 200, overwrite=args.overwrite,
                          source_geometry=args.source_geometry, readout=readout,
                          physics=args.physics)
    print(f"wrote {args.events} events to {len(paths)} file(s) in {args.out}")
    return 0
