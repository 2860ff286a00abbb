"""Batches made in worker processes, handed back as one packed buffer each.

The sparse loader's threads share the training process's interpreter with the step: on a
GPU the graphed SCNet step waited 65 % of its time for a loader thread that built each
batch's index tables with the GIL taken in turn (BENCHMARKS.md, 2026-11-28). With
``data.loader_processes = N`` the batches, their tables included, are made on the CPU
in N processes forked from the loader, each with one torch thread, and come back packed
(:mod:`lartpc.data.packing`): one buffer per batch, one copy to the device, views of it
for every tensor.

:class:`Processes` is the pool: a call hands its arguments to a free process and waits
(the GIL released) for the result; as many calls may run at once as there are
processes, each from its own thread (the loader's prefetch threads, one per process).
An exception in a process is raised in the caller; a process that dies (killed, out of
memory) or makes no batch in :data:`BATCH_TIMEOUT_S` (hung) is an error naming it; a
call cut short (an exception in the caller's thread while it waits) ends its process,
whose reply would otherwise be taken for the next batch's. A process ends when the
loader's end of its pipe closes (every pool's processes close the other live pools'
ends, so no copy keeps it open), or when the loader's process is gone; one that does
not is killed. A process ignores the signals that stop
a training (a cluster's SIGTERM reaches every process of the job): the training stops
at its next step boundary and the processes end when its pipes close.

Forked, not spawned: a process starts in milliseconds with the loader's events already
in its memory (copy on write), where a spawned one would import torch again and be sent
the events. A forked process must not touch CUDA, and does not: it makes CPU tensors
only. As with torch's own DataLoader workers, forking after a library has registered
host memory with InfiniBand (an MPI under Horovod, say) may need the verbs library told
(``RDMAV_FORK_SAFE=1`` in the job's environment; not tried on such a cluster).

How a batch travels: each process has one slot of shared memory, mapped before the fork
so both sides see it without a name or a file descriptor; the process packs the batch
into its slot and sends back the skeleton, and the caller copies the slot out before the
process may make another batch: on the CPU with :func:`copy_out`; for a GPU straight to
the device, the first :data:`LOCKED_BYTES` of every slot page-locked with CUDA once
(:meth:`Processes.page_lock`), so the copy is one DMA from the slot, with no host copy
and no pinned memory allocated per batch. Sending each batch as a torch tensor between
processes instead costs a new shared-memory file per batch, its descriptor passed over a
socket and its pages faulted in. A batch larger than the slot (:data:`SLOT_BYTES`, ~10x
a 3600 x 3600 batch of 7) comes through the pipe instead, slower, and is logged.
"""

from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import queue
import signal
import traceback
import weakref
from collections.abc import Callable

import torch

from lartpc.data.packing import pack
from lartpc.errors import LartpcError
from lartpc.stopsignals import STOP_SIGNALS

log = logging.getLogger(__name__)


#: seconds between a waiting process's checks that the loader's process is still there
PARENT_POLL_S = 1.0
#: bytes of each process's slot: virtual memory, only what a batch writes is ever
#: touched (a batch of 7 at 3600 x 3600 with its tables is ~6 MB)
SLOT_BYTES = 64 << 20
#: bytes at the start of each slot page-locked for a GPU (:meth:`Processes.page_lock`):
#: locked memory is resident, so not the whole slot; a larger batch goes through a
#: page-locked copy of torch's first (``loaders._slot_to_device``), correct but slower
LOCKED_BYTES = 16 << 20


def _serve(make: Callable, conn, slot: mmap.mmap, loaders_ends: list, parent: int) -> None:
    """A process's loop: make one result per message received and pack it into the slot
    (or, too large for it, send it through the pipe), until the loader's end of the pipe
    closes or the loader's process is gone."""
    for sig in STOP_SIGNALS:  # the loader decides when to stop: the pipe's end says so
        signal.signal(sig, signal.SIG_IGN)
    for end in loaders_ends:  # the loader's ends of this and the earlier pipes, inherited
        end.close()
    torch.set_num_threads(1)
    into = torch.frombuffer(slot, dtype=torch.uint8)
    while True:
        try:  # another fork of the loader's process may hold this pipe open: look up
            while not conn.poll(PARENT_POLL_S):
                if os.getppid() != parent:
                    return
            args = conn.recv()
        except (EOFError, OSError):  # the loader is gone
            return
        try:
            buffer, skeleton = pack(make(*args), into=into)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            conn.send((False, None, _sendable(e)))
            continue
        if buffer.numel() == 0 or buffer.data_ptr() == into.data_ptr():
            conn.send((True, buffer.numel(), skeleton))
        else:
            conn.send((True, None, skeleton))
            conn.send_bytes(buffer.numpy())


def copy_out(view: torch.Tensor) -> torch.Tensor:
    """A copy of ``uint8`` ``view`` on the CPU, made in this thread alone: torch's own copy
    wakes its thread pool, whose threads then spin waiting for more work (~10 ms of CPU
    per 6 MB batch on the project's VM, against ~1 here)."""
    out = torch.empty(view.numel(), dtype=torch.uint8)
    out.numpy()[:] = view.numpy()
    return out


def _sendable(e: BaseException) -> BaseException:
    """``e`` if it pickles, else a RuntimeError with its traceback."""
    import pickle

    try:
        pickle.dumps(e)
        return e
    except Exception:  # noqa: BLE001 - whatever pickling raises
        return RuntimeError("".join(traceback.format_exception(e)))


def _unlock(locked: list) -> None:
    """Unregister the page-locked slots at ``locked`` (emptied), once no copy from them
    can still be on its way."""
    if not locked:
        return
    try:
        torch.cuda.synchronize()
        for ptr in locked:
            torch.cuda.cudart().cudaHostUnregister(ptr)
    except RuntimeError as e:  # CUDA already torn down (the program's end): nothing to undo
        log.debug("unlocking the loader processes' slots: %s", e)
    locked.clear()


#: the loader's ends of the pipes of every live pool of this process: a process forked
#: later closes them all, so that closing a pool's ends ends its processes at once (a
#: copy held by another pool's process would keep them waiting)
_LIVE_ENDS: dict[int, list] = {}
#: seconds a pool waits for a process's batch before calling it hung (a batch takes
#: milliseconds to a few seconds)
BATCH_TIMEOUT_S = 900.0


def _stop(key: int, procs: list, locked: list) -> None:
    _LIVE_ENDS.pop(key, None)
    _unlock(locked)
    for _, conn in procs:
        conn.close()
    for proc, _ in procs:
        proc.join(timeout=5)
        if proc.is_alive():  # stuck in a batch, or deaf: it ignores SIGTERM
            proc.kill()
            proc.join(timeout=5)


class Processes:
    """``n`` forked processes each running ``make(*args)`` for :meth:`__call__`."""

    def __init__(self, make: Callable, n: int, name: str = "loader",
                 slot_bytes: int = SLOT_BYTES):
        if n < 1:
            raise LartpcError(f"{name}: {n} processes; at least 1")
        ctx = multiprocessing.get_context("fork")
        self.name = name
        self._procs = []
        self._slots = []
        self._free: queue.Queue = queue.Queue()
        self._overflowed = False
        self._locked: list[int] = []  # data pointers of the slots page-locked for CUDA
        self._broken: dict[int, str] = {}  # process -> why it can serve no more batches
        ends: list = []
        _LIVE_ENDS[id(self)] = ends
        for j in range(n):
            slot = mmap.mmap(-1, slot_bytes, flags=mmap.MAP_SHARED)  # before the fork
            mine, theirs = ctx.Pipe()
            ends.append(mine)
            # closed in the process: this pool's ends and every other live pool's
            loaders_ends = [c for pool in _LIVE_ENDS.values() for c in pool]
            proc = ctx.Process(target=_serve, args=(make, theirs, slot, loaders_ends,
                                                    os.getpid()),
                               name=f"{name}-{j}", daemon=True)
            proc.start()
            theirs.close()
            self._procs.append((proc, mine))
            self._slots.append(torch.frombuffer(slot, dtype=torch.uint8))
            self._free.put(j)
        self._finalizer = weakref.finalize(self, _stop, id(self), list(self._procs),
                                           self._locked)

    def __len__(self) -> int:
        return len(self._procs)

    def __call__(self, *args, take: Callable = copy_out) -> tuple[torch.Tensor, object]:
        """``make(*args)`` in a free process: (``take`` of its packed buffer, the
        skeleton; :func:`~lartpc.data.packing.unpack` rebuilds the result). ``take``
        must copy: the slot is the process's again once this returns."""
        j = self._free.get()
        proc, conn = self._procs[j]
        answered = False  # False at the end: the reply may still be in the pipe
        try:
            if j in self._broken:
                answered = True
                raise LartpcError(f"{self.name}: process {proc.name} {self._broken[j]}")
            try:
                conn.send(args)
                self._wait(j)
                ok, nbytes, value = conn.recv()
                if ok and nbytes is None:
                    raw = torch.frombuffer(bytearray(conn.recv_bytes()), dtype=torch.uint8)
                answered = True
            except (EOFError, OSError) as e:
                answered = True  # the process is gone: every later call says so
                proc.join(timeout=1)
                raise LartpcError(f"{self.name}: process {proc.name} (pid {proc.pid}) ended "
                                  f"with exit code {proc.exitcode} while making a batch "
                                  f"(killed, or out of memory?)") from e
            if not ok:
                raise value
            if nbytes is None:
                if not self._overflowed:
                    self._overflowed = True
                    log.warning("%s: a batch of %.1f MB is larger than the processes' "
                                "slots (%.1f MB): such batches come through a pipe, slower",
                                self.name, raw.numel() / 1e6, self._slots[j].numel() / 1e6)
                return take(raw), value
            return take(self._slots[j][:nbytes]), value
        finally:
            if not answered:
                self._abandon(j, "was interrupted while making a batch (its reply unread)")
            self._free.put(j)

    def _wait(self, j: int) -> None:
        """Until process ``j``'s reply is in its pipe: a process that died with its pipe
        held open by another fork, or that made no batch in :data:`BATCH_TIMEOUT_S`, is
        an error."""
        proc, conn = self._procs[j]
        waited = 0.0
        while not conn.poll(PARENT_POLL_S):
            waited += PARENT_POLL_S
            if not proc.is_alive():
                raise EOFError
            if waited >= BATCH_TIMEOUT_S:
                self._abandon(j, f"made no batch in {BATCH_TIMEOUT_S:.0f} s (hung?)")
                raise LartpcError(f"{self.name}: process {proc.name} (pid {proc.pid}) made "
                                  f"no batch in {BATCH_TIMEOUT_S:.0f} s (hung?); it was ended")

    def _abandon(self, j: int, why: str) -> None:
        """Process ``j`` serves no more batches (a reply left unread would be taken for
        the next batch's): ended, and every later call on it raises ``why``."""
        proc, conn = self._procs[j]
        self._broken.setdefault(j, why)
        proc.kill()
        conn.close()

    def page_lock(self) -> bool:
        """Page-lock the first :data:`LOCKED_BYTES` of every slot with CUDA
        (``cudaHostRegister``), so that a copy to a GPU reads them by DMA; False, with a
        warning, where CUDA refuses (the copies then go through the driver's staging)."""
        cudart = torch.cuda.cudart()
        for slot in self._slots:
            nbytes = min(LOCKED_BYTES, slot.numel())
            err = int(cudart.cudaHostRegister(slot.data_ptr(), nbytes, 0))
            if err != 0:
                log.warning("%s: CUDA did not page-lock the processes' slots (cudaError "
                            "%d); batches reach the GPU from pageable memory, slower",
                            self.name, err)
                _unlock(self._locked)
                return False
            self._locked.append(slot.data_ptr())
        return True

    def close(self) -> None:
        """End the processes (also done when the pool is garbage or the program ends)
        and unlock the slots."""
        self._finalizer()
