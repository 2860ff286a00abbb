"""A run's shard plan from its config and store, checked before run.json is written
(the split and shards themselves: :mod:`lartpc.data.sharding`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lartpc.config import Config
from lartpc.data.sharding import ShardPlan
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError


def plan_run(cfg: Config, store: EventStore, world_size: int) -> ShardPlan:
    """The run's split and shards; cheap, so it is checked before run.json is written.

    Raises
    ------
    ConfigError
        When ``data.max_events``, ``data.eval_fraction`` and the store leave no
        evaluation event (eval.csv would report loss and accuracy 0 over nothing), or
        ``train.batch_per_rank`` exceeds every rank's training events.
    LartpcError
        When there are fewer training events than ranks.
    """
    n = min(len(store), cfg.data.max_events) if cfg.data.max_events else len(store)
    plan = ShardPlan(n, world_size, cfg.train.batch_per_rank, cfg.train.seed,
                     cfg.data.eval_fraction, store.labels[:n], cfg.data.test_fraction)
    if len(plan.eval) == 0:
        counts = np.bincount(np.asarray(store.labels[:n]), minlength=1)
        per_class = ", ".join(str(int(c)) for c in counts if c)
        raise ConfigError(f"{n} events (data.max_events={cfg.data.max_events}, store "
                          f"{len(store)}) with data.eval_fraction={cfg.data.eval_fraction} "
                          "leave no evaluation event: the split is taken per class "
                          f"(round(fraction x events of the class); classes hold {per_class}"
                          "); use more events or a larger fraction")
    most = max(len(plan.train_indices(r)) for r in range(world_size))
    if cfg.train.batch_per_rank > most:
        # the loaders hold one batch of full images: a batch no shard can fill only
        # allocates memory (1e9 events asked for 582 TiB)
        raise ConfigError(f"train.batch_per_rank = {cfg.train.batch_per_rank}: more than the "
                          f"{most} training events of a rank ({n} events, {world_size} "
                          f"rank(s)); at most {most}")
    return plan


def check_store_fits(cfg: Config, store: EventStore, data: Path) -> None:
    """Refuse a store the config cannot train on (its downsample factor differs)."""
    if store.geometry.downsample != cfg.data.downsample:
        raise ConfigError(f"{data}: events are downsampled by {store.geometry.downsample} "
                          f"but the config says data.downsample={cfg.data.downsample}")
