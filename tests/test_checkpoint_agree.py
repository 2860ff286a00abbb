"""A rank that cannot write its logs at a checkpoint makes every rank raise, whatever
the error: the others must not wait for it in a collective."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from lartpc.dist.world import World
from lartpc.errors import LartpcError
from lartpc.train.checkpoint import Checkpointer


@dataclass(frozen=True)
class _TwoRanks(World):
    """Rank 1 of two; the other rank wrote fine (adds 0 to every vote)."""

    votes: list = field(default_factory=list)

    def allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        self.votes.append(float(t[0]))
        return t.clone()


class _Sinks:
    def __init__(self, error: Exception):
        self.error = error

    def flush(self) -> None:
        raise self.error


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   LartpcError("tb: a symbolic link; refused")])
def test_a_write_error_is_agreed_on_before_it_is_raised(tmp_path, error):
    world = _TwoRanks(rank=1, local_rank=1, size=2)
    with pytest.raises(type(error)):
        Checkpointer(world, tmp_path, 1, 0.0).save(trainer=None, sinks=_Sinks(error))
    # the failure went to the vote the other rank waits in (it raises there too)
    assert world.votes == [1.0]
