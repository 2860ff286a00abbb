"""The ``lartpc`` command. Each subcommand lives in its own module, imported only
when chosen, so ``lartpc --help`` never imports torch."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from lartpc import __version__
from lartpc.errors import LartpcError
from lartpc.helpformat import HelpFormatter
from lartpc.pipes import ends_quietly

#: name -> (module with add_arguments(parser) and run(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("lartpc.commands.env", "print versions of Python, torch, spconv, Horovod, ..."),
    "simulate": ("lartpc.commands.simulate", "generate synthetic single-particle events"),
    "convert": ("lartpc.commands.convert",
                "convert upstream dense HDF5 or larcv3 files to the event store"),
    "export": ("lartpc.commands.export", "write an event store as a larcv3 file"),
    "inspect": ("lartpc.commands.inspect", "summarise an event file or folder"),
    "display": ("lartpc.commands.display", "draw one event as wire-vs-time image"),
    "train": ("lartpc.commands.train",
              "train JishNet or SCNet (single process or under a launcher)"),
    "evaluate": ("lartpc.commands.evaluate",
                 "score a trained network on a store or on its held-out events made again"),
    "watch": ("lartpc.commands.watch",
              "live table of running trainings: step, loss, accuracy, images/s, ETA"),
    "bench": ("lartpc.commands.bench",
              "benchmarks that print JSON (simulate, convert, loader, model, train, "
              "minibatch, noise, allreduce)"),
    "sweep": ("lartpc.commands.sweep", "write job scripts for models x GPU counts x seeds"),
    "analyze": ("lartpc.commands.analyze",
                "scaling analysis of run folders: fit, curves, confusion, report, predict"),
}


def _chosen(argv: list[str], table: dict) -> tuple[str | None, list[str]]:
    """The first positional word of ``argv`` if it names a command, and what follows it."""
    for i, a in enumerate(argv):
        if not a.startswith("-"):
            return (a, argv[i + 1:]) if a in table else (None, [])
    return None, []


def add_commands(parser: argparse.ArgumentParser, table: dict[str, tuple[str, str]],
                 argv: list[str], dest: str) -> None:
    """Add one subparser per entry of ``table``, importing only the chosen module.

    A module with a ``KINDS`` table is a group: its entries become nested subcommands.
    """
    sub = parser.add_subparsers(dest=dest, metavar=dest.upper())
    chosen, rest = _chosen(argv, table)
    for name, (module_name, help_text) in table.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=HelpFormatter)
        if name != chosen:
            continue
        module = importlib.import_module(module_name)
        if hasattr(module, "KINDS"):
            add_commands(p, module.KINDS, rest, "kind")
        else:
            module.add_arguments(p)
            p.set_defaults(_run=module.run)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lartpc",
        description="Sparse-versus-dense CNN scaling study on LArTPC event images.",
    )
    parser.add_argument("--version", action="version", version=f"lartpc {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_commands(parser, COMMANDS, argv, "command")
    return parser


#: Set by the job scripts (jobs/slurm/common.sh) to a file where a process that ends
#: with exit 2 (refused, bad input) says so: launchers report a failed rank as exit 1
#: whatever its own code (torchrun always), and a refusal must not be requeued as a
#: crash would be.
EXIT_FILE_VAR = "LARTPC_EXIT_FILE"


def note_exit_2() -> None:
    """Record exit 2 in ``$LARTPC_EXIT_FILE`` when the job script asked for it (a
    failure to write is ignored: the exit code itself still says 2)."""
    path = os.environ.get(EXIT_FILE_VAR)
    if path:
        from lartpc.fsutil import atomic_write

        try:
            atomic_write(path, "2\n")
        except (OSError, LartpcError):
            pass


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv`` (default ``sys.argv[1:]``); returns the exit status
    (141, quietly, where stdout's reader has gone: :func:`lartpc.pipes.ends_quietly`)."""
    return ends_quietly(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    # torch and spconv each bring an OpenMP runtime; with both spinning for work on the
    # same cores, steps run several times slower. Passive waiting avoids that. Must be
    # set before either library is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):  # no command, or a group without its kind
        with contextlib.suppress(SystemExit):
            parser.parse_args([*argv, "--help"])  # help of the deepest group named
        return 2
    from lartpc.logs import setup_logging

    setup_logging(args.verbose)
    try:
        return int(args._run(args) or 0)
    except LartpcError as e:
        print(f"lartpc {args.command}: error: {e}", file=sys.stderr)
        note_exit_2()
        return 2
    except OSError as e:
        if e.filename is None:  # not about a path the user named: a bug or the system
            raise
        # a path that cannot be written or made (permissions, a file where a folder
        # goes): the user's to fix, said in one line; the writers leave nothing partial
        print(f"lartpc {args.command}: error: {os.fsdecode(e.filename)}: "
              f"{e.strerror or e}", file=sys.stderr)
        note_exit_2()
        return 2
    except KeyboardInterrupt:
        print(f"lartpc {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
