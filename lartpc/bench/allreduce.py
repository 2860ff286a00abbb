"""``lartpc bench allreduce``: allreduce time against message size on this job's ranks, the
latency and bandwidth of the ring-allreduce model fitted to it, and a cluster profile
that ``lartpc analyze predict --cluster-file FILE`` takes.

Run it as a job step over the allocation's ranks, as training runs: ``srun lartpc bench
allreduce`` (plain srun: torch.distributed from SLURM's variables, the first node of the
step as MASTER_ADDR), ``torchrun ... -m lartpc bench allreduce`` or under horovodrun /
``srun --mpi=pmix`` (Horovod); :func:`lartpc.dist.init` picks the backend, Gloo on CPU
and NCCL on GPU.

For each message size (float32 tensors, ``--min-bytes`` to ``--max-bytes`` by
``--factor``) every rank runs ``--warmup`` untimed allreduces, then up to ``--repeats``
timed ones (fewer, at least 3, where they would take more than ``--seconds-per-size``).
A repeat's time is the slowest rank's; the median over repeats, the quartiles and the
extremes are reported. The model is the one ``analysis/profiles.py`` gives the prediction::

    t(bytes) = 2 (N-1) alpha + 2 (N-1)/N bytes / beta

fitted by least squares on the medians with each squared residual divided by its median
(a time's variance taken as proportional to the time): between absolute residuals, which
leave the latency to the noise of the largest messages, and relative ones, which on a
busy host let a few delayed small messages set the bandwidth. Rank 0 prints one JSON object
and, with ``--out FILE``, writes the profile there (a new file: one that exists is
replaced only with ``--overwrite``): an entry of analysis/clusters.json
with the fitted link as ``*_inter`` when the ranks span nodes (``*_intra`` when they
share one; the other link is set to the same values and says so) and a ``measured``
block (date, hosts, world size, sizes, medians).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from lartpc.config import choices
from lartpc.errors import LartpcError

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3}
MIN_REPEATS = 3
_ONE_RANK = ("allreduce needs 2 or more ranks: start it as a job step (srun -N2 lartpc bench "
             "allreduce), under torchrun or horovodrun")


def parse_bytes(text: str, option: str) -> int:
    """``"64MiB"`` -> 67108864 (K, M, G are powers of 1024); a whole number of float32s."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise LartpcError(f"{option} {text!r}: expected bytes such as 4, 64KiB or 64MiB")
    n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if n < 4 or n % 4:
        raise LartpcError(f"{option} {text!r}: expected a multiple of 4 bytes (float32), >= 4")
    return n


def message_sizes(lo: int, hi: int, factor: int) -> list[int]:
    """lo, lo*factor, ... up to hi (hi itself last when the steps miss it)."""
    sizes = [lo]
    while sizes[-1] * factor <= hi:
        sizes.append(sizes[-1] * factor)
    if sizes[-1] != hi:
        sizes.append(hi)
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-bytes", default="4", help="smallest message (K, M, G: 1024^k)")
    parser.add_argument("--max-bytes", default="64MiB", help="largest message")
    parser.add_argument("--factor", type=int, default=4, choices=(2, 4),
                        help="ratio of one message size to the next")
    parser.add_argument("--warmup", type=int, default=3, help="untimed allreduces per size")
    parser.add_argument("--repeats", type=int, default=20, help="most timed allreduces per size")
    parser.add_argument("--seconds-per-size", type=float, default=5.0,
                        help=f"fewer repeats (at least {MIN_REPEATS}) where they would take "
                             "longer, judged by the slowest warm-up")
    parser.add_argument("--out", type=Path, help="cluster profile JSON for `lartpc analyze "
                        "predict --cluster-file` (written by rank 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out file (refused otherwise)")
    parser.add_argument("--name", default="measured", help="the profile's name")
    parser.add_argument("--backend", default="auto",
                        choices=choices("dist.backend", without=("none",)),
                        help="distributed backend (auto: from the launcher's environment)")
    parser.add_argument("--device", default="auto", choices=choices("train.device"))
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="a rank that stops answering fails the others after this long")


def fit_ring(world_size: int, sizes: list[int], seconds: list[float]) -> dict:
    """alpha (s) and beta (bytes/s) of t = 2 (N-1) alpha + 2 (N-1)/N bytes / beta, by
    least squares with each squared residual divided by its time; alpha is held at 0
    where the free fit would make it negative. ``rel_rms``: the root-mean-square
    relative residual."""
    n = world_size
    if n < 2:
        raise LartpcError("allreduce needs 2 or more ranks to fit (start the command under "
                          "srun, torchrun or horovodrun)")
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(x) < 2 or len(set(sizes)) < 2 or not np.all(t > 0):
        raise LartpcError("the fit needs positive times at two or more message sizes")
    lat, bw = 2.0 * (n - 1), 2.0 * (n - 1) / n  # t = lat * alpha + bw * bytes * (1 / beta)
    w = 1.0 / np.sqrt(t)
    design = np.column_stack([np.full_like(x, lat), bw * x]) * w[:, None]
    (a, inv_b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if a < 0:  # latency not resolved: bandwidth alone, through the origin
        a = 0.0
        col = bw * x * w
        inv_b = float(col @ (t * w) / (col @ col))
    if not inv_b > 0:
        raise LartpcError("the allreduce time does not grow with the message size: no "
                          "bandwidth to fit (raise --max-bytes)")
    model = lat * a + bw * x * inv_b
    return {"alpha_s": float(a), "beta_Bps": float(1.0 / inv_b),
            "rel_rms": float(np.sqrt(np.mean((model / t - 1.0) ** 2)))}


def _sig(xs) -> list[float]:
    """Six significant digits (timer resolution is far coarser than float's)."""
    return [float(f"{x:.6g}") for x in xs]


def _quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


def summarise(world_size: int, sizes: list[int], per_rank: list[list[list[float]]]) -> dict:
    """Per size: each repeat's slowest rank, then median, quartiles, extremes, and the
    bus bandwidth 2 (N-1)/N bytes / median; and the ring fit on the medians.
    ``per_rank[r][i]`` holds rank r's times of size i."""
    slowest = [[max(rep) for rep in zip(*(ranks[i] for ranks in per_rank), strict=True)]
               for i in range(len(sizes))]
    med = [statistics.median(s) for s in slowest]
    fit = fit_ring(world_size, sizes, med)
    share = 2.0 * (world_size - 1) / world_size
    return {
        "sizes_bytes": sizes,
        "repeats": [len(s) for s in slowest],
        "median_s": _sig(med),
        "p25_s": _sig(_quantile(s, 0.25) for s in slowest),
        "p75_s": _sig(_quantile(s, 0.75) for s in slowest),
        "min_s": _sig(min(s) for s in slowest),
        "max_s": _sig(max(s) for s in slowest),
        "bus_GBps": _sig(share * b / m / 1e9 for b, m in zip(sizes, med, strict=True)),
        "fit": {"alpha_us": round(fit["alpha_s"] * 1e6, 3),
                "beta_GBps": _sig([fit["beta_Bps"] / 1e9])[0],
                "beta_Mbitps": round(fit["beta_Bps"] * 8 / 1e6, 2),
                "rel_rms_residual": round(fit["rel_rms"], 4),
                "model": "t = 2 (N-1) alpha + 2 (N-1)/N bytes / beta (analysis/profiles.py, "
                         "ring); least squares on the medians, each squared residual divided "
                         "by the median"},
    }


def profile(name: str, summary: dict, hosts: list[str], world_size: int, ranks_per_node: int,
            backend: str, device: str, command: list[str], date: str | None = None) -> dict:
    """The cluster profile (an entry of analysis/clusters.json) for a summary."""
    date = date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    nodes = len(set(hosts))
    link, other = ("inter", "intra") if nodes > 1 else ("intra", "inter")
    fit = summary["fit"]
    alpha, beta = fit["alpha_us"], fit["beta_GBps"]
    where = f"{world_size} ranks on {nodes} node(s) ({', '.join(sorted(set(hosts)))})"
    return {
        "name": name,
        "gpu": device,
        "gpus_per_node": ranks_per_node,
        "alpha_intra_us": alpha, "beta_intra_GBps": beta,
        "alpha_inter_us": alpha, "beta_inter_GBps": beta,
        "compute": "runs",
        "sources": [
            f"alpha_{link}, beta_{link}: measured by `lartpc bench allreduce` on {where}, "
            f"{backend} backend, {date}: ring-allreduce fit to the median times",
            f"alpha_{other}, beta_{other}: not measured (the ranks "
            f"{'span nodes' if nodes > 1 else 'share one node'}); set to the measured link",
            "compute and data time per step: measured in the run folders given"],
        "measured": {
            "date": date, "command": command, "hosts": hosts, "nodes": nodes,
            "world_size": world_size, "ranks_per_node": ranks_per_node, "backend": backend,
            "device": device, "link": link, **summary},
    }


def _time_sizes(world, sizes: list[int], args) -> list[list[float]]:
    """This rank's timed allreduce seconds, per size."""
    import torch

    def sync():
        if world.device.type == "cuda":
            torch.cuda.synchronize(world.device)

    out = []
    for nbytes in sizes:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=world.device)  # sums stay 0
        warm = 0.0
        for _ in range(args.warmup):
            t0 = time.perf_counter()
            world.allreduce_sum_(buf)
            sync()
            warm = time.perf_counter() - t0
        # every rank must time as many repeats: decide on the slowest rank's warm-up
        slowest = max(world.allgather_object(warm))
        reps = args.repeats if slowest <= 0 else \
            max(MIN_REPEATS, min(args.repeats, math.floor(args.seconds_per_size / slowest)))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            world.allreduce_sum_(buf)
            sync()
            times.append(time.perf_counter() - t0)
        out.append(times)
    return out


def _check(args) -> list[int]:
    lo, hi = parse_bytes(args.min_bytes, "--min-bytes"), parse_bytes(args.max_bytes,
                                                                     "--max-bytes")
    if hi <= lo:
        raise LartpcError(f"--max-bytes {args.max_bytes}: must exceed --min-bytes "
                          f"{args.min_bytes}")
    if args.warmup < 1:
        raise LartpcError(f"--warmup {args.warmup}: expected >= 1")
    if args.repeats < MIN_REPEATS:
        raise LartpcError(f"--repeats {args.repeats}: expected >= {MIN_REPEATS}")
    for opt, v in (("--seconds-per-size", args.seconds_per_size),
                   ("--timeout-s", args.timeout_s)):
        if not (math.isfinite(v) and v > 0):
            raise LartpcError(f"{opt} {v}: expected a positive number of seconds")
    if not args.name.strip():
        raise LartpcError("--name: empty")
    return message_sizes(lo, hi, args.factor)


def _out_problem(out: Path | None, overwrite: bool = False) -> str | None:
    if out is None:
        return None
    if out.is_dir():
        return f"--out {out}: is a folder; give a file name"
    if not out.parent.is_dir():
        return f"--out {out}: folder {out.parent} does not exist"
    if os.path.lexists(out) and not overwrite:  # a link there too: never written through
        return f"--out {out}: exists; choose a new file, or --overwrite to replace it"
    return None


def run(args: argparse.Namespace) -> int:
    sizes = _check(args)  # before torch (lartpc.dist imports it): a bad option at once
    from lartpc.dist import detect_backend, init
    from lartpc.fsutil import atomic_write, output_file

    if args.out is not None:  # a link the user made to the folder: followed here only
        args.out = output_file(args.out)
    if args.backend == "auto" and detect_backend() == "none":
        raise LartpcError(_ONE_RANK)
    world = init(args.backend, args.device, timeout_s=args.timeout_s)
    try:
        if world.size < 2:
            raise LartpcError(_ONE_RANK)
        # rank 0 writes: it decides for everyone whether --out will do, before any timing
        problem = world.broadcast_object(_out_problem(args.out, args.overwrite)
                                         if world.is_root else None)
        if problem:
            raise LartpcError(problem)
        hosts = world.allgather_object(socket.gethostname())
        times = _time_sizes(world, sizes, args)
        per_rank = world.allgather_object(times)
        if not world.is_root:
            return 0
        import torch

        device = (torch.cuda.get_device_name(world.device) if world.device.type == "cuda"
                  else "CPU") + f" ({world.backend} backend)"
        summary = summarise(world.size, sizes, per_rank)
        ranks_per_node = max(hosts.count(h) for h in hosts)
        prof = profile(args.name, summary, hosts, world.size, ranks_per_node, world.backend,
                       device, ["lartpc", *sys.argv[1:]])
        if args.out is not None:
            atomic_write(args.out, json.dumps(prof, indent=2) + "\n")
        json.dump({**prof, "out": str(args.out) if args.out else None}, sys.stdout, indent=2)
        print()
        return 0
    finally:
        world.shutdown()
