"""``lartpc bench KIND``: benchmarks that print one JSON object on stdout.

Each module below provides ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported only when its kind is chosen.
"""

KINDS: dict[str, tuple[str, str]] = {
    "simulate": ("lartpc.bench.simulate", "event generation rate at full resolution"),
    "loader": ("lartpc.bench.loader", "data loading time and batch assembly rate"),
    "model": ("lartpc.bench.model", "forward / forward+backward time of one model"),
    "train": ("lartpc.bench.train", "short trainings at several rank counts"),
    "minibatch": ("lartpc.bench.minibatch", "throughput and time-to-loss vs minibatch size"),
    "noise": ("lartpc.bench.noise", "cost of measuring the gradient noise scale per step"),
    "allreduce": ("lartpc.bench.allreduce", "allreduce time vs message size on the job's "
                  "ranks; fits a cluster profile"),
    "convert": ("lartpc.bench.convert", "conversion rate: larcv3 against the upstream "
                "dense-HDF5 converter on the same events"),
}
