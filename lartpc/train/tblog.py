"""TensorBoard scalars of a run (``train.tensorboard = true``), written by rank 0 into
``<run>/tb/``.

The x axis is the global step: the row index in ``rank-NNN.csv``, so a curve in
TensorBoard and a line of the CSV name the same step. Every other rank, and every run
with the option off, gets a writer that does nothing, so the loop calls it unconditionally.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from lartpc.errors import ConfigError
from lartpc.fsutil import held_folder
from lartpc.runfolder.schema import TB_DIR

MISSING = ("train.tensorboard = true needs the tensorboard package; install the extra: "
           "pip install 'lartpc[tensorboard]' (or set train.tensorboard = false)")


def require() -> None:
    """Raise :class:`ConfigError` naming the extra when tensorboard is not installed."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"{MISSING} ({e})") from None


class TBLog:
    """Scalars for TensorBoard; a no-op when ``writer`` is None.

    Parameters
    ----------
    writer : torch.utils.tensorboard.SummaryWriter | None
        Where scalars go; None turns every method into a no-op.
    folder_fd : int | None
        The ``tb/`` folder the writer writes into, held open until :meth:`close`.
    """

    def __init__(self, writer=None, folder_fd: int | None = None):
        self.writer = writer
        self._folder_fd = folder_fd

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``{tag: value}`` at ``step`` (the hook for any later measurement, e.g.
        the gradient noise scale: ``tb.scalars(step, {"noise/b_simple": b})``)."""
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), step)

    def step(self, step: int, *, loss: float, acc: float, lr: float, images: int,
             step_s: float, data_s: float) -> None:
        """One training step: global loss and accuracy, learning rate, throughput.

        Parameters
        ----------
        step : int
            Global step, counted from 0 (the CSV row index).
        images : int
            Events this step processed over all ranks.
        step_s, data_s : float
            The step's wall time, and the part of it spent waiting for data.
        """
        if self.writer is None:
            return
        self.scalars(step, {
            "train/loss": loss, "train/accuracy": acc, "train/lr": lr,
            "perf/images_per_s": images / step_s if step_s > 0 else 0.0,
            "perf/data_wait_share": data_s / step_s if step_s > 0 else 0.0})

    def evaluation(self, step: int, row: dict) -> None:
        """An ``eval.csv`` row, at the last training step before the evaluation (a
        resume purges from the next step on, so the evaluation survives it)."""
        self.scalars(step, {"eval/loss": row["loss"], "eval/accuracy": row["accuracy"],
                            "eval/epoch": row["epoch"]})

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self._folder_fd is not None:
            os.close(self._folder_fd)
            self._folder_fd = None


def open_tblog(enabled: bool, is_root: bool, run: Path, start_step: int) -> TBLog:
    """The run's TensorBoard writer (a no-op unless ``enabled`` on rank 0).

    On resume (``start_step`` > 0, or 0 over earlier event files) a new event file is
    started in the same ``tb/`` with ``purge_step``: TensorBoard drops the earlier
    file's events at or after that step (logged after the checkpoint by the process that
    was stopped), so every step appears once and the steps stay monotonic.
    """
    if not (enabled and is_root):
        return TBLog()
    require()
    from torch.utils.tensorboard import SummaryWriter

    # TensorBoard reopens its event file by name for every write: it gets a name of the
    # tb/ checked here that a later swap of tb/ for a link does not redirect, and an
    # event file name nobody can plant a link at in advance.
    fd, tb = held_folder(run, TB_DIR, "the TensorBoard folder")
    try:
        # A restart from step 0 (killed before its first checkpoint) purges from step 0.
        stale = any(n.startswith("events.out.tfevents.") for n in os.listdir(fd))
        purge = start_step if start_step > 0 or stale else None
        writer = SummaryWriter(log_dir=tb, purge_step=purge, flush_secs=30,
                               filename_suffix=f".{secrets.token_hex(6)}")
    except BaseException:
        os.close(fd)
        raise
    return TBLog(writer, fd)
