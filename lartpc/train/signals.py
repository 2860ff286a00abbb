"""Stop requests from the scheduler or the user: SIGTERM, SIGUSR1, SIGINT.

SLURM (``--signal``, preemption, ``scancel``) and LSF send one of these before they
kill a job. The handler only records the request; the loop votes on it at the next
step boundary, so all ranks stop together, write a checkpoint and mark the run
"preempted". A second SIGINT (Ctrl-C twice) aborts at once.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


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
