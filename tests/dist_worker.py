"""Run under a launcher (horovodrun, torchrun) or alone by tests/test_dist.py.

Trains a small conv net a few steps with the distributed optimizer on this rank's half
of a fixed batch and saves the final parameters to OUT/params-rank<r>.pt. With
``--single`` it trains one process on the whole (concatenated) batch instead.
``--fail-rank R`` makes rank R die after setup, to test that launches do not hang.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from lartpc.dist import init, unwrap_model


def model_and_data(seed: int = 7, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ELU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 5))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    x = torch.randn(n, 1, 16, 16, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    return model, x, y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--compression", default="none")
    args = ap.parse_args()

    world = init("none" if args.single else args.backend, device="cpu", timeout_s=60)
    model, x, y = model_and_data()
    if world.rank != 0:  # different init on purpose: the broadcast must fix it
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.01)
    world.broadcast_parameters(model)
    world.broadcast_optimizer_state(opt)
    opt = world.distributed_optimizer(opt, model, args.compression)
    model = world.distributed_model(model, args.compression)
    if world.rank == args.fail_rank:
        print(f"rank {world.rank} failing on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    share = len(x) // world.size
    mine = slice(world.rank * share, (world.rank + 1) * share)
    xs, ys = x[mine], y[mine]
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        world.step_optimizer(opt)
    # A collective after training: with a dead peer this is where a hang would happen.
    world.allreduce_mean(torch.ones(1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().clone() for k, v in unwrap_model(model).state_dict().items()},
               out / f"params-rank{world.rank}{'-single' if args.single else ''}.pt")
    world.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
