"""Run under torchrun by tests/test_train_loop.py: two ranks whose checkpoint clocks
disagree (rank 0's interval passes after global step 3, rank 1's never), as clocks a
step apart do on a cluster. Trains with the real loop and writes, per rank, the global
steps at which it saved to OUT/saves-rank<r>.json."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from lartpc import dist
from lartpc.config import load_config
from lartpc.data.store import EventStore
from lartpc.train.checkpoint import Checkpointer
from lartpc.train.loop import fit
from lartpc.train.plan import plan_run
from lartpc.train.segments import Segment
from lartpc.train.sinks import Sink
from lartpc.train.trainer import Trainer


class SkewedClock(Checkpointer):
    def __init__(self, *args, wish_at: int | None):
        super().__init__(*args)
        self.wish_at, self.saved_at = wish_at, []

    def due(self, global_step: int) -> bool:
        return global_step == self.wish_at

    def save(self, trainer, sinks) -> None:
        super().save(trainer, sinks)
        self.saved_at.append(trainer.state.global_step)


def main() -> int:
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    world = dist.init("torch", "cpu", timeout_s=30)
    cfg = load_config("tiny-jishnet", ["data.downsample=9", "data.eval_fraction=0.2",
                                       "train.epochs=2", "train.threads=1"])
    store = EventStore(data)
    t = Trainer.build(Segment(cfg, store, plan_run(cfg, store, world.size), world, out,
                              time.time()))
    ckpt = SkewedClock(world, out, 0, 600.0, wish_at=3 if world.rank == 0 else None)
    status = fit(t, ckpt, Sink())
    (out / f"saves-rank{world.rank}.json").write_text(
        json.dumps({"status": status, "saved_at": ckpt.saved_at,
                    "steps_per_epoch": t.plan.steps_per_epoch}))
    world.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
