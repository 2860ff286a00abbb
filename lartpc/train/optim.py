"""Optimizer and learning-rate schedule of the training protocol."""

from __future__ import annotations

import math

import torch

from lartpc.config import TrainConfig

#: torch's keyword for each ``train.optimizer_impl``
IMPLS = {"foreach": {"foreach": True}, "for-loop": {"foreach": False}, "fused": {"fused": True}}


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Adam (the paper's) or SGD with momentum (the Goyal-style comparison), updated the
    ``train.optimizer_impl`` way.

    torch updates CPU tensors a tensor at a time unless told otherwise (multi-tensor
    ``foreach`` is its default on CUDA only); SCNet's Adam step on the CPU took a fifth
    of the training step that way (BENCHMARKS.md, issue 36), and ``foreach`` gives the
    same numbers bit for bit (tests/test_optim_impl.py).
    """
    impl = IMPLS[cfg.optimizer_impl]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
                                eps=cfg.eps, weight_decay=cfg.weight_decay, **impl)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, **impl)


def keep_impl(opt: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """Set ``train.optimizer_impl`` on ``opt`` again after ``load_state_dict``, which
    brings the checkpoint's param-group settings, these among them (a checkpoint from
    before the setting holds torch's default, ``foreach=None``: a tensor at a time)."""
    impl = IMPLS[cfg.optimizer_impl]
    for group in opt.param_groups:
        group["foreach"], group["fused"] = impl.get("foreach"), impl.get("fused")


def scaled_lr(cfg: TrainConfig, world_size: int) -> float:
    """Target learning rate after scaling with the number of ranks."""
    factor = {"none": 1.0, "linear": float(world_size), "sqrt": math.sqrt(world_size)}
    return cfg.lr * factor[cfg.lr_scaling]


def lr_at(cfg: TrainConfig, world_size: int, global_step: int, steps_per_epoch: int) -> float:
    """Learning rate for ``global_step``: a linear warmup from ``lr`` to the scaled rate
    over ``warmup_epochs``, then constant."""
    target = scaled_lr(cfg, world_size)
    warm_steps = cfg.warmup_epochs * steps_per_epoch
    if warm_steps <= 0 or global_step >= warm_steps:
        return target
    return cfg.lr + (target - cfg.lr) * global_step / warm_steps


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
