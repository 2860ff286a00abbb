"""``lartpc bench convert``: conversion rate (events/s) of the larcv3 converter against
the upstream dense-HDF5 converter, on the same events.

Events are generated (``--downsample``, default 9: 400 x 400), then written twice: as an
upstream file (``image/wires`` (N, 1, 3 x rows, columns) int32, gzip, ten events per
chunk as the real files, each pixel's charge as integer ADC in the first tick of its
group; ``label/type`` counts) and as a larcv3 file written by larcv (sparse2d, one
particle per event). Each converter then runs ``--repeats`` times into a fresh store;
the JSON gives every run's wall time and the median rate. Both stores hold the same
pixels and labels (checked); the upstream one is zero-padded to 3600 x 3600 as that
converter always does, so its rate includes reading the dense layout it is given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from lartpc.cliparse import check_positive, check_seed, geometry_of

#: upstream label/type columns (lartpc.data.convert.UPSTREAM_PARTICLES) of each PDG
_COLUMN_OF_PDG = {11: 0, -11: 1, 211: 4, -13: 7, 321: 8, 22: 9}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=200, help="events (default 200)")
    p.add_argument("--downsample", type=int, default=9,
                   help="image of the generated events (default 9: 400 x 400)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each converter (default 3)")
    p.add_argument("--seed", type=int, default=0)


def _write_upstream(path, events, rows: int, cols: int) -> None:
    import h5py
    import numpy as np

    n = len(events)
    with h5py.File(path, "w") as f:
        w = f.create_dataset("image/wires", (n, 1, 3 * rows, cols), np.int32,
                             chunks=(min(10, n), 1, 3 * rows, cols), compression="gzip")
        lab = np.zeros((n, 10), np.int32)
        for b0 in range(0, n, 10):
            block = np.zeros((min(10, n - b0), 1, 3 * rows, cols), np.int32)
            for j, ev in enumerate(events[b0:b0 + 10]):
                block[j, 0, 3 * ev.row.astype(np.int64), ev.col] = _adc(ev.charge)
                lab[b0 + j, _COLUMN_OF_PDG[int(ev.truth["pdg"])]] = 1
            w[b0:b0 + len(block)] = block
        f["label/type"] = lab


def _adc(charge):
    import numpy as np

    return np.maximum(np.rint(charge * 10), 1).astype(np.int32)


def run(args: argparse.Namespace) -> int:
    check_positive(args.events, "--events")
    check_positive(args.repeats, "--repeats")
    check_seed(args.seed)
    geometry_of(args.downsample)
    import os  # after the options' check: a bad one is one line at once
    import platform
    import shutil
    import tempfile
    from pathlib import Path

    import numpy as np

    from lartpc.data import EventStore
    from lartpc.data.convert import convert
    from lartpc.data.larcv3 import convert_larcv3, export, require_larcv
    from lartpc.sim import write_dataset

    require_larcv()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        write_dataset(d / "sim", args.events, seed=args.seed, downsample=args.downsample,
                      shard_size=args.events, workers=1)
        store = EventStore(d / "sim")
        events = store.read_many(range(len(store)))
        rows, cols = store.geometry.shape
        _write_upstream(d / "upstream.h5", events, rows, cols)
        export(d / "sim", d / "events.larcv.h5")
        times: dict[str, list[float]] = {"upstream": [], "larcv3": []}
        for _ in range(args.repeats):
            for kind in times:
                out = d / f"out-{kind}"
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.perf_counter()
                if kind == "upstream":
                    res = convert([d / "upstream.h5"], out)
                else:
                    res = convert_larcv3([d / "events.larcv.h5"], out)
                times[kind].append(time.perf_counter() - t0)
                assert res.converted == len(events), (kind, res.converted)
        # the same events: pixels (the upstream charge is the ADC of each pixel) and labels
        up, lc = EventStore(d / "out-upstream"), EventStore(d / "out-larcv3")
        same = bool(np.array_equal(up.labels, lc.labels))
        for a, b, ev in zip(up.read_many(range(len(up))), lc.read_many(range(len(lc))),
                            events, strict=True):
            ka, kb = np.lexsort((a.col, a.row)), np.lexsort((b.col, b.row))
            same &= bool(np.array_equal(a.row[ka], b.row[kb])
                         and np.array_equal(a.col[ka], b.col[kb])
                         and np.array_equal(a.charge[ka], _adc(b.charge[kb]).astype(np.float32))
                         and np.array_equal(b.charge, ev.charge))
        sizes = {"upstream": (d / "upstream.h5").stat().st_size,
                 "larcv3": (d / "events.larcv.h5").stat().st_size}
    out = {"benchmark": "convert", "events": len(events), "image": [rows, cols],
           "repeats": args.repeats, "cpus": os.cpu_count(), "machine": platform.machine(),
           "same_pixels_and_labels": same}
    for kind, ts in times.items():
        med = statistics.median(ts)
        out[kind] = {"wall_s": [round(t, 3) for t in ts], "median_wall_s": round(med, 3),
                     "events_per_s": round(len(events) / med, 1),
                     "input_bytes": sizes[kind]}
    out["larcv3_over_upstream"] = round(out["larcv3"]["events_per_s"]
                                        / out["upstream"]["events_per_s"], 2)
    print(json.dumps(out))
    return 0
