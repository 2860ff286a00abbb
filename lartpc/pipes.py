"""A command whose output is piped into a reader that stops early (``lartpc sweep
--dry-run | head -1``) ends quietly, as ``cat`` does, instead of with a BrokenPipeError
traceback; a broken pipe that is not stdout's keeps its traceback."""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Callable

#: The exit status when the reader of stdout went away (``lartpc … | head``): 128 +
#: SIGPIPE, what the shell reports for ``cat`` or ``grep`` ended by SIGPIPE there, so a
#: ``set -o pipefail`` script that allows for theirs allows for ours; 1 would read as
#: a failure of the command itself.
EXIT_BROKEN_PIPE = 141


def ends_quietly(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or :data:`EXIT_BROKEN_PIPE` where it stopped because
    stdout's reader has gone."""
    try:
        with _flushed_stdout():
            return run()
    except BrokenPipeError:
        if not _stdout_gone():  # a subprocess's pipe, say: not ours to hide
            raise
        return _quiet_on_closed_stdout()


@contextlib.contextmanager
def _flushed_stdout():
    """Flush stdout on the way out (a return, or argparse's exit after ``--help``) so
    that a reader gone shows here, not as "Exception ignored" at the interpreter's exit;
    an error passes through as it is."""
    try:
        yield
    except SystemExit:
        _flush()
        raise
    _flush()


def _flush() -> None:
    if sys.stdout is not None:  # None where the command was started with stdout closed
        sys.stdout.flush()


def _stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (poll reports an error
    or hang-up on it), so that a BrokenPipeError is stdout's."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's capture)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _quiet_on_closed_stdout() -> int:
    """Stop quietly, as ``cat`` does, once stdout's reader has gone. Stdout is pointed at
    /dev/null first so that the interpreter's final flush of what is still buffered does
    not fail again (Python's docs, signal module, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
