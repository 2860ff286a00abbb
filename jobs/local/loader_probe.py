"""How fast the sparse loader hands over SCNet's batches, without a training (issue 36).

    python -m lartpc.jobs.local.loader_probe EVENTS [--device cuda] [--threads 1,2,3]

Two views, on ``EVENTS`` (a store, e.g. ``lartpc simulate --events 700``), minibatch 7,
``model.sparse=torch`` tables built as in training (``data.rulebooks=loader``):

- ``produce``: one batch made in the caller's thread with prefetching off, median of the
  batches after the first ``--warmup``: ``host_ms`` until ``_produce`` returns (on a GPU
  its launches), ``done_ms`` until its tables are built on the device too; without the
  tables, and with them built each way of ``--tables`` (``sparse_torch.TABLES``: ``auto``
  = Triton kernels on a GPU, and for padded tables one replayed CUDA graph, ``triton`` =
  the kernels alone, ``torch`` = torch operations, ``graph`` = the graph's operations,
  eagerly off a GPU), unpadded and padded as a graphed training pads them
  (``_pad_after``: built, then copied padded; ``_pad_in_place``: built padded); and
  ``unpack``: what a batch from a loader process costs the training process's
  interpreter besides its copy (its skeleton unpickled, its views put in place);
  ``table_cache`` and ``table_cache_pad_in_place``: the tables joined from every event's
  own (``data.table_cache``; on a GPU with the batch's one copy), with ``table_cache_start``
  (the seconds and MB of making every event's tables when the loader starts);
- ``threads``: a whole pass of the loader as training iterates it (prefetching on,
  ``prefetch_threads`` = each of ``--threads``, again with the table cache
  (``table_cache``), then ``data.loader_processes`` = each of
  ``--processes`` for each way of ``--process-tables``, their ``tables``), nothing else
  running: batches a second the loader alone sustains, to
  compare with a step's rate, and the CPU time its threads take in the training process
  per batch (``own_cpu_ms_per_batch``: what the step's thread competes with).

Prints one JSON object. On a GPU the first view showed the loader's thread at 2.9 ms a
batch with the torch operations against a graphed step's 1.7 ms (BENCHMARKS.md,
2026-11-28); the passes use the first of ``--tables``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import time

import numpy as np
import torch

from lartpc.data.loaders import build_loader
from lartpc.data.packing import pack, unpack
from lartpc.data.store import EventStore
from lartpc.models import build, sparse_torch


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _loader(store, builder, device: str, **prefetch):
    """The sparse loader over the whole store as training builds it (minibatch 7)."""
    return build_loader(store, "sparse", np.arange(len(store)), 7, device=device, seed=1,
                        rulebooks=builder, **prefetch)


def produce_times(store, builder, device: str, batches: int, warmup: int) -> dict:
    """Median ms to make one batch in this thread, prefetching off."""
    loader = _loader(store, builder, device, prefetch_depth=0)
    times = []
    for positions in loader._batches(0)[:batches]:
        _sync(device)
        t0 = time.perf_counter()
        item = loader._produce(positions, 0)
        t1 = time.perf_counter()
        if hasattr(item, "done"):  # on a GPU: its tables built on the loader's stream
            item.done.synchronize()
        times.append((t1 - t0, time.perf_counter() - t0))
    t = np.array(times[warmup:]) * 1e3
    return {"batches": len(t), "host_ms": float(np.median(t[:, 0])),
            "done_ms": float(np.median(t[:, 1]))}


def unpack_times(store, builder, repeats: int = 200) -> dict:
    """Median microseconds the training process spends on one batch from a loader
    process besides its copy: unpickling the skeleton the process sends
    (``loads_us``) and putting the views of the copied buffer back in their places
    (``unpack_us``), here on a batch packed in this process, caches warm."""
    loader = _loader(store, builder, "cpu", prefetch_depth=0)
    positions = loader._batches(0)[0]
    buffer, skeleton = pack(loader._made_elsewhere(positions, None))
    sent = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
    loads, unpacks = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pickle.loads(sent)
        t1 = time.perf_counter()
        unpack(buffer, skeleton)
        loads.append(t1 - t0)
        unpacks.append(time.perf_counter() - t1)
    return {"repeats": repeats, "skeleton_bytes": len(sent),
            "loads_us": float(np.median(loads) * 1e6),
            "unpack_us": float(np.median(unpacks) * 1e6)}


def _cpu_s() -> float:
    """CPU seconds this process (every thread of it, not its children) has used."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def pass_rate(store, builder, device: str, threads: int = 1, processes: int = 0,
              warm: bool = True) -> dict:
    """Batches a second over one pass of the loader as training iterates it, and the CPU
    time the loading costs the training process itself per batch (its threads'; with
    loader processes, theirs is not counted: it is spent outside the interpreter the
    step runs in). With ``warm`` the timed pass is the second: the first pays each
    thread's or process's first touch of its index image and slot (in a pass of 100
    batches over 8 processes that was most of the time, H200 host, 2026-11-28), which a
    training pays once."""
    loader = _loader(store, builder, device, prefetch_depth=2, prefetch_threads=threads,
                     processes=processes)
    try:
        if warm:
            for _ in loader:
                pass
            loader.set_epoch(1)  # another order: as a training's next epoch
        _sync(device)
        t0, c0 = time.perf_counter(), _cpu_s()
        n = sum(1 for _ in loader)
        _sync(device)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - c0
    finally:
        loader.close()
    return {"threads": threads, "processes": processes, "warm": warm, "batches": n,
            "seconds": seconds, "batches_per_s": n / seconds, "images_per_s": 7 * n / seconds,
            "own_cpu_ms_per_batch": 1e3 * cpu / n}


def capacities(store, builder, device: str, batches: int) -> tuple[int, ...]:
    """A graphed training's padded sizes for the first ``batches`` batches: the rounded
    sizes of the largest of their tables."""
    from lartpc.train.padding import Capacities

    loader = _loader(store, None, device, prefetch_depth=0)
    caps = Capacities()
    for positions in loader._batches(0)[:batches]:
        coords, _ = loader._coords(positions)
        caps.fit(sparse_torch.sizes(builder(coords.to(device), len(positions))))
    return caps.rows


def padded_builders(builder, rows: tuple[int, ...]) -> dict:
    """The two ways a graphed training's loader pads the tables to its capacities
    ``rows``: built unpadded then copied padded (``sparse_torch.pad_maps``, the loader's
    way until 2026-11-28), and built padded in place (``build_maps(rows=...)``, its way
    since)."""
    return {"pad_after": lambda c, n: sparse_torch.pad_maps(builder(c, n), rows),
            "pad_in_place": lambda c, n: builder(c, n, rows=rows)}


def _at(rows: tuple[int, ...]):
    """Capacities set to ``rows`` (what a graphed training's loader pads to)."""
    from lartpc.train.padding import Capacities

    caps = Capacities()
    caps.rows = rows
    return caps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.loader_probe",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("events", help="event store (folder of events-*.h5)")
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--threads", default="1,2,3", help="prefetch_threads to pass over")
    ap.add_argument("--processes", default="2,4,8",
                    help="data.loader_processes to pass over (the tables on the CPU)")
    ap.add_argument("--batches", type=int, default=60, help="batches timed one by one")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tables", default="auto,torch",
                    help="ways of building the tables to time (sparse_torch.TABLES)")
    ap.add_argument("--process-tables", default="auto,torch",
                    help="ways the loader processes build the tables, each passed over "
                         "(auto: compiled by numba; torch: torch operations)")
    args = ap.parse_args(argv)
    store = EventStore(args.events)
    model = build("scnet", image_size=store.geometry.shape, sparse="torch").to(args.device)
    builder = model.rulebook_builder(training=True)
    ways = args.tables.split(",")
    produce = {"no_tables": produce_times(store, None, args.device, args.batches,
                                          args.warmup)}
    rows = capacities(store, builder, args.device, args.batches)  # the same either way
    before = sparse_torch.TABLES
    try:
        for way in reversed(ways):  # the first last: the passes below build that way
            sparse_torch.TABLES = way
            produce[f"tables_{way}"] = produce_times(store, builder, args.device,
                                                     args.batches, args.warmup)
            for name, padded in padded_builders(builder, rows).items():
                produce[f"tables_{way}_{name}"] = produce_times(
                    store, padded, args.device, args.batches, args.warmup)
        produce["unpack"] = unpack_times(store, builder)  # a process's batch, as sent
        sparse_torch.TABLES = before  # the cache's own start-up builds as training does
        cached = model.rulebook_builder(training=True, cache=True)
        produce["table_cache"] = produce_times(store, cached, args.device, args.batches,
                                               args.warmup)
        produce["table_cache_start"] = {"seconds": cached.cache.seconds,
                                        "mb": cached.cache.nbytes / 1e6}
        produce["table_cache_pad_in_place"] = produce_times(
            store, _at(rows).padding(cached), args.device, args.batches, args.warmup)
        sparse_torch.TABLES = ways[0]
        passes = [pass_rate(store, builder, args.device, threads=int(t))
                  for t in args.threads.split(",")]
        passes += [{**pass_rate(store, cached, args.device, threads=int(t)), "table_cache": True}
                   for t in args.threads.split(",")]
        for way in args.process_tables.split(","):  # the processes build on the CPU
            sparse_torch.TABLES = way
            passes += [{**pass_rate(store, builder, args.device, processes=int(p)),
                        "tables": way} for p in args.processes.split(",") if int(p) > 0]
    finally:
        sparse_torch.TABLES = before
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "events": len(store), "shape": list(store.geometry.shape), "produce": produce,
           "threads_tables": ways[0], "threads": passes}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
