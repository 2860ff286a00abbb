"""Stop requests from the scheduler or the user: SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP.

SLURM (``--signal``, preemption, ``scancel``) and LSF send one of these before they
kill a job; a closed terminal or ssh session sends SIGHUP (unless the training was
started under ``nohup``, whose ignored SIGHUP is left ignored). The handler only
records the request; the loop votes on it at the next step boundary, so all ranks stop
together, write a checkpoint and mark the run "preempted". A second SIGINT (Ctrl-C
twice) aborts at once.
"""

from __future__ import annotations

import logging
import signal
import threading

from lartpc.stopsignals import STOP_SIGNALS

log = logging.getLogger(__name__)


class StopRequests:
    """Installs the handlers; ``requested`` is the first signal received, or None."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequests:
        """Handle the stop signals (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup: the user asked for the training to outlive the terminal
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
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
