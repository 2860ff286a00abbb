"""Checkpoints: everything needed to continue a run exactly where it stopped; when a
training saves one (:class:`Checkpointer`), what it holds, how it is written and read.

A checkpoint holds only tensors and plain containers (dicts, lists, numbers, strings),
so it is read with ``torch.load(weights_only=True)``: a crafted ``checkpoint.pt``
cannot run code. RNG states are stored in that form too (numpy's as a tensor).

``torch.save`` writes a zip archive that holds a CRC-32 of every record (the pickled
structure and each tensor's bytes), but ``torch.load`` checks none of them: a flipped
bit in a weight loads silently. :func:`read` checks every record's CRC before loading,
which covers checkpoints of every lartpc version, and then the fields' types and
ranges, so a damaged or crafted file is refused in one line instead of failing deep
inside the resume.

Every checkpoint says its layout in ``format_version`` (:data:`FORMAT_VERSION`); one
without the field is version 1 (the same layout, written before the field existed). A
version this lartpc does not know is refused with the versions it reads, so a newer
layout is never half-read: a change to the fields below raises the number, and
:func:`read` converts each older version it still accepts.
"""

from __future__ import annotations

import errno
import io
import math
import os
import pickle
import random
import time
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from lartpc.errors import ConfigError, LartpcError
from lartpc.fsutil import atomic_write, read_nofollow
from lartpc.runfolder.schema import CHECKPOINT, RunFolderError

if TYPE_CHECKING:
    from lartpc.dist import World
    from lartpc.train.sinks import Sink


def rng_state() -> dict:
    """torch, numpy and Python RNG states as tensors and plain containers."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(gauss)},
            "python": {"version": int(version), "internal": list(internal),
                       "gauss_next": gauss_next}}


#: The checkpoint layout :func:`write` writes; :func:`read` accepts 1 (no field) to this.
FORMAT_VERSION = 2


def write(run: Path, state: dict) -> Path:
    """Write ``state`` (see ``Trainer.state_dict``) as ``checkpoint.pt``, durably and
    atomically (rank 0 only).

    Raises
    ------
    RunFolderError
        When the file cannot be written (disk full, permissions); the temporary file
        is removed and the previous checkpoint is left as it was.
    """
    path = Path(run) / CHECKPOINT
    try:
        # serialised in memory first: torch.save's own file writer reports a full disk
        # as "[enforce fail at inline_container.cc:...]"; a plain write says ENOSPC
        buf = io.BytesIO()
        torch.save({**state, "format_version": FORMAT_VERSION}, buf)
        atomic_write(path, lambda f: f.write(buf.getbuffer()))
    except (OSError, RuntimeError) as e:
        reason = (e.strerror or errno.errorcode.get(e.errno or 0, str(e))
                  if isinstance(e, OSError) else str(e).splitlines()[0])
        raise RunFolderError(f"{path}: cannot write the checkpoint ({reason}); "
                             "the previous checkpoint is kept") from None
    return path


#: What a resume reads from a checkpoint (``scaler`` and ``store`` may be absent).
REQUIRED = ("model", "optimizer", "epoch", "step_in_epoch", "global_step", "world_size",
            "config", "eval_rows", "train_time_s", "rng")


def load(run: Path) -> dict | None:
    """The checkpoint of ``run``, or None when there is none.

    Raises
    ------
    RunFolderError
        When the file holds anything but tensors and plain containers (a checkpoint
        from before safe loading, or a crafted file), or cannot be read.
    """
    path = Path(run) / CHECKPOINT
    if not os.path.lexists(path):
        return None
    return read(path, follow_link=False)  # a run's own checkpoint is never a link


#: What a refusal suggests for a run's own checkpoint.
MOVE_AWAY = "move it away to restart the run from step 0"


def read(path: Path, advice: str = MOVE_AWAY, follow_link: bool = True) -> dict:
    """The checkpoint in the file ``path`` (see :func:`load`), its records' CRCs and its
    fields checked (:func:`verify_records`, :func:`check_fields`); ``advice`` ends the
    message of a refusal. ``follow_link=False`` refuses a symbolic link at ``path``
    (:class:`~lartpc.fsutil.UnsafePathError`): a run's own checkpoint, where
    a link is someone else's file; a file the user names (``train.init_from``) may be
    one."""
    try:
        data = Path(path).read_bytes() if follow_link else read_nofollow(path)
    except OSError as e:
        raise RunFolderError(f"{path}: cannot read the checkpoint ({e.strerror or e})") from None
    verify_records(path, data, advice)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise RunFolderError(
            f"{path}: refused: it holds objects that safe loading does not allow ({first}); "
            "a checkpoint written by lartpc before safe loading cannot be resumed: move it "
            "away to restart the run from step 0") from None
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, TypeError,
            AttributeError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunFolderError(f"{path}: cannot read the checkpoint ({first}); {advice}") \
            from None
    return check(path, state, advice)


def check(path: Path, state: object, advice: str = MOVE_AWAY) -> dict:
    """``state``, as ``torch.load`` gave it from ``path``, if it is a checkpoint this
    lartpc reads: its format version, its fields (:func:`check_fields`); else
    :class:`RunFolderError` naming ``path``, ending with ``advice``."""
    if not isinstance(state, dict) or "global_step" not in state:
        raise RunFolderError(f"{path}: not a lartpc checkpoint")
    version = state.get("format_version", 1)  # version 1 wrote no such field
    if not _count(version) or not 1 <= version <= FORMAT_VERSION:
        raise RunFolderError(f"{path}: checkpoint format_version {version!r}: this lartpc "
                             f"reads versions 1 to {FORMAT_VERSION} (a newer lartpc wrote it?); "
                             f"{advice}")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise RunFolderError(f"{path}: not a complete lartpc checkpoint (missing "
                             f"{', '.join(missing)}); {advice}")
    check_fields(path, state, advice)
    return state


def verify_records(path: Path, data: bytes, advice: str = MOVE_AWAY) -> None:
    """Check the CRC-32 of every record of the zip archive ``data`` (``torch.save``'s
    format); raise :class:`RunFolderError` naming ``path`` and the damaged record."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
            NotImplementedError, zlib.error) as e:
        raise RunFolderError(f"{path}: not a checkpoint torch.save wrote, or damaged ({e}); "
                             f"{advice}") from None
    if bad is not None:
        raise RunFolderError(f"{path}: damaged: record {bad} fails its CRC-32 check; "
                             f"{advice}")


def _count(value) -> bool:
    """A whole number from 0 below 2**53 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 53


def check_fields(path: Path, state: dict, advice: str = MOVE_AWAY) -> None:
    """Refuse a checkpoint whose fields have the wrong types or ranges (a crafted or
    damaged file), naming the first such field; the RNG states are tried out."""
    model, opt, rows = state["model"], state["optimizer"], state["eval_rows"]
    problems = {
        "model": isinstance(model, dict)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()),
        "optimizer": isinstance(opt, dict) and isinstance(opt.get("state"), dict)
        and isinstance(opt.get("param_groups"), list),
        "epoch": _count(state["epoch"]),
        "step_in_epoch": _count(state["step_in_epoch"]),
        "global_step": _count(state["global_step"]),
        "world_size": _count(state["world_size"]) and state["world_size"] >= 1,
        "config": isinstance(state["config"], dict)
        and all(isinstance(k, str) and isinstance(v, dict) for k, v in state["config"].items()),
        "eval_rows": isinstance(rows, list)
        and all(isinstance(r, dict) and _count(r.get("epoch")) for r in rows),
        "train_time_s": isinstance(state["train_time_s"], int | float)
        and not isinstance(state["train_time_s"], bool)
        and math.isfinite(state["train_time_s"]) and state["train_time_s"] >= 0,
        "scaler": state.get("scaler") is None or isinstance(state["scaler"], dict),
        "padded_sizes": state.get("padded_sizes") is None or (
            isinstance(state["padded_sizes"], list) and len(state["padded_sizes"]) > 0
            and all(_count(n) and n > 0 for n in state["padded_sizes"])),
        "store": state.get("store") is None or (
            isinstance(state["store"], dict) and _count(state["store"].get("events"))
            and isinstance(state["store"].get("sha256"), str)),
    }
    bad = [k for k, ok in problems.items() if not ok]
    if not bad and state["step_in_epoch"] > state["global_step"]:
        bad = ["step_in_epoch"]
    if bad:
        k = bad[0]
        shown = repr(state[k] if k in state else None)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise RunFolderError(f"{path}: field {k} = {shown} is not what lartpc writes; "
                             f"{advice}")
    saved = rng_state()
    try:
        restore_rng(state)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError,
            OverflowError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunFolderError(f"{path}: field rng is not what lartpc writes ({first}); "
                             f"{advice}") from None
    finally:
        restore_rng({"rng": saved})


def load_init_weights(net: torch.nn.Module, source: str, model: str,
                      head: str = "flatten") -> bool:
    """:func:`init_weights` of ``source`` loaded into ``net`` (a ``model``); whether its
    head was left fresh.

    Raises
    ------
    ConfigError
        As :func:`init_weights`, and when the weights do not fit ``net`` (another
        resolution, architecture or model options).
    """
    weights, head_fresh = init_weights(source, model, head)
    try:
        missing, unexpected = net.load_state_dict(weights, strict=not head_fresh)
    except RuntimeError as e:  # other shapes: another resolution or architecture
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"train.init_from {source!r}: its weights do not fit this "
                          f"model ({first}); same model.name, data.downsample and "
                          "model options are needed") from None
    odd = [k for k in missing if not k.startswith("head.")] + unexpected
    if odd:
        raise ConfigError(f"train.init_from {source!r}: its weights do not fit this "
                          f"model (missing or unexpected: {', '.join(odd)})")
    return head_fresh


def init_weights(source: str, model: str, head: str = "flatten") -> tuple[dict, bool]:
    """The model weights of ``source`` (``train.init_from``: a checkpoint file, a compact
    weights file (:mod:`lartpc.train.weights`) or a run folder holding either), from a
    run of ``model``, and whether its head was left out:
    when ``source`` was trained with another ``model.head`` than ``head``, only the
    trunk's weights carry over (the head's shapes differ) and the head starts fresh.

    Raises
    ------
    ConfigError
        When there is no checkpoint there or it is another model's.
    RunFolderError
        When the file is not a readable lartpc checkpoint.
    """
    from lartpc.train.weights import WEIGHTS
    from lartpc.train.weights import load as load_weights

    path = Path(source)
    if path.is_dir():
        path = path / CHECKPOINT if (path / CHECKPOINT).is_file() else path / WEIGHTS
    if not path.is_file():
        raise ConfigError(f"train.init_from {source!r}: no checkpoint there (give a "
                          f"checkpoint file, a weights file or a run folder holding "
                          f"{CHECKPOINT} or {WEIGHTS})")
    # a checkpoint (checked as one) or compact weights
    state = load_weights(path, "train.init_from needs a checkpoint lartpc wrote")
    theirs = state["config"].get("model", {}).get("name")
    if theirs != model:
        raise ConfigError(f"train.init_from {source!r}: a {theirs} checkpoint cannot "
                          f"start a {model} run")
    weights = state["model"]
    if state["config"]["model"].get("head", "flatten") == head:
        return weights, False
    return {k: v for k, v in weights.items() if not k.startswith("head.")}, True


def restore_rng(state: dict) -> None:
    """Set torch, numpy and Python RNGs to a checkpoint's states."""
    rng = state["rng"]
    if not isinstance(rng, dict):
        raise TypeError(f"a {type(rng).__name__}, not a dict")
    torch.set_rng_state(rng["torch"])
    n = rng["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = rng["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


class Checkpointer:
    """Saves ``checkpoint.pt`` every ``checkpoint_every_steps`` steps, else every
    ``checkpoint_every_s`` seconds, and at the points the loop asks for.

    Every log is on disk before the checkpoint that counts its rows, so a resume never
    finds a log behind its checkpoint; a rank that cannot write makes every rank raise
    (none waits for it in a collective forever).
    """

    def __init__(self, world: World, run, every_steps: int, every_s: float):
        self.world, self.run = world, run
        self.every_steps, self.every_s = every_steps, every_s
        self.last_time = time.time()

    def due(self, global_step: int) -> bool:
        """This rank's wish to save once ``global_step`` steps are done. The time rule
        reads this rank's clock: the loop votes on it with the step
        (:class:`~lartpc.train.state.StepVote`), never acts on it alone."""
        if self.every_steps:
            return global_step % self.every_steps == 0
        return time.time() - self.last_time > self.every_s

    def save(self, trainer, sinks: Sink) -> None:
        # counted after the write: a checkpoint holds the time of those before it
        t_start, error = time.perf_counter(), None
        # any write error (a refused link, TensorBoard's OSError), not only the run
        # folder's own: a rank raising alone would leave the others in a collective
        try:
            sinks.flush()
        except (LartpcError, OSError) as e:
            error = e
        self._agree(error, "its logs")
        if self.world.is_root:
            try:
                write(self.run, trainer.state_dict())
            except (LartpcError, OSError) as e:
                error = e
        self._agree(error, CHECKPOINT)
        self.last_time = time.time()
        trainer.saved_step = trainer.state.global_step
        took = time.perf_counter() - t_start
        trainer.state.checkpoint_time_s += took
        trainer.timing.saved(took)  # every rank: each votes on its own clock

    def _agree(self, error: Exception | None, what: str) -> None:
        """Raise on every rank when any rank failed to write."""
        failed = self.world.allreduce_sum(torch.tensor([0.0 if error is None else 1.0]))
        if float(failed[0]) > 0:
            raise error or RunFolderError(f"{self.run}: another rank could not write {what}")
