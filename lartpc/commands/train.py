"""``lartpc train``: one rank of a training run (any launcher, or none).

Everything a user can get wrong (config, data folder, geometry, run folder) is
checked before the distributed backend starts, so a bad job fails at once with one
message instead of leaving ranks waiting for each other.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True,
                        help="preset (paper-jishnet, paper-scnet, tiny-jishnet, tiny-scnet) "
                             "or a TOML file")
    parser.add_argument("--data", required=True, type=Path, help="event folder (lartpc simulate)")
    parser.add_argument("--out", required=True, type=Path,
                        help="run folder; an existing checkpoint there is resumed")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")


def run(args: argparse.Namespace) -> int:
    # time.time(), the clock of the step rows: analysis compares segment starts with
    # row times to tell restart gaps from steps (psutil's create time is another clock).
    process_start = time.time()
    from lartpc.config import load_config
    from lartpc.fsutil import output_folder

    cfg = load_config(args.config, args.overrides)
    out = output_folder(args.out)  # a link the user made to the folder: followed here only
    # torch (lartpc.train.run imports it: ~1.5 s) only once the config is known to be good:
    # a mistyped option is one line at once
    from lartpc.train.run import prepare, run_training

    store = prepare(cfg, args.data, out)
    return run_training(cfg, store, out, process_start)
