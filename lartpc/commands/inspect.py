"""``lartpc inspect PATH``: events per class, pixel occupancy, bytes per event, geometry."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="event file or folder of events-*.h5 shards")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--truth-limits", action="store_true",
                   help="also report, from generator truth, the share of events per class "
                        "no image can classify (exiting MIP stubs, invisible energy)")


def summary(path) -> dict:
    """Summary of an event store as a JSON-able dict."""
    import numpy as np

    from lartpc.data import EventStore

    store = EventStore(path)
    pix = store.pixel_counts()
    nbytes = sum(p.stat().st_size for p in store.paths)
    g = store.geometry
    q = [5, 25, 50, 75, 95]
    return {
        "path": str(path), "files": len(store.paths), "events": len(store),
        "events_per_class": dict(zip(store.classes, map(int, store.class_counts()),
                                     strict=True)),
        "active_pixels_percentiles": {f"p{k}": float(v) for k, v in
                                      zip(q, np.percentile(pix, q) if len(pix) else [0] * 5,
                                          strict=True)},
        "occupancy_median": float(np.median(pix) / (g.height * g.width)) if len(pix) else 0.0,
        "bytes_per_event": round(nbytes / max(len(store), 1)),
        "geometry": g.to_attrs(),
        "generator": store.attrs.get("generator"),
        "generator_version": store.attrs.get("generator_version"),
        "seed": store.attrs.get("seed"),
    }


def run(args: argparse.Namespace) -> int:
    s = summary(args.path)
    lim = None
    if args.truth_limits:
        from lartpc.data import EventStore
        from lartpc.sim.limits import format_limits, truth_limits

        lim = truth_limits(EventStore(args.path))
        s["truth_limits"] = lim
    if args.json:
        print(json.dumps(s))
        return 0
    g = s["geometry"]
    print(f"{s['path']}: {s['events']} events in {s['files']} file(s)")
    print(f"generator {s['generator']} {s['generator_version']} seed {s['seed']}")
    print(f"image {g['height']} x {g['width']} (downsample {g['downsample']}), "
          f"{g['n_wires']} wires at {g['wire_pitch_cm']} cm, ticks grouped by {g['tick_group']}")
    print("events per class: " + ", ".join(f"{k} {v}" for k, v in s["events_per_class"].items()))
    print("active pixels per event: " + ", ".join(
        f"{k} {v:.0f}" for k, v in s["active_pixels_percentiles"].items())
        + f" (median occupancy {100 * s['occupancy_median']:.3f} %)")
    print(f"bytes per event on disk: {s['bytes_per_event']}")
    if lim is not None:
        print(format_limits(lim))
    return 0
