"""Distributed setup and the few collectives training needs.

This module and :mod:`lartpc.dist.ddp` are the only ones importing ``horovod`` or
``torch.distributed``. One call,
:func:`init`, inspects the launcher's environment (horovodrun, mpirun, jsrun, srun,
torchrun, or none), starts the matching backend and returns a :class:`World`:

* ``horovod`` - Horovod over Gloo (horovodrun) or MPI (mpirun, jsrun, srun --mpi=pmix);
* ``torch``   - torch.distributed, gloo on CPU and nccl on GPU (torchrun, plain srun);
* ``none``    - a single process; every collective is the identity.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from lartpc.errors import ConfigError

log = logging.getLogger(__name__)
BACKENDS = ("auto", "horovod", "torch", "none")
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK")


def detect_backend(env: Mapping[str, str] | None = None) -> str:
    """The backend a launcher's environment implies (see the module docstring)."""
    env = os.environ if env is None else env
    if "HOROVOD_RANK" in env:  # horovodrun (Gloo controller) sets these itself
        return "horovod"
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
        return "torch"
    if any(v in env for v in _MPI_RANK_VARS) and _int(env, ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE",
                                                          "PMI_SIZE", "JSM_NAMESPACE_SIZE",
                                                          "SLURM_NTASKS"), 1) > 1:
        return "horovod"  # mpirun / jsrun / srun --mpi=pmix: the paper's Horovod-on-MPI
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
    """This process's place in the job, and the collectives of its backend."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1
    backend: str = "none"
    local_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: the DDP model's :class:`~lartpc.dist.ddp.BucketExchange` (torch backend), once
    #: :meth:`distributed_model` made it; a list so the frozen World can hold it
    _exchange: list = field(default_factory=list, repr=False, compare=False)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -- collectives -------------------------------------------------------------------
    def allreduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (a new tensor; ``t`` is unchanged)."""
        if self.backend == "horovod":
            import horovod.torch as hvd

            return hvd.allreduce(t, op=hvd.Sum)
        if self.backend == "torch":
            out = t.clone()
            torch.distributed.all_reduce(out)
            return out
        return t.clone()

    def allreduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks in place (no copy: what ``lartpc bench
        allreduce`` times); returns ``t``."""
        if self.backend == "horovod":
            import horovod.torch as hvd

            return hvd.allreduce_(t, op=hvd.Sum)
        if self.backend == "torch":
            torch.distributed.all_reduce(t)
        return t

    def allgather_object(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order."""
        if self.backend == "horovod":
            import horovod.torch as hvd

            return hvd.allgather_object(obj, name="lartpc.allgather_object")
        if self.backend == "torch":
            out = [None] * self.size
            torch.distributed.all_gather_object(out, obj)
            return out
        return [obj]

    def allreduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over ranks."""
        return self.allreduce_sum(t) / self.size

    def broadcast_parameters(self, module: torch.nn.Module, root: int = 0) -> None:
        """Overwrite every rank's parameters and buffers with ``root``'s."""
        if self.backend == "horovod":
            import horovod.torch as hvd

            hvd.broadcast_parameters(module.state_dict(), root_rank=root)
        elif self.backend == "torch":
            for t in module.state_dict().values():
                torch.distributed.broadcast(t, src=root)

    def broadcast_optimizer_state(self, opt: torch.optim.Optimizer, root: int = 0) -> None:
        """Give every rank ``root``'s optimizer state (step counts, moments, lr).

        A fresh optimizer has no state, identical everywhere, so nothing is sent:
        Horovod would otherwise initialise it by taking a real step on zero gradients,
        which with weight decay moves every parameter and advances Adam's step count.
        """
        if not opt.state_dict()["state"]:
            return
        if self.backend == "horovod":
            import horovod.torch as hvd

            hvd.broadcast_optimizer_state(opt, root_rank=root)
        elif self.backend == "torch":
            box = [opt.state_dict() if self.rank == root else None]
            torch.distributed.broadcast_object_list(box, src=root)
            opt.load_state_dict(box[0])

    def broadcast_object(self, obj, root: int = 0):
        """Any picklable object from ``root`` to all ranks (other ranks may pass None)."""
        if self.backend == "horovod":
            import horovod.torch as hvd

            # Horovod names the exchange after type(obj) unless told: ranks passing
            # objects of different types (a message on root, None elsewhere) would wait
            # for each other forever.
            return hvd.broadcast_object(obj, root_rank=root, name="lartpc.broadcast_object")
        if self.backend == "torch":
            box = [obj]
            torch.distributed.broadcast_object_list(box, src=root)
            return box[0]
        return obj

    def allgather_object(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.backend == "horovod":
            import horovod.torch as hvd

            return hvd.allgather_object(obj, name="lartpc.allgather_object")
        if self.backend == "torch":
            out = [None] * self.size
            torch.distributed.all_gather_object(out, obj)
            return out
        return [obj]

    def distributed_model(self, module: torch.nn.Module, compression: str = "none"
                          ) -> torch.nn.Module:
        """``module`` as this backend trains it: in DistributedDataParallel for the torch
        backend (gradients averaged in buckets during backward, see
        :mod:`lartpc.dist.ddp`), unchanged otherwise (Horovod averages in its optimizer).

        Call it once every rank holds the same parameters (after the broadcast). The
        wrapped model's ``state_dict`` gains a ``module.`` prefix: save and load
        :func:`unwrap_model` of it.
        """
        _check_compression(compression)
        if self.backend != "torch":
            return module
        from lartpc.dist.ddp import wrap

        model, exchange = wrap(module, fp16=compression == "fp16")
        self._exchange[:] = [exchange]
        return model

    def distributed_optimizer(self, opt: torch.optim.Optimizer, module: torch.nn.Module,
                              compression: str = "none") -> torch.optim.Optimizer:
        """Wrap ``opt`` so ``step()`` uses gradients averaged over ranks (Horovod's
        DistributedOptimizer; the torch backend averages in :meth:`distributed_model`
        and returns ``opt`` as it is).

        ``compression="fp16"`` sends gradients as float16 (Horovod's Compression.fp16).
        """
        _check_compression(compression)
        if self.backend == "horovod":
            import horovod.torch as hvd

            comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
            return hvd.DistributedOptimizer(opt, named_parameters=module.named_parameters(),
                                            compression=comp, op=hvd.Average)
        return opt

    def watch_local_gradients(self, observer) -> bool:
        """Have ``observer(tensor)`` called with each bucket of this rank's gradient
        before it is averaged (False when this backend has no such buckets: then take
        the local gradient from per-parameter hooks). ``None`` stops the calls."""
        if not self._exchange:
            return False
        self._exchange[0].observer = observer
        return True

    def no_sync(self, model: torch.nn.Module):
        """Context for a backward pass whose gradients must not be exchanged."""
        return model.no_sync() if self._exchange and hasattr(model, "no_sync") \
            else nullcontext()

    def step_optimizer(self, opt: torch.optim.Optimizer, scaler=None) -> float:
        """Finish the gradient exchange, then update; returns the exchange's seconds
        not hidden behind backward (docs/run-folder.md, ``comm_s``).

        Horovod: the wait in ``synchronize()`` for the allreduces still running after
        backward. torch (DDP): backward itself waited for them; the time from the last
        bucket's hand-off to here (on CUDA after the device finished).

        With a ``torch.amp.GradScaler`` (fp16 training) the averaged gradients are
        unscaled and the step is skipped when any is inf/NaN; the check runs on the
        already averaged gradients, so every rank skips the same steps.
        """
        t0 = time.perf_counter()
        if self.backend == "horovod":
            opt.synchronize()
            comm = time.perf_counter() - t0
        elif self._exchange:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            comm = self._exchange[0].exposed_s()
        else:
            comm = 0.0
        # Horovod's wrapper would exchange again inside step() without this
        skip = opt.skip_synchronize() if self.backend == "horovod" else nullcontext()
        with skip:
            if scaler is None:
                opt.step()
            else:
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
        return comm

    def param_divergence(self, module: torch.nn.Module) -> float:
        """Largest |difference| between this job's ranks' parameters and rank 0's
        (summed over ranks, so 0.0 means every rank holds identical weights)."""
        flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in module.parameters()])
        if self.backend == "none":
            return 0.0
        ref = flat.clone()
        if self.backend == "horovod":
            import horovod.torch as hvd

            ref = hvd.broadcast(ref, root_rank=0)
        else:
            torch.distributed.broadcast(ref, src=0)
        return float(self.allreduce_sum((flat - ref).abs().max().reshape(1)))

    def shutdown(self) -> None:
        if self.backend == "horovod":
            import horovod.torch as hvd

            hvd.shutdown()
        elif self.backend == "torch" and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _check_compression(compression: str) -> None:
    if compression not in ("none", "fp16"):
        raise ConfigError(f"train.grad_compression={compression!r}: expected 'none' or 'fp16'")


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
        except ImportError as e:
            raise ConfigError(f"dist.backend=horovod but Horovod is not importable ({e}); "
                              "run `make install`") from e
        hvd.init()
        rank, local_rank, size = hvd.rank(), hvd.local_rank(), hvd.size()
        local_size = hvd.local_size()
    elif chosen == "torch":
        rank, local_rank, size = _torch_env()
        local_size = _int(os.environ, ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"), size)
    else:
        rank, local_rank, size, local_size = 0, 0, 1, 1

    # Pin before any CUDA or spconv call: spconv otherwise launches on GPU 0 for all ranks.
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")

    if chosen == "torch" and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="nccl" if use_cuda else "gloo", rank=rank, world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if use_cuda else None)
    world = World(rank=rank, local_rank=local_rank, size=size, backend=chosen,
                  local_size=local_size, device=dev)
    log.info("world: %d rank(s), backend %s, device %s", size, chosen, dev)
    return world


def _torch_env() -> tuple[int, int, int]:
    """Rank, local rank and size for torch.distributed; fills the env:// variables from
    SLURM's when the job was started by plain ``srun``."""
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        if "MASTER_ADDR" not in env:
            # as jobs/slurm/common.sh's lartpc_master: the step's first node, a port per job
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodes:
                raise ConfigError("srun with the torch backend needs MASTER_ADDR (the first "
                                  "host of the allocation); the sbatch scripts in jobs/slurm/ "
                                  "export it")
            env["MASTER_ADDR"] = first_host(nodes)
            env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
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
