"""What a run folder says about its past, checked before a training continues it.

A run is trained in *segments* (one per job: requeued, preempted, resumed). Before a
segment starts, :func:`load_resume` decides between a fresh start, a restart from
step 0 (``run.json`` but no checkpoint: killed early or failed in set-up) and a
resume, refusing a resume that would change what the run means: another store,
another model or minibatch, another world size, or rank logs that lost rows (or that
cannot be read).
:meth:`lartpc.runfolder.folder.RunFolder.begin_segment` then records the segment in
``run.json``, and every rank builds its trainer and sinks from one :class:`Segment`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lartpc.config import Config
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError
from lartpc.runfolder import tables
from lartpc.runfolder.record import flat, record_path
from lartpc.train import checkpoint

if TYPE_CHECKING:
    from lartpc.data.sharding import ShardPlan
    from lartpc.dist import World

log = logging.getLogger(__name__)
# Changing these on resume would change what the run means.
FIXED_ON_RESUME = ("model", "data.downsample", "data.eval_fraction", "data.test_fraction",
                   "data.max_events",
                   "train.batch_per_rank", "train.seed", "train.optimizer")
# ... except these: the same function computed another way (and absent from older runs)
FREE_ON_RESUME = ("model.stem", "model.stage2", "model.sparse", "model.stem_kernel",
                  "model.stage2_kernel", "model.stem_skip_empty")
# ... and these read as their value in checkpoints from before they existed
ABSENT_MEANS = {"data.test_fraction": 0.0}


@dataclass(frozen=True, slots=True)
class Segment:
    """One job's part of a run, as every rank trains it."""

    cfg: Config
    store: EventStore
    plan: ShardPlan  #: the split and this world's shards (:func:`lartpc.train.plan.plan_run`)
    world: World
    run: Path  #: the run folder
    process_start: float  #: ``time.time()`` when the process started (time limits)
    resume: dict | None = None  #: the checkpoint it continues (:func:`load_resume`); None: step 0
    store_id: dict | None = None  #: :func:`store_identity`, saved in checkpoints


def store_identity(store: EventStore, max_events: int) -> dict:
    """Event count and a hash of the used events' labels and pixel counts.

    Cheap (both are read when the store opens) and it changes when events are added,
    removed, reordered or regenerated.
    """
    n = min(len(store), max_events) if max_events else len(store)
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(store.labels[:n], dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(store.pixel_counts()[:n], dtype=np.int64).tobytes())
    return {"events": int(n), "sha256": h.hexdigest()}


def load_resume(cfg: Config, store: EventStore, out: Path, world_size: int) -> dict | None:
    """The checkpoint to resume, checked against this job (None: start at step 0).

    Every rank calls this on the same files, so every rank reaches the same verdict.
    """
    resume = checkpoint.load(out)
    if resume is None:
        if record_path(out).exists():
            log.warning("%s: run.json but no checkpoint.pt: restarting the run from step 0",
                        out)
        return None
    saved, now = {**ABSENT_MEANS, **flat(resume["config"])}, flat(cfg.to_dict())
    for key in FIXED_ON_RESUME:
        a = {k: v for k, v in saved.items() if k == key or k.startswith(key + ".")}
        b = {k: v for k, v in now.items() if k == key or k.startswith(key + ".")}
        for k in sorted((set(a) | set(b)) - set(FREE_ON_RESUME)):
            if a.get(k) != b.get(k):
                raise ConfigError(f"--out {out}: checkpoint has {k}={a.get(k)!r}, "
                                  f"config says {b.get(k)!r}")
    if resume["world_size"] != world_size:
        raise ConfigError(f"--out {out}: checkpoint was written by {resume['world_size']} "
                          f"ranks, this job has {world_size}")
    _check_store(resume.get("store"), store_identity(store, cfg.data.max_events), out, store)
    for r in range(world_size):  # each rank's rows up to the checkpoint, readable
        tables.kept_rows(tables.rank_csv_path(out, r), resume["global_step"])
    return resume


def _check_store(saved: dict | None, now: dict, out: Path, store: EventStore) -> None:
    if saved is None or saved == now:
        return
    data = Path(store.paths[0]).parent
    raise ConfigError(f"--out {out}: checkpoint.pt was trained on {saved['events']} events "
                      f"(hash {saved['sha256'][:12]}), --data {data} has {now['events']} "
                      f"(hash {now['sha256'][:12]}); resume with the same events or choose "
                      "a new --out")


def is_complete(cfg: Config, resume: dict | None) -> bool:
    """True when the checkpoint already holds every configured epoch."""
    return resume is not None and resume["epoch"] >= cfg.train.epochs


def budget_spent(cfg: Config, resume: dict | None) -> bool:
    """True when the checkpoint's training time has reached ``train.budget_s``."""
    return resume is not None and resume["train_time_s"] >= cfg.train.budget_s
