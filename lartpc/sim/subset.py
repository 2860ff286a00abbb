"""Some events of a generated dataset, by index, without the rest.

Event ``i`` of seed ``S`` depends on ``(S, i)`` only (:mod:`lartpc.sim.generate`), so a
run's held-out events can be made again alone (1,500 events instead of the 46,500 of
its store) and scored, event for event, as the run scored them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lartpc.cliparse import check_positive, geometry_of
from lartpc.data.staging import existing_shards, replace_store
from lartpc.data.store import SHARD_PATTERN
from lartpc.errors import LartpcError
from lartpc.sim import versions
from lartpc.sim.generate import (
    MOMENTUM_GEV,
    check_source_geometry,
    parse_classes,
    write_event_shard,
)
from lartpc.sim.readout import ReadoutConfig


def write_events(out_dir: str | os.PathLike, indices: Sequence[int], *, seed: int,
                 source_geometry: str, downsample: int = 1,
                 classes: Sequence[str] | str | None = None,
                 momentum_gev: Sequence[float] = MOMENTUM_GEV, dead_wire_fraction: float = 0.0,
                 workers: int = 1, shard_size: int = 500,
                 overwrite: bool = False, physics: str | None = None) -> list[Path]:
    """Generate events ``indices`` of dataset ``seed`` (made with ``classes``,
    ``momentum_gev``, ``dead_wire_fraction`` and the generator's ``physics`` version:
    ``lartpc simulate``'s options, its defaults by default) into a store at ``out_dir``,
    in the order given; each event's ``event_id`` is its index in the full dataset.

    Raises
    ------
    LartpcError
        On no index, a negative one, or a bad geometry, downsample or worker count;
        ``out_dir`` is left as it was (the store is staged and moved in when complete).
    """
    classes = parse_classes(classes)
    check_source_geometry(source_geometry)
    name = versions.physics(physics).name
    idx = np.asarray(indices, np.int64)
    if idx.ndim != 1 or len(idx) == 0 or int(idx.min()) < 0:
        raise LartpcError("events to generate: need one index or more, none negative")
    check_positive(workers, "--workers")
    geometry = geometry_of(downsample)
    out = Path(os.path.abspath(out_dir))  # names the new folder after the swap, as "." not
    with replace_store(out, overwrite) as stage:
        readout = ReadoutConfig(dead_wire_fraction=float(dead_wire_fraction)) \
            if dead_wire_fraction else None
        jobs = [(stage / SHARD_PATTERN.format(j), idx[a:a + shard_size], int(seed), geometry,
                 classes, tuple(momentum_gev), source_geometry, readout, name)
                for j, a in enumerate(range(0, len(idx), shard_size))]
        if int(workers) == 1 or len(jobs) == 1:
            list(map(write_event_shard, jobs))
        else:
            with mp.get_context("spawn").Pool(min(int(workers), len(jobs))) as pool:
                pool.map(write_event_shard, jobs)
    return existing_shards(out)
