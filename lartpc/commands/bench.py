"""``lartpc bench KIND``: benchmarks that print one JSON object on stdout.

Each module below provides ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported only when its kind is chosen.
"""

KINDS: dict[str, tuple[str, str]] = {
    "simulate": ("lartpc.sim.bench", "event generation rate at full resolution"),
    "loader": ("lartpc.data.bench", "data loading time and batch assembly rate"),
    "model": ("lartpc.models.bench", "forward / forward+backward time of one model"),
    "train": ("lartpc.bench_train", "short trainings at several rank counts"),
    "minibatch": ("lartpc.bench_minibatch", "throughput and time-to-loss vs minibatch size"),
}
