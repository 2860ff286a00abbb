"""Compact weights: a trained network and what is needed to score it, nothing to resume.

A checkpoint (``checkpoint.pt``) holds the optimizer's moments, RNG states and counters:
20 MB for SCNet, most of it Adam's two moments. What a reader needs to reproduce a
quoted number is the network's parameters, its config (model options and the held-out
split: ``data.eval_fraction``, ``train.seed``) and which events it was trained on.
:func:`save` writes those (``weights.pt``), the parameters in float16 by default (half
the float32 size; :func:`save` does not check that predictions survive the rounding,
``lartpc evaluate`` against the run's ``confusion.csv`` does). :func:`load` reads a
weights file or a checkpoint, with the same CRC check as a checkpoint
(:func:`lartpc.train.checkpoint.verify_records`), and returns float32 parameters.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch

from lartpc.fsutil import atomic_write
from lartpc.runfolder.schema import CHECKPOINT, RunFolderError
from lartpc.train import checkpoint

WEIGHTS = "weights.pt"  #: the compact weights' file name in a run folder
FORMAT = "lartpc-weights"  #: the ``format`` field of a weights file
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
#: Fields copied from the checkpoint: the run's progress and its training time (s).
KEPT = ("epoch", "global_step", "world_size", "train_time_s", "eval_rows", "store")


def save(source: str | os.PathLike, out: str | os.PathLike, dtype: str = "float16",
         events: dict | None = None) -> Path:
    """Write the compact weights of ``source`` (a run folder or its ``checkpoint.pt``)
    to ``out``, parameters in ``dtype``; ``events`` says how the run's events are made
    again (``seed``, ``events``, ``geometry``, ``downsample``: see
    :func:`lartpc.train.evaluate.regenerate_held_out`).

    Raises
    ------
    RunFolderError
        When ``source`` holds no readable checkpoint, ``dtype`` is not one of
        :data:`DTYPES`, or ``out`` cannot be written (nothing is left there).
    """
    if dtype not in DTYPES:
        raise RunFolderError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    path = Path(source)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise RunFolderError(f"{source}: no {CHECKPOINT} there")
    state = checkpoint.read(path, "give a checkpoint lartpc wrote")
    model = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v
             for k, v in state["model"].items()}
    record = {"format": FORMAT, "version": 1, "dtype": dtype, "model": model,
              "config": state["config"], "events": dict(events or {}),
              **{k: state.get(k) for k in KEPT}}
    buf = io.BytesIO()
    torch.save(record, buf)
    try:
        atomic_write(Path(out), lambda f: f.write(buf.getbuffer()))
    except OSError as e:
        raise RunFolderError(f"{out}: cannot write ({e.strerror or e})") from None
    return Path(out)


def find(source: str | os.PathLike) -> Path:
    """The file to read for ``source``: itself, or a run folder's ``weights.pt`` (else
    its ``checkpoint.pt``)."""
    path = Path(source)
    if path.is_dir():
        for name in (WEIGHTS, CHECKPOINT):
            if (path / name).is_file():
                return path / name
        raise RunFolderError(f"{source}: no {WEIGHTS} or {CHECKPOINT} there")
    if not path.is_file():
        raise RunFolderError(f"{source}: no such file or run folder")
    return path


def load(source: str | os.PathLike,
         advice: str = "give weights or a checkpoint lartpc wrote") -> dict:
    """The network of ``source`` (a weights file, a checkpoint, or a run folder holding
    either; see :func:`find`): ``model`` (float32 parameters), ``config``, ``store``,
    ``events``, ``train_time_s``, ``eval_rows``, ``global_step``, ``dtype`` and ``path``;
    ``advice`` ends the message of a refusal.

    Raises
    ------
    RunFolderError
        When the file is missing, damaged (CRC), or neither a checkpoint nor a weights
        file lartpc wrote.
    """
    path = find(source)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RunFolderError(f"{path}: cannot read ({e.strerror or e})") from None
    checkpoint.verify_records(path, data, advice)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, OSError, RuntimeError, EOFError, ValueError, KeyError,
            TypeError, AttributeError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise RunFolderError(f"{path}: cannot read it ({first}); {advice}") from None
    if isinstance(state, dict) and state.get("format") != FORMAT and "global_step" in state:
        state = {**checkpoint.check(path, state, advice), "dtype": "float32", "events": {}}
    elif not (isinstance(state, dict) and state.get("format") == FORMAT
              and isinstance(state.get("model"), dict) and isinstance(state.get("config"), dict)
              and all(isinstance(v, torch.Tensor) for v in state["model"].values())):
        raise RunFolderError(f"{path}: not a lartpc weights file or checkpoint; {advice}")
    model = {k: v.float() if v.is_floating_point() else v for k, v in state["model"].items()}
    return {"model": model, "config": state["config"], "path": str(path),
            "dtype": state.get("dtype"), "events": state.get("events") or {},
            **{k: state.get(k) for k in KEPT}}
