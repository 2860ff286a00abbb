"""Two versions of SCNet's torch layers, timed against each other in one process.

    git show REV:lartpc/models/sparse_torch.py > before.py
    python -m lartpc.jobs.local.sparse_ab --before before.py --data EV --repeats 40

A change to :mod:`lartpc.models.sparse_torch` is measured by the sparse trunk's forward
and backward (four convolutions and pools, the dense map, a squared-sum loss) on the
same 7 events of ``--data`` with each version's tables built once, ahead, the two
versions' steps interleaved (ABAB...) so that what else the machine does lands on
both alike; and by the building of those tables (:func:`build_maps`, what the loader's
thread does per batch), interleaved the same way. Prints JSON: each version's median
and quartile step in ms, the largest weight-gradient difference between them relative
to the gradient's scale (0.0: the same numbers), and under ``tables`` each version's
median build time, its count of torch operations and of those that compute (on a GPU,
about its launches) and whether the two built the same tables. One thread, as in the
training loop's ranks; both versions build with torch operations (``--tables``, since a
CPU's default is the numba-compiled way, which neither version's operations touch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from lartpc.jobs.local.host_profile import main_thread_work

from lartpc.bench.model import batch_from_events
from lartpc.data.batch import Batch
from lartpc.data.store import EventStore
from lartpc.errors import LartpcError
from lartpc.models import sparse_torch
from lartpc.models.scnet import CHANNELS, KERNEL, POOLS


def load_module(path: Path):
    """``path`` (a sparse_torch.py of another revision) as a module of its own."""
    name = f"sparse_torch_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise LartpcError(f"--before {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def batch(data: Path, size: int) -> Batch:
    """A sparse batch of the first ``size`` events of the store ``data``."""
    store = EventStore(data)
    events = store.read_many(range(min(size, len(store))))
    return batch_from_events(events, tuple(store.geometry.shape), "sparse")


def step(module, maps, features, weights) -> list[torch.Tensor]:
    """One forward and backward of the trunk; the weight gradients."""
    for w in weights:
        w.grad = None
    x = torch.index_select(features, 0, maps.order)
    for w, level in zip(weights, maps.levels, strict=False):
        built = getattr(level, "mirrored", None)  # a table built ahead, where a version has it
        x = torch.nn.functional.elu(module.subm_conv(x, level.neighbours, w,
                                                     *([] if built is None else [built])))
        x = module.max_pool(x, level.slots, level.n_out)
    out = module.to_dense(x, maps.dense_index, maps.batch_size, maps.out_shape)
    out.square().sum().backward()
    return [w.grad.clone() for w in weights]


def same_tables(a, b) -> bool:
    """Two versions' :class:`SiteMaps` hold the same sites, neighbours and pool slots."""
    return len(a.levels) == len(b.levels) and torch.equal(a.order, b.order) and all(
        torch.equal(x.keys, y.keys) and torch.equal(x.neighbours, y.neighbours)
        and torch.equal(x.slots, y.slots) and x.n_out == y.n_out
        for x, y in zip(a.levels, b.levels, strict=True))


def operations(fn) -> dict[str, int]:
    """The outermost torch operations one call of ``fn`` makes, and those of them that
    compute (on a GPU about one launch each): host_profile's count of a step's calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    calls, computing = main_thread_work(prof.events(), steps=1)
    return {"operations": int(calls), "computing": int(computing)}


def quartiles(ts: list[float]) -> dict:
    q = statistics.quantiles(ts, n=4)
    return {"median_ms": round(1e3 * statistics.median(ts), 3), "q1_ms": round(1e3 * q[0], 3),
            "q3_ms": round(1e3 * q[2], 3)}


def interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds of each of two calls, ABAB... then BABA...: each call's times."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(repeats):
        for k in (names if i % 2 else names[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return times


def compare(before, after, data: Path, repeats: int, size: int = 7) -> dict:
    b = batch(data, size)
    coords, features, shape, size = b.coords, b.features, b.shape, b.data_size
    generator = torch.Generator().manual_seed(0)
    weights, cin = [], 1
    for cout in CHANNELS:  # spconv's layout (C', k, k, C), a plain Kaiming-like scale
        w = torch.randn(cout, KERNEL, KERNEL, cin, generator=generator)
        weights.append((w / (KERNEL * KERNEL * cin) ** 0.5).requires_grad_())
        cin = cout
    versions = {"before": before, "after": after}
    maps = {k: m.build_maps(coords, size, shape, KERNEL, POOLS) for k, m in versions.items()}
    grads = {k: step(m, maps[k], features, weights) for k, m in versions.items()}
    diff = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))
               for a, b in zip(grads["before"], grads["after"], strict=True))
    times = interleaved({k: (lambda m=m, k=k: step(m, maps[k], features, weights))
                         for k, m in versions.items()}, repeats)
    out = {"image_size": list(shape), "events": size, "sites": len(coords),
           "repeats": repeats, "max_weight_grad_difference": diff}
    for k, ts in times.items():
        out[k] = quartiles(ts)
    out["after_over_before"] = round(out["after"]["median_ms"] / out["before"]["median_ms"], 4)
    builds = {k: (lambda m=m: m.build_maps(coords, size, shape, KERNEL, POOLS))
              for k, m in versions.items()}
    tables = {"same": same_tables(maps["before"], maps["after"])}
    for k, ts in interleaved(builds, repeats).items():
        tables[k] = {**quartiles(ts), **operations(builds[k])}
    tables["after_over_before"] = round(tables["after"]["median_ms"]
                                        / tables["before"]["median_ms"], 4)
    out["tables"] = tables
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True,
                    help="another revision's lartpc/models/sparse_torch.py")
    ap.add_argument("--data", type=Path, required=True, help="an event store")
    ap.add_argument("--repeats", type=int, default=40, help="timed steps of each version")
    ap.add_argument("--tables", default="torch",
                    help="how both versions build their tables (sparse_torch.TABLES; "
                         "default torch: the torch operations, which the versions differ in)")
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error(f"--repeats {args.repeats}: at least 2")
    torch.set_num_threads(1)
    before = sparse_torch.TABLES
    try:
        module = load_module(args.before)
        for m in (module, sparse_torch):
            if hasattr(m, "TABLES"):  # (a version from before the ways of building had one)
                m.TABLES = args.tables
        result = compare(module, sparse_torch, args.data, args.repeats)
    except LartpcError as e:
        print(f"sparse_ab: {e}", file=sys.stderr)
        return 2
    finally:
        sparse_torch.TABLES = before
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
