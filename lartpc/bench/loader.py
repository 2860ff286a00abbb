"""``lartpc bench loader``: data loading time and batch assembly rate of one rank.

Prints one JSON object. ``dlt_s`` is the paper's data loading time (loader construction
start to first batch in hand), ``read_s`` the HDF5 read alone; both are medians over
``--repeats`` fresh loaders (the read is timed on its own, before each loader is
built; ``loader_read_s`` is the same read inside the loader, overlapping buffer setup).
``batch_s`` is the median time to assemble one batch with
prefetching off (so nothing is hidden behind another thread; on CUDA the device is
synchronised after each batch, so the host-to-device copy counts); ``batch_gbps`` the
dense float32 bytes that produces per second per assembling thread (one).
``--augment mirror`` times each batch with the training's mirroring
(:mod:`lartpc.data.augment`) applied after it is assembled. ``--orient start`` builds
the loaders with the start-finding stage (:mod:`lartpc.data.orient`): its one-off cost
is ``orient_s`` (median per loader) and ``orient_ms_per_event``, and it is part of
``dlt_s``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import time

from lartpc.cliparse import add_batch_per_rank, check_positive
from lartpc.config import MAX_THREADS, choices
from lartpc.data import BLOSC_COMPRESS_AT, BLOSC_SHUFFLES, LOADERS
from lartpc.errors import ConfigError, LartpcError

log = logging.getLogger(__name__)

# Per-step assembly runs in one thread (the prefetch thread).
BATCH_THREADS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="event file or folder of events-*.h5")
    p.add_argument("--mode", default="blosc", choices=LOADERS)
    p.add_argument("--ranks", type=int, default=1, help="simulate rank 0 of N (its shard)")
    add_batch_per_rank(p)
    p.add_argument("--repeats", type=int, default=3, help="fresh loaders to time")
    p.add_argument("--steps", type=int, default=20, help="batches timed per loader")
    # --batches: the spelling of the commands recorded before 2026-11-26
    p.add_argument("--batches", dest="steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="torch device of the batches: cpu, cuda "
                   "or cuda:N")
    p.add_argument("--codec", default=None, help="dense: Blosc codec (default: BloscConfig)")
    p.add_argument("--clevel", type=int, default=None, help="dense: Blosc level")
    p.add_argument("--shuffle", default=None, choices=BLOSC_SHUFFLES, help="dense: Blosc "
                   "byte shuffle")
    p.add_argument("--band-rows", type=int, default=None, help="dense: rows per Blosc band")
    p.add_argument("--threads", type=int, default=1,
                   help="dense: Blosc threads per compression call (0 = all cores)")
    p.add_argument("--compress-at", default=None, choices=BLOSC_COMPRESS_AT,
                   help="dense: compress the shard before training (paper) or during epoch 0")
    p.add_argument("--augment", default="none", choices=choices("data.augment"),
                   help="time each batch with this training augmentation applied")
    p.add_argument("--orient", default="none", choices=choices("data.orient"),
                   help="build the loaders with this start-finding stage (data.orient)")


def _blosc_config(args):
    from lartpc.data.blosc_cache import BloscConfig

    kw = {k: v for k, v in (("codec", args.codec), ("clevel", args.clevel),
                            ("shuffle", args.shuffle), ("band_rows", args.band_rows),
                            ("compress_at", args.compress_at))
          if v is not None}
    return BloscConfig(threads=args.threads, **kw)


#: the Blosc settings given on the command line, each checked on its own
_BLOSC_OPTIONS = (("--codec", "codec"), ("--clevel", "clevel"), ("--band-rows", "band_rows"))


def _check_options(args) -> None:
    """Every option a user can get wrong, before torch is imported."""
    from lartpc.data.blosc_cache import BloscConfig

    if args.repeats < 1 or args.steps < 1:
        raise ConfigError(f"--repeats and --batches (--steps) must be >= 1, got --repeats "
                          f"{args.repeats}, --steps {args.steps}")
    check_positive(args.ranks, "--ranks")
    check_positive(args.batch_per_rank, "--batch-per-rank")
    if not 0 <= args.threads <= MAX_THREADS:
        raise LartpcError(f"--threads = {args.threads}: must be in 0..{MAX_THREADS} (0: all "
                          "cores)")
    for option, field in _BLOSC_OPTIONS:
        value = getattr(args, field)
        if value is None:
            continue
        try:
            BloscConfig(**{field: value}).cparams()
        except ConfigError as e:
            raise LartpcError(f"{option}: {e}") from None
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise LartpcError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")


def _check_device(device: str) -> None:
    """A CUDA ``device`` this host has (pinned batches need one)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise LartpcError(f"--device {device}: torch sees no CUDA device")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise LartpcError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA "
                          "device(s)")


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    import torch  # after the options' check: a bad one is one line at once

    from lartpc.data.augment import mirror
    from lartpc.data.loaders import build_loader
    from lartpc.data.sharding import ShardPlan
    from lartpc.data.store import EventStore

    _check_device(args.device)
    store = EventStore(args.data)
    plan = ShardPlan(len(store), args.ranks, args.batch_per_rank, seed=0, eval_fraction=0.0)
    indices = plan.train_indices(0)
    if args.batch_per_rank > len(indices):  # no full batch to time: it would never stop
        raise ConfigError(f"--batch-per-rank {args.batch_per_rank}: more than the "
                          f"{len(indices)} events of rank 0's shard ({len(store)} events in "
                          f"{args.data}, --ranks {args.ranks})")
    blosc = _blosc_config(args) if args.mode == "blosc" else None
    sync = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else (lambda: None)

    def augment(batch, epoch: int):
        return mirror(batch, 0, epoch) if args.augment == "mirror" else batch
    dlts, reads, loader_reads, preps, times, firsts, compress = [], [], [], [], [], [], []
    orients = []
    for rep in range(args.repeats):
        # The HDF5 read alone, from a fresh store, with nothing else running.
        t0 = time.perf_counter()
        EventStore(args.data).read_many(indices)
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loader = build_loader(store, args.mode, indices, args.batch_per_rank, device=args.device,
                              steps_per_epoch=plan.steps_per_epoch, prefetch_depth=0, blosc=blosc,
                              orient=args.orient)
        it = iter(loader)
        first = augment(next(it), 0)
        sync()
        dlts.append(time.perf_counter() - t0)
        loader_reads.append(loader.read_s)
        preps.append(loader.prepare_s)
        orients.append(loader.orient_s)
        del first
        first_epoch = []
        tb = time.perf_counter()
        for b in it:  # finish epoch 0: with lazy compression it also compresses
            b = augment(b, 0)
            sync()
            if b.data_size == args.batch_per_rank:
                first_epoch.append(time.perf_counter() - tb)
            tb = time.perf_counter()
        firsts.extend(first_epoch)
        compress.append(getattr(loader, "compress_s", 0.0))
        epoch = 0
        while len(times) < args.steps * (rep + 1):
            epoch += 1
            loader.set_epoch(epoch)
            tb = time.perf_counter()
            for b in loader:
                b = augment(b, epoch)
                sync()
                # short remainder batches would skew the rate
                if b.data_size == args.batch_per_rank:
                    times.append(time.perf_counter() - tb)
                if len(times) >= args.steps * (rep + 1):
                    break
                tb = time.perf_counter()
        log.info("repeat %d: dlt %.3f s (read %.3f s)", rep, dlts[-1], reads[-1])
    if not times:
        raise ConfigError(f"{args.data}: no full batch of {args.batch_per_rank} events in the "
                          "shard")
    h, w = store.geometry.shape
    dense_event = h * w * 4
    batch_s = statistics.median(times)
    resident = loader.resident_bytes / len(indices)
    out = {
        "mode": args.mode,
        "events": len(indices),
        "store_events": len(store),
        "ranks": args.ranks,
        "batch_per_rank": args.batch_per_rank,
        "augment": args.augment,
        "orient": args.orient,
        "geometry": [h, w],
        "device": str(loader.device),
        "threads": BATCH_THREADS,
        "prepare_threads": blosc.n_threads() if blosc else 1,
        "blosc": ({"codec": blosc.codec, "clevel": blosc.clevel, "shuffle": blosc.shuffle,
                   "band_rows": blosc.band_rows, "compress_at": blosc.compress_at}
                  if blosc else None),
        "dlt_s": statistics.median(dlts),
        "read_s": statistics.median(reads),
        "loader_read_s": statistics.median(loader_reads),
        "prepare_s": statistics.median(preps),
        "compress_s": statistics.median(compress),
        "orient_s": statistics.median(orients),
        "orient_ms_per_event": 1e3 * statistics.median(orients) / len(indices),
        "first_epoch_batch_s": statistics.median(firsts) if firsts else None,
        "dlt_over_read": statistics.median(dlts) / statistics.median(reads),
        "batch_s": batch_s,
        "batches_timed": len(times),
        "batch_gbps": (args.batch_per_rank * dense_event / batch_s / BATCH_THREADS / 1e9
                       if args.mode != "sparse" else None),
        "batch_events_per_s": args.batch_per_rank / batch_s,
        "compression_ratio": dense_event / resident,
        "resident_bytes_per_event": resident,
        "resident_fraction": resident / dense_event,
        "pixels_per_event": float(store.pixel_counts()[indices].mean()),
    }
    out["targets_met"] = {
        "batch_gbps>=2": None if out["batch_gbps"] is None else out["batch_gbps"] >= 2.0,
        "dlt<=1.5*read": out["dlt_over_read"] <= 1.5,
        "resident<=5%": out["resident_fraction"] <= 0.05,
    }
    print(json.dumps(out, indent=1))
    return 0
