"""The training loop: the paper's protocol, one process per rank.

Order (standard Horovod): init -> pin device -> shard data (DLT) -> build model ->
resume or broadcast parameters and optimizer state -> DistributedOptimizer -> epochs
of ``train_one_epoch`` and ``evaluate`` until the epochs or the time limit run out.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lartpc import checkpoint, runlog
from lartpc.config import Config
from lartpc.data.sharding import ShardPlan
from lartpc.data.store import EventStore
from lartpc.dist import World
from lartpc.evaluate import evaluate
from lartpc.optim import build_optimizer, lr_at, set_lr

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where the run stands; what a checkpoint restores."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    train_time_s: float = 0.0
    eval_rows: list[dict] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    last_ckpt_time: float = field(default_factory=time.time)
    ckpt_s: float = 1.0
    eval_s: float = 0.0
    out_of_time: bool = False


@dataclass
class Parts:
    """Everything the loop drives, built once by :func:`build_parts`."""

    cfg: Config
    world: World
    run: Path
    plan: ShardPlan
    model: torch.nn.Module
    loss_fn: torch.nn.Module
    opt: torch.optim.Optimizer
    train_loader: object
    eval_loader: object
    process_start: float
    autocast: object
    scaler: torch.amp.GradScaler | None = None  #: fp16 dynamic loss scaling


def model_options(cfg: Config, device_type: str) -> dict:
    """Speed options of the configured model (they never change what it computes,
    beyond rounding); an option the device cannot run is a :class:`ConfigError`."""
    from lartpc.errors import ConfigError

    m, amp = cfg.model, cfg.train.amp
    if m.name == "jishnet":
        if m.algo != "auto":
            raise ConfigError(f"model.algo={m.algo!r} is an SCNet option (model.name=jishnet)")
        return {"channels_last": m.channels_last, "elu_after_pool": m.elu_after_pool}
    if m.channels_last:
        raise ConfigError("model.channels_last is a JishNet option (model.name=scnet)")
    if amp == "bf16":
        raise ConfigError("train.amp=bf16 with model.name=scnet: spconv has no bfloat16 "
                          "kernels; use train.amp=fp16 (CUDA) or none")
    if amp == "fp16" and device_type != "cuda":
        raise ConfigError("train.amp=fp16 with model.name=scnet needs CUDA (spconv's CPU "
                          "kernels are float32 only); use train.amp=none on CPU")
    return {"algo": None if m.algo == "auto" else m.algo, "half": amp == "fp16"}


def autocast_and_scaler(cfg: Config, device_type: str):
    """The forward pass's autocast context factory and the fp16 loss scaler (or None).

    SCNet runs its own float16 trunk (``half``), so it gets no outer autocast.
    """
    amp = cfg.train.amp
    scaler = torch.amp.GradScaler(device_type) if amp == "fp16" else None
    if amp == "none" or cfg.model.name == "scnet":
        return nullcontext, scaler
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return (lambda: torch.autocast(device_type, dtype=dtype)), scaler


def loader_mode(cfg: Config, model: torch.nn.Module) -> str:
    """The batch path: the config's, or the one the model's input needs."""
    if cfg.data.loader != "auto":
        return cfg.data.loader
    return "sparse" if model.input_kind == "sparse" else "blosc"


def build_parts(cfg: Config, store: EventStore, world: World, run: Path,
                process_start: float, resume: dict | None) -> Parts:
    from lartpc.models import build
    from lartpc.models.losses import build_loss

    tc = cfg.train
    n = min(len(store), cfg.data.max_events) if cfg.data.max_events else len(store)
    plan = ShardPlan(n, world.size, tc.batch_per_rank, tc.seed, cfg.data.eval_fraction,
                     store.labels[:n])
    torch.manual_seed(tc.seed)
    if world.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: autotune once
    model = build(cfg.model.name, image_size=store.geometry.shape,
                  **model_options(cfg, world.device.type)).to(world.device)
    mode = loader_mode(cfg, model)
    if (mode == "sparse") != (model.input_kind == "sparse"):
        from lartpc.errors import ConfigError

        raise ConfigError(f"data.loader={mode!r} cannot feed {cfg.model.name} "
                          f"(it needs {model.input_kind} batches)")
    opt = build_optimizer(tc, model)
    autocast, scaler = autocast_and_scaler(cfg, world.device.type)
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        if scaler is not None and resume.get("scaler"):
            scaler.load_state_dict(resume["scaler"])
    # Every rank starts from rank 0's weights and optimizer state.
    world.broadcast_parameters(model)
    world.broadcast_optimizer_state(opt)
    opt = world.distributed_optimizer(opt, model, tc.grad_compression)
    if tc.compile and model.input_kind == "dense":
        model = torch.compile(model)
    t0 = time.time()
    train_loader = make_loader(cfg, store, mode, plan.train_indices(world.rank), world.device,
                               train=True, steps=plan.steps_per_epoch)
    eval_loader = make_loader(cfg, store, mode, plan.eval_indices(world.rank), world.device,
                              train=False)
    log.info("data ready in %.1f s: %d train / %d eval events on this rank, %d steps/epoch, "
             "%s loader", time.time() - t0, len(plan.train_indices(world.rank)),
             len(plan.eval_indices(world.rank)), plan.steps_per_epoch, mode)
    return Parts(cfg, world, run, plan, model, build_loss(cfg.model.loss), opt, train_loader,
                 eval_loader, process_start, autocast, scaler)


def make_loader(cfg: Config, store: EventStore, mode: str, indices: np.ndarray,
                device: torch.device, *, train: bool, steps: int | None = None):
    """One rank's loader over ``indices`` (None for an empty evaluation shard)."""
    from lartpc.data.blosc_cache import BloscConfig
    from lartpc.data.loaders import build_loader

    if not train and len(indices) == 0:
        return None
    blosc = BloscConfig(codec=cfg.data.blosc_codec, clevel=cfg.data.blosc_clevel,
                        shuffle=cfg.data.blosc_shuffle)
    return build_loader(store, "dense" if mode == "blosc" else mode, indices,
                        cfg.train.batch_per_rank, device=device, seed=cfg.train.seed,
                        shuffle=train, steps_per_epoch=steps, prefetch_depth=cfg.data.prefetch,
                        blosc=blosc)


def _time_left(p: Parts, prog: Progress) -> bool:
    """True while another step, an evaluation and a checkpoint still fit the limit."""
    step = statistics.median(prog.step_times[-20:]) if prog.step_times else 0.0
    eval_s = prog.eval_s or 0.5 * step * max(1, len(p.plan.eval_indices(0)) / p.plan.batch_size)
    reserve = 1.5 * (2 * step + eval_s + prog.ckpt_s) + 2.0
    return time.time() - p.process_start + reserve < p.cfg.train.time_limit_s


def _save(p: Parts, prog: Progress, steplog: runlog.StepLog) -> None:
    """Flush every rank's log, agree, then rank 0 writes the checkpoint."""
    steplog.flush()
    p.world.allreduce_sum(torch.zeros(1))  # all logs are on disk before the checkpoint
    if p.world.is_root:
        t0 = time.time()
        checkpoint.save(p.run, model=_unwrap(p.model), opt=p.opt, epoch=prog.epoch,
                        step_in_epoch=prog.step_in_epoch, global_step=prog.global_step,
                        world_size=p.world.size, config=p.cfg.to_dict(),
                        eval_rows=prog.eval_rows, train_time_s=prog.train_time_s,
                        scaler=p.scaler)
        prog.ckpt_s = time.time() - t0
    prog.last_ckpt_time = time.time()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "_orig_mod", model)


def train_one_epoch(p: Parts, prog: Progress, steplog: runlog.StepLog) -> bool:
    """Run the rest of epoch ``prog.epoch``; False when the time limit cut it short
    (``prog.out_of_time`` is also set when time ran out on its last step)."""
    tc, world = p.cfg.train, p.world
    p.train_loader.set_epoch(prog.epoch)
    p.model.train()
    t_prev = time.perf_counter()
    for batch in p.train_loader.iterate(start=prog.step_in_epoch):  # resumes mid-epoch
        t_data = time.perf_counter()
        set_lr(p.opt, lr_at(tc, world.size, prog.global_step, p.plan.steps_per_epoch))
        p.opt.zero_grad()  # Horovod's wrapper takes no arguments
        with p.autocast():
            logits = p.model(batch)
            loss = p.loss_fn(logits.float(), batch.labels)
        (p.scaler.scale(loss) if p.scaler else loss).backward()
        comm_s = world.step_optimizer(p.opt, p.scaler)
        local_loss = float(loss.detach())
        local_acc = float((logits.detach().argmax(1) == batch.labels).float().mean())
        t_metric = time.perf_counter()
        stop_vote = 0.0 if _time_left(p, prog) else 1.0
        g = world.allreduce_mean(torch.tensor([local_loss, local_acc, stop_vote],
                                              dtype=torch.float64))
        t_end = time.perf_counter()
        comm_s += t_end - t_metric
        compute_s = (t_end - t_data) - comm_s
        steplog.log(time=time.time(), epoch=prog.epoch, rank=world.rank,
                    batchno=prog.step_in_epoch, data_size=batch.batch_size,
                    local_loss=local_loss, global_loss=float(g[0]), local_acc=local_acc,
                    global_acc=float(g[1]), data_s=t_data - t_prev, compute_s=compute_s,
                    comm_s=comm_s)
        prog.step_times.append(t_end - t_prev)
        prog.train_time_s += t_end - t_prev
        prog.step_in_epoch += 1
        prog.global_step += 1
        t_prev = time.perf_counter()
        if g[2] > 0:  # any rank out of time: all stop together
            prog.out_of_time = True
            return prog.step_in_epoch >= p.plan.steps_per_epoch
        every = tc.checkpoint_every_steps
        if (every and prog.global_step % every == 0) or \
                (not every and time.time() - prog.last_ckpt_time > tc.checkpoint_every_s):
            _save(p, prog, steplog)
        if world.is_root and prog.global_step % max(1, p.plan.steps_per_epoch // 4) == 0:
            log.info("epoch %d step %d/%d  loss %.4f  acc %.3f", prog.epoch,
                     prog.step_in_epoch, p.plan.steps_per_epoch, g[0], g[1])
    return True


def _evaluate(p: Parts, prog: Progress) -> np.ndarray:
    t0 = time.time()
    res = evaluate(p.model, p.eval_loader, p.world, p.loss_fn, p.autocast)
    prog.eval_s = time.time() - t0
    row = {"epoch": prog.epoch, "time": time.time(), **res.row()}
    prog.eval_rows = [r for r in prog.eval_rows if r["epoch"] != prog.epoch] + [row]
    if p.world.is_root:
        runlog.write_eval(p.run, prog.eval_rows)
        runlog.write_confusion(p.run, res.confusion)
        log.info("eval epoch %d: loss %.4f accuracy %.3f on %d events", prog.epoch,
                 row["loss"], row["accuracy"], row["n_events"])
    return res.confusion


def fit(p: Parts, resume: dict | None) -> tuple[str, float]:
    """Train until ``epochs`` are done or the time limit.

    Returns the run status and the final parameter divergence between ranks (0.0
    when the distributed optimizer kept every rank identical, as it must).
    """
    prog = Progress()
    if resume is not None:
        checkpoint.restore_rng(resume)
        prog = Progress(epoch=resume["epoch"], step_in_epoch=resume["step_in_epoch"],
                        global_step=resume["global_step"], train_time_s=resume["train_time_s"],
                        eval_rows=resume["eval_rows"])
        log.info("resuming at epoch %d step %d (global step %d)", prog.epoch,
                 prog.step_in_epoch, prog.global_step)
    steplog = runlog.StepLog(p.run, p.world.rank, keep_steps=prog.global_step,
                             flush_every=p.cfg.train.log_flush_steps)
    status, evaluated = "completed", False
    while prog.epoch < p.cfg.train.epochs:
        if prog.step_in_epoch >= p.plan.steps_per_epoch:  # resumed at an epoch's end
            prog.epoch, prog.step_in_epoch = prog.epoch + 1, 0
            continue
        finished = train_one_epoch(p, prog, steplog)
        evaluated = False
        if not finished:
            status = "time_limit"
            log.warning("time limit %.0f s near: stopping at epoch %d step %d",
                        p.cfg.train.time_limit_s, prog.epoch, prog.step_in_epoch)
            break
        if (prog.epoch + 1) % p.cfg.train.eval_every_epochs == 0 \
                or prog.epoch + 1 == p.cfg.train.epochs:
            _evaluate(p, prog)
            evaluated = True
        prog.epoch, prog.step_in_epoch = prog.epoch + 1, 0
        _save(p, prog, steplog)
        if prog.out_of_time and prog.epoch < p.cfg.train.epochs:
            status = "time_limit"
            break
    # A run stopped early (or between evaluations) still ends evaluated and saved; a run
    # that finished its epochs was both at its last epoch's end.
    if not evaluated and prog.global_step > 0:
        _evaluate(p, prog)
        _save(p, prog, steplog)
    return status, p.world.param_divergence(_unwrap(p.model))


def set_threads(cfg: Config, world: World) -> int:
    """CPU threads per rank: the config's, or the cores shared by the ranks of a node.

    SCNet on CPU defaults to one thread: spconv's CPU kernels are many small parallel
    regions, and at full size a 2-thread step measured 6x slower than a 1-thread one
    (BENCHMARKS.md).
    """
    n = cfg.train.threads or max(1, (os.cpu_count() or 1) // max(1, world.local_size))
    if not cfg.train.threads and cfg.model.name == "scnet" and world.device.type == "cpu":
        n = 1
    torch.set_num_threads(n)
    return n
