"""Split, shards and epoch plans: disjoint, complete, in step, reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from lartpc.data import EventStore
from lartpc.data.sharding import ShardPlan, batch_sizes, epoch_batches, split_train_eval
from lartpc.errors import ConfigError, LartpcError


def train_batches(plan: ShardPlan, rank: int, epoch: int) -> list[np.ndarray]:
    """Rank ``rank``'s batches in ``epoch`` as its loader draws them."""
    return epoch_batches(plan.train_indices(rank), plan.batch_per_rank, epoch, plan.seed,
                         steps=plan.steps_per_epoch)


def eval_batches(plan: ShardPlan, rank: int) -> list[np.ndarray]:
    """Rank ``rank``'s evaluation batches, in store order, the last one short."""
    idx = plan.eval_indices(rank)
    return epoch_batches(idx, plan.batch_per_rank, 0, plan.seed, shuffle=False) if len(idx) else []


@pytest.fixture(scope="module")
def labels(events_dir):
    return EventStore(events_dir).labels


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("batch", [2, 3, 7])
def test_shards_disjoint_complete_and_in_step(labels, world_size, batch):
    plan = ShardPlan(len(labels), world_size, batch, seed=3, eval_fraction=0.2, labels=labels)
    assert len(plan.train) + len(plan.eval) == len(labels)
    assert not set(plan.train) & set(plan.eval)
    train = [plan.train_indices(r) for r in range(world_size)]
    evals = [plan.eval_indices(r) for r in range(world_size)]
    for parts, whole in ((train, plan.train), (evals, plan.eval)):
        flat = np.concatenate(parts)
        assert len(flat) == len(set(flat.tolist())) == len(whole)  # disjoint, no repeats
        assert sorted(flat.tolist()) == sorted(whole.tolist())  # complete
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for epoch in range(3):
        per_rank = [train_batches(plan, r, epoch) for r in range(world_size)]
        assert {len(b) for b in per_rank} == {plan.steps_per_epoch}  # every rank steps together
        for r, batches in enumerate(per_rank):
            assert all(1 <= len(b) <= batch for b in batches)
            seen = np.concatenate(batches)
            assert sorted(seen.tolist()) == train[r].tolist()  # each event once per epoch
    ev = [np.concatenate(eval_batches(plan, r)) if eval_batches(plan, r) else np.zeros(0, int)
          for r in range(world_size)]
    assert sorted(np.concatenate(ev).tolist()) == plan.eval.tolist()


def test_eval_split_is_stratified_and_seeded(labels):
    train, held = split_train_eval(len(labels), 0.25, seed=5, labels=labels)
    for c in np.unique(labels):
        n_c = int((labels == c).sum())
        assert int((labels[held] == c).sum()) == round(0.25 * n_c)
    again = split_train_eval(len(labels), 0.25, seed=5, labels=labels)
    other = split_train_eval(len(labels), 0.25, seed=6, labels=labels)
    assert np.array_equal(held, again[1])
    assert not np.array_equal(held, other[1])


def test_three_way_split_keeps_the_validation_events_and_adds_a_test_part(labels):
    """The test events come out of the training part, stratified and seeded by their own
    stream; validation is the two-way split's held-out part whatever the test share,
    and a share of 0 is the two-way split itself."""
    from lartpc.data.sharding import split_three

    train2, held2 = split_train_eval(len(labels), 0.2, seed=5, labels=labels)
    train, val, test = split_three(len(labels), 0.2, 0.25, seed=5, labels=labels)
    assert np.array_equal(val, held2)
    assert np.array_equal(np.sort(np.concatenate([train, test])), train2)
    assert not set(train) & set(test) and not set(val) & set(test)
    for c in np.unique(labels):
        assert int((labels[test] == c).sum()) == round(0.25 * int((labels == c).sum()))
    assert np.array_equal(test, split_three(len(labels), 0.2, 0.25, 5, labels)[2])
    assert not np.array_equal(test, split_three(len(labels), 0.2, 0.25, 6, labels)[2])
    zero = split_three(len(labels), 0.2, 0.0, seed=5, labels=labels)
    assert np.array_equal(zero[0], train2) and len(zero[2]) == 0
    plan = ShardPlan(len(labels), 2, 4, seed=5, eval_fraction=0.2, labels=labels,
                     test_fraction=0.25)
    trained = np.concatenate([plan.train_indices(r) for r in range(2)])
    assert np.array_equal(np.sort(trained), train) and np.array_equal(plan.test, test)
    with pytest.raises(ConfigError, match="test_fraction"):
        split_three(len(labels), 0.5, 0.5, seed=5, labels=labels)


def test_remainder_rule_splits_last_batch_of_the_short_rank():
    # shards of 15 and 14 with batch 7: both ranks must run 3 steps
    plan = ShardPlan(29, 2, 7, seed=0, eval_fraction=0.0)
    assert [len(plan.train_indices(r)) for r in range(2)] == [14, 15]
    assert plan.steps_per_epoch == 3
    assert [len(b) for b in train_batches(plan, 0, 0)] == [7, 6, 1]
    assert [len(b) for b in train_batches(plan, 1, 0)] == [7, 7, 1]
    assert batch_sizes(20, 7) == [7, 7, 6]
    with pytest.raises(LartpcError, match="nonempty batches"):
        batch_sizes(2, 7, steps=3)


def test_reshuffle_per_epoch_and_identical_across_processes(labels):
    a = ShardPlan(len(labels), 3, 4, seed=11, labels=labels)
    b = ShardPlan(len(labels), 3, 4, seed=11, labels=labels)  # as another rank builds it
    c = ShardPlan(len(labels), 3, 4, seed=12, labels=labels)
    for r in range(3):
        e0, e1 = np.concatenate(train_batches(a, r, 0)), np.concatenate(train_batches(a, r, 1))
        assert not np.array_equal(e0, e1)
        assert np.array_equal(e0, np.concatenate(train_batches(b, r, 0)))
        assert np.array_equal(e1, np.concatenate(train_batches(b, r, 1)))
    assert any(not np.array_equal(np.concatenate(train_batches(a, r, 0)),
                                  np.concatenate(train_batches(c, r, 0))) for r in range(3))
    # evaluation order never changes
    assert all(np.array_equal(x, y) for x, y in zip(eval_batches(a, 0), eval_batches(b, 0),
                                                      strict=True))
    unshuffled = epoch_batches(np.arange(10), 4, 3, 0, shuffle=False)
    assert np.concatenate(unshuffled).tolist() == list(range(10))


def test_empty_shard_is_a_clear_error():
    with pytest.raises(LartpcError, match="4 training events for 5 ranks"):
        ShardPlan(5, 5, 7, eval_fraction=0.2)
    ShardPlan(5, 5, 7, eval_fraction=0.0)  # one event each is fine


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match="eval_fraction"):
        ShardPlan(10, 1, 7, eval_fraction=1.0)
    with pytest.raises(ConfigError, match="batch_per_rank=1"):
        ShardPlan(11, 2, 1, eval_fraction=0.0)
    with pytest.raises(ConfigError, match="rank 2 of world size 2"):
        ShardPlan(10, 2, 7, eval_fraction=0.0).train_indices(2)
