"""Checkpoints: everything needed to continue a run exactly where it stopped."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

CHECKPOINT = "checkpoint.pt"


def inner_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The wrapped optimizer under a distributed wrapper (its state is the real one)."""
    return getattr(opt, "inner", opt)


def save(run: Path, *, model: torch.nn.Module, opt: torch.optim.Optimizer, epoch: int,
         step_in_epoch: int, global_step: int, world_size: int, config: dict,
         eval_rows: list[dict], train_time_s: float, scaler=None) -> Path:
    """Write ``checkpoint.pt`` atomically (rank 0 only)."""
    path = Path(run) / CHECKPOINT
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": epoch,
        "step_in_epoch": step_in_epoch,
        "global_step": global_step,
        "world_size": world_size,
        "config": config,
        "eval_rows": eval_rows,
        "train_time_s": train_time_s,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate()},
    }
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(run: Path) -> dict | None:
    """The checkpoint of ``run``, or None when there is none."""
    path = Path(run) / CHECKPOINT
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def restore_rng(state: dict) -> None:
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
