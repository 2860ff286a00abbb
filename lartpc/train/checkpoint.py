"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds only tensors and plain containers (dicts, lists, numbers, strings),
so it is read with ``torch.load(weights_only=True)``: a crafted ``checkpoint.pt``
cannot run code. RNG states are stored in that form too (numpy's as a tensor).
"""

from __future__ import annotations

import errno
import pickle
import random
from pathlib import Path

import numpy as np
import torch

from lartpc.errors import ConfigError
from lartpc.runfolder.durable import atomic_write
from lartpc.runfolder.schema import CHECKPOINT, RunFolderError


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
        atomic_write(path, lambda f: torch.save(state, f))
    except (OSError, RuntimeError) as e:
        # torch.save reports a full disk as RuntimeError (its writer's error), not OSError
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
    if not path.exists():
        return None
    return read(path)


def read(path: Path) -> dict:
    """The checkpoint in the file ``path`` (see :func:`load`)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise RunFolderError(
            f"{path}: refused: it holds objects that safe loading does not allow ({first}); "
            "a checkpoint written by lartpc before safe loading cannot be resumed: move it "
            "away to restart the run from step 0") from None
    except (OSError, RuntimeError, EOFError) as e:
        raise RunFolderError(f"{path}: cannot read the checkpoint ({e}); move it away "
                             "to restart the run from step 0") from None
    if not isinstance(state, dict) or "global_step" not in state:
        raise RunFolderError(f"{path}: not a lartpc checkpoint")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise RunFolderError(f"{path}: not a complete lartpc checkpoint (missing "
                             f"{', '.join(missing)}); move it away to restart the run "
                             "from step 0")
    return state


def init_weights(source: str, model: str, head: str = "flatten") -> tuple[dict, bool]:
    """The model weights of ``source`` (``train.init_from``: a checkpoint file or a run
    folder holding one), from a run of ``model``, and whether its head was left out:
    when ``source`` was trained with another ``model.head`` than ``head``, only the
    trunk's weights carry over (the head's shapes differ) and the head starts fresh.

    Raises
    ------
    ConfigError
        When there is no checkpoint there or it is another model's.
    RunFolderError
        When the file is not a readable lartpc checkpoint.
    """
    path = Path(source)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"train.init_from {source!r}: no checkpoint there (give a "
                          f"checkpoint file or a run folder holding {CHECKPOINT})")
    state = read(path)
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
    torch.set_rng_state(rng["torch"])
    n = rng["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = rng["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
