"""``lartpc analyze fit|curves|confusion|report|predict RUN...``: the scaling analysis of
run folders (:mod:`lartpc.analysis`, torch-free; ``python -m lartpc.analysis`` is the
same without the rest of the command line)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lartpc.analysis.__main__ import add_commands

    add_commands(p)


def run(args: argparse.Namespace) -> int:
    from lartpc.analysis.__main__ import execute

    return execute(args)
