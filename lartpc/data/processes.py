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
whose reply would otherwise be taken for the next batch's; a call whose iteration ended
(its ``stop`` event set: the epoch stopped early, a preemption's checkpoint to write)
stops waiting within :data:`PARENT_POLL_S`, and the next call on its process discards
that reply first. A batch that does not pickle, or an exception that does not come back
whole through a pickle, reaches the caller as a RuntimeError with the process's
traceback. A process ends when the
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
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler

import torch

from lartpc.data.packing import pack
from lartpc.errors import LartpcError
from lartpc.stopsignals import STOP_SIGNALS

log = logging.getLogger(__name__)


#: seconds between a waiting process's checks that the loader's process is still there,
#: and between a waiting caller's checks on its process and on its ``stop``
PARENT_POLL_S = 1.0
#: bytes of each process's slot: virtual memory, only what a batch writes is ever
#: touched (a batch of 7 at 3600 x 3600 with its tables is ~6 MB)
SLOT_BYTES = 64 << 20
#: bytes at the start of each slot page-locked for a GPU (:meth:`Processes.page_lock`):
#: locked memory is resident, so not the whole slot; a larger batch goes through a
#: page-locked copy of torch's first (``loaders._slot_to_device``), correct but slower
LOCKED_BYTES = 16 << 20
#: seconds a pool waits for a process's batch before calling it hung (a batch takes
#: milliseconds to a few seconds)
BATCH_TIMEOUT_S = 900.0


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
        reply, overflow = _reply(make, args, into)
        conn.send_bytes(reply)
        if overflow is not None:
            conn.send_bytes(overflow.numpy())


def _reply(make: Callable, args: tuple, into: torch.Tensor) -> tuple[bytes, torch.Tensor | None]:
    """(the pickled reply to ``args``, the buffer to send after it where the batch did
    not fit in the slot ``into``, else None). A failure of ``make``, or a batch that
    does not pickle, is a reply too: the caller raises it."""
    try:
        buffer, skeleton = pack(make(*args), into=into)
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
        return _failure(e), None
    in_slot = buffer.numel() == 0 or buffer.data_ptr() == into.data_ptr()
    try:
        return (_pickled((True, buffer.numel() if in_slot else None, skeleton)),
                None if in_slot else buffer)
    except Exception as e:  # noqa: BLE001 - whatever pickling raises
        return _failure(RuntimeError("the batch made does not pickle, so it cannot be sent "
                                     "back:\n" + "".join(traceback.format_exception(e)))), None


def _pickled(reply: tuple) -> bytes:
    """``reply`` pickled as :meth:`Connection.send` pickles, and checked to unpickle:
    what fails to unpickle in the caller (an exception whose ``__init__`` takes other
    arguments than its ``args``) would fail there, in the middle of the pipe's traffic."""
    message = bytes(ForkingPickler.dumps(reply))
    ForkingPickler.loads(message)
    return message


def copy_out(view: torch.Tensor) -> torch.Tensor:
    """A copy of ``uint8`` ``view`` on the CPU, made in this thread alone: torch's own copy
    wakes its thread pool, whose threads then spin waiting for more work (~10 ms of CPU
    per 6 MB batch on the project's VM, against ~1 here)."""
    out = torch.empty(view.numel(), dtype=torch.uint8)
    out.numpy()[:] = view.numpy()
    return out


def _failure(e: BaseException) -> bytes:
    """The pickled reply for failure ``e``: ``e`` where it comes back whole through a
    pickle, else a RuntimeError with its traceback."""
    try:
        return _pickled((False, None, e))
    except Exception:  # noqa: BLE001 - whatever pickling or unpickling raises
        return _pickled((False, None, RuntimeError("".join(traceback.format_exception(e)))))


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


def _stop(key: int, procs: list, locked: list) -> None:
    _LIVE_ENDS.pop(key, None)
    _unlock(locked)
    for _, conn in procs:
        conn.close()
    deadline = time.monotonic() + 5  # for them all: hung ones are not waited for in turn
    for proc, _ in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc, _ in procs:
        if proc.is_alive():  # stuck in a batch, or deaf: it ignores SIGTERM
            proc.kill()
            proc.join(timeout=5)


class Stopped(LartpcError):
    """A call that stopped waiting for its batch: the caller's iteration ended."""


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
        self._owed: set[int] = set()  # processes whose reply to the last call is unread
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

    def __call__(self, *args, take: Callable = copy_out,
                 stop: threading.Event | None = None) -> tuple[torch.Tensor, object]:
        """``make(*args)`` in a free process: (``take`` of its packed buffer, the
        skeleton; :func:`~lartpc.data.packing.unpack` rebuilds the result). ``take``
        must copy: the slot is the process's again once this returns. Once ``stop`` is
        set (the caller's iteration ended) the call stops waiting and raises
        :class:`Stopped`; the process's reply, when it comes, is discarded by the next
        call on it."""
        j = self._free.get()
        proc, conn = self._procs[j]
        clean = False  # False at the end: part of a reply may still be in the pipe
        try:
            if j in self._broken:
                clean = True
                raise LartpcError(f"{self.name}: process {proc.name} {self._broken[j]}")
            try:
                if j in self._owed:  # the reply to a call that stopped waiting: discarded
                    self._receive(j, stop)
                conn.send(args)
                self._owed.add(j)
                ok, nbytes, value, raw = self._receive(j, stop)
                clean = True
            except Stopped:
                clean = True  # nothing of the reply read: the next call discards it
                raise
            except (EOFError, OSError) as e:
                clean = True  # the process is gone: every later call says so
                proc.join(timeout=1)
                raise LartpcError(f"{self.name}: process {proc.name} (pid {proc.pid}) ended "
                                  f"with exit code {proc.exitcode} while making a batch "
                                  f"(killed, or out of memory?)") from e
            if not ok:
                raise value
            if raw is not None:
                if not self._overflowed:
                    self._overflowed = True
                    log.warning("%s: a batch of %.1f MB is larger than the processes' "
                                "slots (%.1f MB): such batches come through a pipe, slower",
                                self.name, raw.numel() / 1e6, self._slots[j].numel() / 1e6)
                return take(raw), value
            return take(self._slots[j][:nbytes]), value
        finally:
            if not clean:
                self._abandon(j, "was interrupted while making a batch (its reply unread)")
            self._free.put(j)

    def _receive(self, j: int, stop: threading.Event | None) -> tuple:
        """Process ``j``'s reply (ok, bytes in its slot, skeleton or exception, the
        buffer sent through the pipe or None), once it comes."""
        conn = self._procs[j][1]
        self._wait(j, stop)
        ok, nbytes, value = conn.recv()
        raw = None
        if ok and nbytes is None:
            raw = torch.frombuffer(bytearray(conn.recv_bytes()), dtype=torch.uint8)
        self._owed.discard(j)
        return ok, nbytes, value, raw

    def _wait(self, j: int, stop: threading.Event | None = None) -> None:
        """Until process ``j``'s reply is in its pipe: a process that died with its pipe
        held open by another fork, or that made no batch in :data:`BATCH_TIMEOUT_S`, is
        an error; ``stop`` set raises :class:`Stopped`."""
        proc, conn = self._procs[j]
        waited = 0.0
        while not conn.poll(PARENT_POLL_S):
            waited += PARENT_POLL_S
            if stop is not None and stop.is_set():
                raise Stopped(f"{self.name}: stopped waiting for process {proc.name}'s batch "
                              f"(the iteration ended)")
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
