"""``lartpc train``: one rank of a training run (any launcher, or none).

Everything a user can get wrong (config, data folder, geometry, run folder) is
checked before the distributed backend starts, so a bad job fails at once with one
message instead of leaving ranks waiting for each other.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from lartpc.errors import ConfigError

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True,
                        help="preset (paper-jishnet, paper-scnet, tiny-jishnet, tiny-scnet) "
                             "or a TOML file")
    parser.add_argument("--data", required=True, type=Path, help="event folder (lartpc simulate)")
    parser.add_argument("--out", required=True, type=Path,
                        help="run folder; an existing checkpoint there is resumed")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")


#: Set by the job scripts (jobs/slurm/common.sh): the time (Unix seconds) at which they
#: worked out ``train.time_limit_s`` from the job's remaining wall time. The segment, and
#: its limit, count from there, so a slow launch (srun, torchrun, interpreters on a
#: shared file system) cannot push the training's own stop past the scheduler's warning.
LIMIT_FROM_VAR = "LARTPC_LIMIT_FROM"
#: an older value is not this job's (a shell that kept a job's environment): ignored
LIMIT_FROM_MAX_AGE_S = 3600.0


def segment_start(now: float) -> float:
    """When this segment starts for its time limit: ``now``, or the job script's
    ``$LARTPC_LIMIT_FROM`` where that is earlier and less than an hour old."""
    raw = os.environ.get(LIMIT_FROM_VAR, "")
    if not raw:
        return now
    try:
        since = float(raw)
    except ValueError:
        raise ConfigError(f"${LIMIT_FROM_VAR}={raw!r}: not a time in seconds") from None
    if not 0 <= now - since <= LIMIT_FROM_MAX_AGE_S:
        log.warning("$%s=%s is not within the last hour: the time limit counts from this "
                    "process's start", LIMIT_FROM_VAR, raw)
        return now
    return since


def run(args: argparse.Namespace) -> int:
    # time.time(), the clock of the step rows: analysis compares segment starts with
    # row times to tell restart gaps from steps (psutil's create time is another clock).
    process_start = segment_start(time.time())
    from lartpc.config import load_config
    from lartpc.fsutil import output_folder

    cfg = load_config(args.config, args.overrides)
    out = output_folder(args.out)  # a link the user made to the folder: followed here only
    # torch (lartpc.train.run imports it: ~1.5 s) only once the config is known to be good:
    # a mistyped option is one line at once
    from lartpc.train.run import prepare, run_training

    store = prepare(cfg, args.data, out)
    return run_training(cfg, store, out, process_start)
