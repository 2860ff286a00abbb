"""Train/eval split, per-rank shards and per-epoch batch order.

Rules (the paper's scheme, made exact):

* **Split.** A held-out fraction of the events, chosen by ``seed`` and stratified by
  class, is the evaluation set; the rest is the training set. Pure function of
  (labels, fraction, seed), so every rank computes the same split.
* **Shards.** Rank ``r`` of ``N`` owns a fixed contiguous block of the sorted training
  indices (sizes differ by at most one). As in the paper each rank loads its
  ``n/N`` events once, before training; contiguous blocks keep that read sequential.
* **Epochs.** Each epoch reshuffles *within* every shard with a stream drawn from
  ``(seed, epoch)`` only, so the plan is identical wherever it is computed.
* **Remainder.** Every rank runs ``steps_per_epoch = ceil(max shard / batch)`` steps
  and every training event is seen exactly once per epoch: batches are full except
  the last one; a rank whose shard is one event smaller and a multiple of ``batch``
  would come up one step short, so its last full batch is split in two
  (``batch - 1`` and ``1`` events). ``batch = 1`` with unequal shards has no such
  split and is refused.
* **Evaluation.** The held-out set is split the same way; each event is evaluated
  exactly once, never padded with repeats, so ranks may run different numbers of
  evaluation steps (and may have none): sum the counts, not per-step means.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from lartpc.errors import ConfigError, LartpcError

_SPLIT_STREAM = 0x5EED_E7A1  # keeps the split independent of the epoch streams
_TEST_STREAM = 0x7E57_5EED  # draws the test events, independent of the validation draw


def split_train_eval(n_events: int, eval_fraction: float, seed: int,
                     labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, eval) store indices; eval is ``round(fraction * n_c)`` per class.

    Parameters
    ----------
    n_events : events in the store.
    eval_fraction : held-out fraction in ``[0, 1)``.
    seed : chooses which events are held out.
    labels : class index per event; stratifies the split when given.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ConfigError(f"eval_fraction={eval_fraction}: must be in [0, 1)")
    if labels is not None and len(labels) != n_events:
        raise ConfigError(f"labels has {len(labels)} entries for {n_events} events")
    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    groups = ([np.flatnonzero(labels == c) for c in np.unique(labels)]
              if labels is not None else [np.arange(n_events)])
    held = [rng.permutation(g)[: int(round(eval_fraction * len(g)))] for g in groups]
    is_eval = np.zeros(n_events, bool)
    if held:
        is_eval[np.concatenate(held)] = True
    return np.flatnonzero(~is_eval), np.flatnonzero(is_eval)


def split_three(n_events: int, eval_fraction: float, test_fraction: float, seed: int,
                labels: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted (train, validation, test) store indices.

    Validation is exactly :func:`split_train_eval`'s held-out part (the events a run
    evaluates during training, and chooses by), so ``test_fraction = 0`` is the
    two-way split of every run before it existed. The test events are then drawn from
    the rest, ``round(test_fraction * n_c)`` per class, from their own random stream:
    the training never reads them and no evaluation during training scores them.
    """
    if not 0.0 <= test_fraction < 1.0 or eval_fraction + test_fraction >= 1.0:
        raise ConfigError(f"test_fraction={test_fraction} with eval_fraction={eval_fraction}:"
                          " each in [0, 1) and together below 1")
    train, validation = split_train_eval(n_events, eval_fraction, seed, labels)
    if test_fraction == 0.0:
        return train, validation, np.zeros(0, np.int64)
    rng = np.random.default_rng([seed, _TEST_STREAM])
    if labels is None:
        groups = [(train, n_events)]
    else:
        labels = np.asarray(labels)
        groups = [(train[labels[train] == c], int((labels == c).sum()))
                  for c in np.unique(labels)]
    test = [rng.permutation(g)[: int(round(test_fraction * n))] for g, n in groups]
    test = np.sort(np.concatenate(test)).astype(np.int64)
    return np.setdiff1d(train, test), validation, test


def contiguous_shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Block ``rank`` of ``world_size`` near-equal contiguous blocks of ``indices``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} of world size {world_size}: need 0 <= rank < size")
    n = len(indices)
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return np.asarray(indices[lo:hi], np.int64)


def batch_sizes(n: int, batch_per_rank: int, steps: int | None = None) -> list[int]:
    """Sizes of the ``steps`` batches that cover ``n`` events exactly once (module rules)."""
    if batch_per_rank < 1:
        raise ConfigError(f"batch_per_rank={batch_per_rank}: must be >= 1")
    steps = math.ceil(n / batch_per_rank) if steps is None else steps
    if not steps <= n <= steps * batch_per_rank:
        raise LartpcError(f"cannot cover {n} events in exactly {steps} nonempty batches of at "
                          f"most {batch_per_rank}: make the shards larger or the batch bigger")
    full, rest = divmod(n, batch_per_rank)
    sizes = [batch_per_rank] * full + ([rest] if rest else [])
    while len(sizes) < steps:  # split the last batch that can be split
        k = max(i for i, s in enumerate(sizes) if s > 1)
        sizes[k] -= 1
        sizes.insert(k + 1, 1)
    return sizes


def epoch_batches(indices: np.ndarray, batch_per_rank: int, epoch: int, seed: int, *,
                  shuffle: bool = True, steps: int | None = None) -> list[np.ndarray]:
    """The batches of one epoch over ``indices``: arrays of its elements (a loader
    passes its shard's positions, ``0 .. n-1``, not store indices).

    The order is a permutation drawn from ``(seed, epoch)`` alone, so two processes
    with the same arguments agree exactly.
    """
    indices = np.asarray(indices, np.int64)
    order = indices
    if shuffle:
        order = indices[np.random.default_rng([seed, epoch]).permutation(len(indices))]
    bounds = np.cumsum([0, *batch_sizes(len(order), batch_per_rank, steps)])
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class ShardPlan:
    """The whole data plan of a run: split, shards, steps; same on every rank.

    Parameters
    ----------
    n_events : events in the store.
    world_size : number of ranks.
    batch_per_rank : events per rank per step.
    seed : drives the split and the per-epoch shuffles.
    eval_fraction : held-out fraction, evaluated during training (the validation split).
    labels : class per event (stratifies the split).
    test_fraction : a third split, never trained on nor evaluated during training
        (:func:`split_three`; 0: none, the study's two-way split).
    """

    def __init__(self, n_events: int, world_size: int = 1, batch_per_rank: int = 7, seed: int = 0,
                 eval_fraction: float = 0.1, labels: np.ndarray | None = None,
                 test_fraction: float = 0.0):
        self.n_events, self.world_size, self.batch_per_rank = n_events, world_size, batch_per_rank
        self.seed = seed
        if world_size < 1:
            raise ConfigError(f"world_size={world_size}: must be >= 1")
        self.train, self.eval, self.test = split_three(n_events, eval_fraction, test_fraction,
                                                       seed, labels)
        n_train = len(self.train)
        if n_train < world_size:
            raise LartpcError(
                f"{n_train} training events for {world_size} ranks: some ranks would get an "
                f"empty shard (use fewer ranks, more events or a smaller eval_fraction)")
        sizes = {len(self.train_indices(r)) for r in range(world_size)}
        if batch_per_rank == 1 and len(sizes) > 1:
            raise ConfigError(f"batch_per_rank=1 needs the {n_train} training events to divide "
                              f"evenly over {world_size} ranks")
        self.steps_per_epoch = math.ceil(max(sizes) / batch_per_rank)
        self._cum_images: list[int] | None = None

    def images_seen(self, global_step: int) -> int:
        """Training images all ranks together have stepped on after ``global_step``
        steps (exact: the short batches of each epoch included)."""
        if self._cum_images is None:
            per_step = [0] * self.steps_per_epoch
            for r in range(self.world_size):
                n = len(self.train_indices(r))
                for j, b in enumerate(batch_sizes(n, self.batch_per_rank, self.steps_per_epoch)):
                    per_step[j] += b
            self._cum_images = [0, *itertools.accumulate(per_step)]
        epochs, j = divmod(global_step, self.steps_per_epoch)
        return epochs * self._cum_images[-1] + self._cum_images[j]

    def train_indices(self, rank: int) -> np.ndarray:
        """Store indices rank ``rank`` owns for training (fixed for the run, sorted)."""
        return contiguous_shard(self.train, rank, self.world_size)

    def eval_indices(self, rank: int) -> np.ndarray:
        """Store indices rank ``rank`` evaluates (possibly none)."""
        return contiguous_shard(self.eval, rank, self.world_size)
