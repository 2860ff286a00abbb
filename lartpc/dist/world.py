"""Distributed setup and the few collectives training needs.

Only this package imports ``horovod`` or ``torch.distributed``. One call,
:func:`init`, inspects the launcher's environment (horovodrun, mpirun, jsrun, srun,
torchrun, or none), starts the matching backend and returns a :class:`World`:

* ``horovod`` - Horovod over Gloo (horovodrun) or MPI (mpirun, jsrun, srun --mpi=pmix);
* ``torch``   - torch.distributed, gloo on CPU and nccl on GPU (torchrun, plain srun);
* ``none``    - a single process; every collective is the identity.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import re
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from lartpc.dist import BACKENDS, COMPRESSIONS
from lartpc.dist.spans import Exchange
from lartpc.errors import ConfigError

log = logging.getLogger(__name__)
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK")


#: torch.distributed's backends on CUDA ranks: collectives of CUDA tensors by NCCL,
#: of CPU tensors by gloo
TORCH_CUDA_BACKENDS = "cpu:gloo,cuda:nccl"


def job_port(job_id: int) -> int:
    """The rendezvous port of a scheduler job, one per job so two jobs sharing a node do
    not collide: 10000-29999, below Linux's ephemeral ports (32768-60999), which a busy
    node's outgoing connections may hold. jobs/slurm/common.sh's lartpc_master computes
    the same (tests/test_bench_allreduce.py checks the two agree)."""
    return 10000 + job_id % 20000


def detect_backend(env: Mapping[str, str] | None = None) -> str:
    """The backend a launcher's environment implies (see the module docstring)."""
    env = os.environ if env is None else env
    if "HOROVOD_RANK" in env:  # horovodrun (Gloo controller) sets these itself
        return "horovod"
    if "TORCHELASTIC_RUN_ID" in env:  # torchrun
        return "torch"
    # before RANK/WORLD_SIZE, which a task may inherit from the shell that submitted it
    if any(v in env for v in _MPI_RANK_VARS) and _int(env, ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE",
                                                          "PMI_SIZE", "JSM_NAMESPACE_SIZE",
                                                          "SLURM_NTASKS"), 1) > 1:
        return "horovod"  # mpirun / jsrun / srun --mpi=pmix: the paper's Horovod-on-MPI
    if "RANK" in env and "WORLD_SIZE" in env:  # env:// set by hand or another launcher
        return "torch"
    if "SLURM_STEP_ID" in env and _int(env, ("SLURM_NTASKS",), 1) > 1:
        return "torch"  # plain srun: torch.distributed from SLURM's variables
    return "none"


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for n in names:
        if n in env:
            return int(env[n])
    return default


@dataclass(frozen=True)
class World:
    """This process's place in the job, and the collectives of its backend.

    The base class is one process alone (every collective is the identity); each
    backend is a subclass chosen once by :func:`init`: :class:`LocalWorld`,
    :class:`~lartpc.dist.torch_world.TorchWorld`,
    :class:`~lartpc.dist.horovod_world.HorovodWorld`.
    """

    rank: int = 0
    local_rank: int = 0
    size: int = 1
    local_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: ClassVar[str] = "none"

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -- collectives -------------------------------------------------------------------
    def allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (a new tensor; ``t`` is unchanged)."""
        return t.clone()

    def allreduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks in place (no copy: what ``lartpc bench
        allreduce`` times); returns ``t``."""
        return t

    def allreduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over ranks."""
        return self.allreduce_sum(t) / self.size

    def allgather_object(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        return [obj]

    def broadcast_object(self, obj, root: int = 0):
        """Any picklable object from ``root`` to all ranks (other ranks may pass None)."""
        return obj

    def broadcast_parameters(self, module: torch.nn.Module, root: int = 0) -> None:
        """Overwrite every rank's parameters and buffers with ``root``'s."""

    def broadcast_optimizer_state(self, opt: torch.optim.Optimizer, root: int = 0) -> None:
        """Give every rank ``root``'s optimizer state (step counts, moments, lr).

        A fresh optimizer has no state, identical everywhere, so nothing is sent:
        Horovod would otherwise initialise it by taking a real step on zero gradients,
        which with weight decay moves every parameter and advances Adam's step count.
        """
        if opt.state_dict()["state"]:
            self._broadcast_optimizer_state(opt, root)

    def _broadcast_optimizer_state(self, opt: torch.optim.Optimizer, root: int) -> None:
        pass

    # -- training ----------------------------------------------------------------------
    def distributed_model(self, module: torch.nn.Module, compression: str = "none"
                          ) -> torch.nn.Module:
        """``module`` as this backend trains it (the torch backend wraps it in
        DistributedDataParallel; the others train it as it is). Call it once every rank
        holds the same parameters; save and load :func:`unwrap_model` of the result."""
        check_compression(compression)
        return module

    def distributed_optimizer(self, opt: torch.optim.Optimizer, module: torch.nn.Module,
                              compression: str = "none") -> torch.optim.Optimizer:
        """``opt`` wrapped so ``step()`` uses gradients averaged over ranks, where the
        backend averages in the optimizer (Horovod); ``opt`` itself otherwise.
        ``compression="fp16"`` sends gradients as float16."""
        check_compression(compression)
        return opt

    def average_gradients(self, grads: list[torch.Tensor], compression: str = "none"
                          ) -> Exchange:
        """Average ``grads`` (a step's gradients, computed without the backend's hooks:
        ``train.cuda_graph``'s replayed backward) over the ranks in place, as the
        backend's own exchange would; its time (seconds, or on CUDA a
        :class:`~lartpc.dist.spans.DeviceSpan`). One rank: nothing to do."""
        return 0.0

    def watch_local_gradients(self, observer) -> bool:
        """Have ``observer(param, grad)`` called with each parameter's gradient on this
        rank as its bucket goes to be averaged (False when this backend has no such
        buckets: then take the local gradient from per-parameter hooks). ``None`` stops
        the calls."""
        return False

    def no_sync(self, model: torch.nn.Module):
        """Context for a backward pass whose gradients must not be exchanged."""
        return nullcontext()

    def step_optimizer(self, opt: torch.optim.Optimizer, scaler=None) -> Exchange:
        """Finish the gradient exchange, then update; returns the exchange's time not
        hidden behind backward (docs/run-folder.md, ``comm_s``): seconds, or on CUDA
        with the torch backend a :class:`~lartpc.dist.spans.DeviceSpan`.

        With a ``torch.amp.GradScaler`` (fp16 training) the averaged gradients are
        unscaled and the step is skipped when any is inf/NaN; the check runs on the
        already averaged gradients, so every rank skips the same steps.
        """
        comm = self._finish_exchange(opt)
        with self._exchanged(opt):
            if scaler is None:
                opt.step()
            else:
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
        return comm

    def _finish_exchange(self, opt: torch.optim.Optimizer) -> Exchange:
        """Wait for the gradient exchange still running after backward; its time."""
        return 0.0

    def _exchanged(self, opt: torch.optim.Optimizer):
        """Context for the update, once the exchange is done."""
        return nullcontext()

    def param_divergence(self, module: torch.nn.Module) -> float:
        """Largest |difference| between this job's ranks' parameters and rank 0's
        (summed over ranks, so 0.0 means every rank holds identical weights, NaN and inf
        where rank 0 has them too; inf where a NaN or inf meets another value)."""
        if self.size == 1:
            return 0.0
        flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in module.parameters()])
        ref = self._broadcast_tensor(flat.clone())
        diff = (flat - ref).abs()
        # a diverged run's NaN or inf where rank 0 has the same is no difference; a NaN
        # against a number is as different as can be: inf (NaN is no number to record)
        same = (flat == ref) | (flat.isnan() & ref.isnan())
        diff = torch.where(same, 0.0, torch.where(diff.isnan(), math.inf, diff))
        return float(self.allreduce_sum(diff.max().reshape(1)))

    def _broadcast_tensor(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        return t

    def collectives(self) -> str:
        """The library that moves this backend's tensors between ranks: ``nccl``,
        ``gloo``, ``mpi``, or ``none`` for one process."""
        return "none"

    def shutdown(self) -> None:
        """Leave the backend (no collective afterwards)."""


class LocalWorld(World):
    """One process: every collective is the identity."""


def check_compression(compression: str) -> None:
    """Refuse a ``train.grad_compression`` that is not one of :data:`COMPRESSIONS`."""
    if compression not in COMPRESSIONS:
        raise ConfigError(f"train.grad_compression={compression!r}: expected one of "
                          f"{', '.join(COMPRESSIONS)}")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model under ``torch.compile`` and DDP wrappers (its ``state_dict`` keys
    carry no ``_orig_mod.`` or ``module.`` prefix)."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(model, torch.nn.Module) and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def device_type(device: str) -> str:
    """``cuda`` or ``cpu``: what ``device`` (auto | cpu | cuda) means on this host."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device={device!r}: expected auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device")
    return "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) \
        else "cpu"


def init(backend: str = "auto", device: str = "auto", timeout_s: float = 300.0) -> World:
    """Start the distributed backend and pin this rank's device by its local rank.

    Parameters
    ----------
    backend : ``auto`` (from the launcher's environment), ``horovod``, ``torch`` or ``none``.
    device : ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
    timeout_s : torch.distributed collective timeout; a rank that stops answering makes
        the others fail after this long instead of hanging forever.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"dist.backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    chosen = detect_backend() if backend == "auto" else backend
    use_cuda = device_type(device) == "cuda"

    if chosen == "horovod":
        try:
            import horovod.torch as hvd

            from lartpc.dist.horovod_world import HorovodWorld  # noqa: F401 (imports it)
        except ImportError as e:
            raise ConfigError(f"dist.backend=horovod but Horovod is not importable ({e}); "
                              "run `make install`") from e
        hvd.init()
        rank, local_rank, size = hvd.rank(), hvd.local_rank(), hvd.size()
        local_size = hvd.local_size()
    elif chosen == "torch":
        rank, local_rank, size = _torch_env()
        local_size = local_world_size(os.environ, size)
    else:
        rank, local_rank, size, local_size = 0, 0, 1, 1

    # Pin before any CUDA or spconv call: spconv otherwise launches on GPU 0 for all ranks.
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")

    if chosen == "torch" and not torch.distributed.is_initialized():
        # on GPUs the gradients go by NCCL; the loop's small agreements (the step vote,
        # evaluation counts, checkpoint checks, the noise scale) are CPU tensors, which
        # NCCL does not take: gloo carries those
        torch.distributed.init_process_group(
            backend=TORCH_CUDA_BACKENDS if use_cuda else "gloo", rank=rank, world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if use_cuda else None)
    world = _world_class(chosen)(rank=rank, local_rank=local_rank, size=size,
                                 local_size=local_size, device=dev)
    log.info("world: %d rank(s), backend %s, device %s", size, chosen, dev)
    return world


def local_world_size(env: Mapping[str, str], size: int) -> int:
    """The ranks on this host (torch backend): torchrun's ``LOCAL_WORLD_SIZE``; under
    srun this node's tasks of the step (``SLURM_STEP_TASKS_PER_NODE``, e.g. ``4(x2),3``,
    at ``SLURM_NODEID``: ``SLURM_NTASKS_PER_NODE`` is set only when it was asked for);
    else ``size`` (every rank here)."""
    if "TORCHELASTIC_RUN_ID" in env and "LOCAL_WORLD_SIZE" in env:
        return int(env["LOCAL_WORLD_SIZE"])
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node and "SLURM_NODEID" in env:
        counts: list[int] = []
        for part in per_node.split(","):
            m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
            if m is None:
                counts = []
                break
            counts += [int(m.group(1))] * int(m.group(2) or 1)
        node = int(env["SLURM_NODEID"])
        if 0 <= node < len(counts):
            return counts[node]
    return _int(env, ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"), size)


def _world_class(backend: str) -> type[World]:
    if backend == "horovod":
        from lartpc.dist.horovod_world import HorovodWorld

        return HorovodWorld
    if backend == "torch":
        from lartpc.dist.torch_world import TorchWorld

        return TorchWorld
    return LocalWorld


def _torch_env() -> tuple[int, int, int]:
    """Rank, local rank and size for torch.distributed; fills the env:// variables from
    SLURM's when the job was started by plain ``srun``.

    Under plain srun (a job step, no torchrun in between) SLURM's task variables decide:
    a ``RANK``, ``WORLD_SIZE`` or ``LOCAL_RANK`` inherited from the environment the job
    was submitted from is replaced, since every task would inherit the same value and no
    rank would host the rendezvous."""
    env = os.environ
    plain_srun = "SLURM_PROCID" in env and "SLURM_STEP_ID" in env \
        and "TORCHELASTIC_RUN_ID" not in env
    if plain_srun or ("RANK" not in env and "SLURM_PROCID" in env):
        if "SLURM_NTASKS" not in env:  # a batch script's environment, not a task's
            raise ConfigError("dist.backend=torch under SLURM needs SLURM_NTASKS in the "
                              "environment (SLURM_PROCID is set without it): start the "
                              "ranks with srun or torchrun")
        slurm = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"],
                 "LOCAL_RANK": env.get("SLURM_LOCALID", "0")}
        for k, v in slurm.items():
            if env.get(k, v) != v:
                log.warning("%s=%s from the submitting environment ignored: this srun "
                            "task's is %s", k, env[k], v)
            env[k] = v
        if "MASTER_ADDR" not in env:
            # as jobs/slurm/common.sh's lartpc_master: the step's first node, a port per job
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodes:
                raise ConfigError("srun with the torch backend needs MASTER_ADDR (the first "
                                  "host of the allocation); the sbatch scripts in jobs/slurm/ "
                                  "export it")
            env["MASTER_ADDR"] = first_host(nodes)
            env.setdefault("MASTER_PORT", str(job_port(int(env.get("SLURM_JOB_ID", "0")))))
        env.setdefault("MASTER_PORT", "29500")
    try:
        return int(env["RANK"]), int(env.get("LOCAL_RANK", "0")), int(env["WORLD_SIZE"])
    except KeyError as e:
        raise ConfigError(f"dist.backend=torch needs {e.args[0]} in the environment "
                          "(start with torchrun or srun)") from e


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``n[07-09,12],m1`` -> ``n07``), as
    ``scontrol show hostnames`` would give it."""
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):  # the first name: up to a comma outside brackets
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            end = i
            break
    name = nodelist[:end].strip()
    while "[" in name:  # each bracket group: its first number, zero padding kept
        head, _, rest = name.partition("[")
        group, _, tail = rest.partition("]")
        name = head + group.split(",")[0].split("-")[0] + tail
    if not name:
        raise ConfigError(f"SLURM node list {nodelist!r}: no host name in it")
    return name
