"""The signals that ask a training to stop: SIGTERM, SIGUSR1, SIGINT, SIGHUP.

Here, below every layer, because two layers act on them: the training records them and
stops at its next step boundary (:mod:`lartpc.train.signals`), and the sparse loader's
processes ignore them and end with the training (:mod:`lartpc.data.processes`).
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
