"""The signals that ask a training to stop: SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP.

SIGUSR1 is what the job scripts ask SLURM for before the wall time
(``--signal=B:USR1@120``); SIGUSR2 is what LSF sends a job past its run limit (``bsub
-W``) before it kills it; SIGTERM is what schedulers send on ``scancel``/``bkill`` and
preemption, and what the job scripts pass on.

Here, below every layer, because two layers act on them: the training records them and
stops at its next step boundary (:mod:`lartpc.train.signals`), and the sparse loader's
processes ignore them and end with the training (:mod:`lartpc.data.processes`).
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT,
                signal.SIGHUP)
