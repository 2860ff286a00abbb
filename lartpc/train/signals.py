"""Stop requests from the scheduler or the user: SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP.

SLURM (``--signal``, preemption, ``scancel``) and LSF send one of these before they
kill a job; a closed terminal or ssh session sends SIGHUP (unless the training was
started under ``nohup``, whose ignored SIGHUP is left ignored). The handler only
records the request; the loop votes on it at the next step boundary, so all ranks stop
together, write a checkpoint and mark the run "preempted". A SIGINT after any stop
signal (Ctrl-C twice, or after a scheduler's SIGTERM) aborts at once, even when both
arrive within one step.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading

from lartpc.stopsignals import STOP_SIGNALS

log = logging.getLogger(__name__)


class StopRequests:
    """Installs the handlers; ``requested`` is the first signal received, or None."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, object] = {}
        self._arrivals: Arrivals | None = None

    def install(self) -> StopRequests:
        """Handle the stop signals (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        self._arrivals = Arrivals()
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup: the user asked for the training to outlive the terminal
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        # Python runs this once for all the deliveries of a signal that came while the
        # main thread was inside one C call (a step's torch kernels), and for different
        # signals in signal-number order: every delivery is acted on, in arrival order
        for sig in self._arrivals.take(signum, self._previous) if self._arrivals else [signum]:
            self._one(sig)

    def _one(self, signum: int) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested = signum
            log.warning("%s received: checkpointing at the next step, then stopping "
                        "(status preempted)", signal.Signals(signum).name)

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._arrivals is not None:
            self._arrivals.close()
            self._arrivals = None


class Arrivals:
    """Every delivery of a signal, in the order they came, read from the byte per
    delivery that CPython's C-level handler writes to the wakeup fd
    (``signal.set_wakeup_fd``), a pipe of ours while this is open; the previous wakeup
    fd comes back on :meth:`close`. Main thread only."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._unread: collections.deque[int] = collections.deque()
        #: deliveries acted on before their byte was read (see :meth:`take`)
        self._owed: collections.Counter[int] = collections.Counter()
        #: signals acted on from their bytes whose own handler call is still to come
        self._early: set[int] = set()
        _OPEN.add(self)

    def take(self, signum: int, handled) -> list[int]:
        """The deliveries to act on now, oldest first, as Python calls the handler for
        ``signum``: those of the signals in ``handled`` whose bytes came since the last
        call, whatever their number (a later call for one of them, made for deliveries
        already acted on here, then takes none of its own). A call that finds no byte
        for ``signum`` and none acted on before (the C handler of another thread not
        done writing it, or the pipe full) acts on one, and skips its byte later."""
        self._drain()
        ready: list[int] = []
        while self._unread:
            sig = self._unread.popleft()
            if sig not in handled:
                continue
            if self._owed[sig]:
                self._owed[sig] -= 1
                continue
            ready.append(sig)
            if sig != signum:
                self._early.add(sig)
        if signum not in ready and signum not in self._early:
            self._owed[signum] += 1
            ready.append(signum)
        self._early.discard(signum)
        return ready

    def _drain(self) -> None:
        while self._read >= 0:
            try:
                data = os.read(self._read, 4096)
            except BlockingIOError:
                return
            if not data:
                return
            self._unread.extend(data)

    def close(self) -> None:
        """Put the previous wakeup fd back and close the pipe."""
        if self._read < 0:
            return
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous)
        self._forget()

    def _forget(self) -> None:
        _OPEN.discard(self)
        for fd in (self._read, self._write):
            os.close(fd)
        self._read = self._write = -1


#: Open counters, dropped in a forked child: its C handler would write into (and its
#: handler read from) the parent's pipe, so one Ctrl-C to the process group (the
#: training and its loader processes) would count as several in the training.
_OPEN: set[Arrivals] = set()


def _after_fork_in_child() -> None:
    for arrivals in list(_OPEN):
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:  # forked from a thread other than the main one
            pass
        arrivals._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
