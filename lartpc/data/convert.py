"""Upstream dense HDF5 (LArSoft converter output) -> sparse event store.

Upstream layout: ``image/wires`` int32 (N, planes, ticks, wires), gzip, one event per
chunk, and ``label/type`` int32 (N, 10) per-event *counts* of
``e-, e+, proton, pi0, pi+, pi-, mu-, mu+, K+, gamma``. The study's image is the last
(collection) plane with ticks summed in groups of 3, zero-padded to 3600 x 3600. Smaller
tick/wire counts (test files) are accepted and padded the same way.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lartpc import CLASSES
from lartpc.data.store import SHARD_PATTERN, Event, write_shard
from lartpc.errors import LartpcError
from lartpc.geometry import Geometry

log = logging.getLogger(__name__)
UPSTREAM_PARTICLES = ("e-", "e+", "proton", "pi0", "pi+", "pi-", "mu-", "mu+", "K+", "gamma")
#: upstream particle column -> (class name, PDG code); anything else is not a study class
CLASS_OF_COLUMN = {0: ("electron", 11), 1: ("electron", -11), 9: ("gamma", 22),
                   7: ("muon", -13), 4: ("pion", 211), 8: ("kaon", 321)}


@dataclass(slots=True)
class ConvertResult:
    paths: list[Path]
    converted: int
    skipped: int


def label_of(counts: np.ndarray) -> tuple[int, int] | None:
    """(class index, pdg) of a label count vector, or None unless it is exactly one
    particle of a study class."""
    counts = np.asarray(counts)
    if counts.sum() != 1 or counts.min() < 0:
        return None
    col = int(np.argmax(counts))
    if col not in CLASS_OF_COLUMN:
        return None
    name, pdg = CLASS_OF_COLUMN[col]
    return CLASSES.index(name), pdg


def dense_to_sparse(plane: np.ndarray, geom: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collection-plane (ticks, wires) ADC array -> sparse pixels of ``geom``."""
    g = geom.tick_group
    n_t = plane.shape[0] // g
    img = plane[: n_t * g].reshape(n_t, g, plane.shape[1]).sum(axis=1, dtype=np.int64)
    row, col = np.nonzero(img > 0)
    q = img[row, col].astype(np.float64)
    k = geom.downsample
    if k > 1:
        flat = (row // k) * geom.width + col // k
        uniq, inv = np.unique(flat, return_inverse=True)
        q = np.bincount(inv, weights=q)
        row, col = uniq // geom.width, uniq % geom.width
    return row.astype(np.int16), col.astype(np.int16), q.astype(np.float32)


def _open_upstream(path: Path):
    import h5py

    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as e:
        raise LartpcError(f"{path}: cannot open as HDF5 ({e})") from None
    for name in ("image/wires", "label/type"):
        if name not in f:
            f.close()
            raise LartpcError(f"{path}: missing dataset '{name}' (not an upstream LArSoft file)")
    w, lab = f["image/wires"], f["label/type"]
    if w.ndim != 4 or lab.ndim != 2 or lab.shape[1] != len(UPSTREAM_PARTICLES) \
            or lab.shape[0] != w.shape[0]:
        f.close()
        raise LartpcError(f"{path}: expected image/wires (N, planes, ticks, wires) and label/type "
                          f"(N, 10), got {w.shape} and {lab.shape}")
    return f


def convert(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
            downsample: int = 1, shard_size: int = 1000, overwrite: bool = False,
            progress: bool = False) -> ConvertResult:
    """Convert upstream files into ``out_dir/events-NNNNN.h5``, reading event by event.

    Parameters
    ----------
    inputs : upstream HDF5 files, converted in order.
    out_dir : output folder (created; must hold no shards unless ``overwrite``).
    downsample : bin factor K of the 3600 x 3600 image.
    shard_size : events per output file.
    overwrite : remove shards already in ``out_dir``.
    progress : show a progress bar.

    Returns
    -------
    ConvertResult with the written paths, converted and skipped event counts. Nothing
    is left behind on failure.
    """
    geom = Geometry(downsample=downsample)
    if shard_size <= 0:
        raise LartpcError(f"--shard-size: must be positive, got {shard_size}")
    files = [Path(p) for p in inputs]
    if not files:
        raise LartpcError("convert: no input files given")
    for p in files:  # fail before writing anything
        if not p.is_file():
            raise LartpcError(f"{p}: no such input file")
        f = _open_upstream(p)
        shp = f["image/wires"].shape
        f.close()
        if shp[2] // geom.tick_group > geom.full_size or shp[3] > geom.full_size:
            raise LartpcError(f"{p}: image/wires {shp} does not fit a {geom.full_size}-pixel image")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LartpcError(f"--out {out}: cannot create folder ({e.strerror})") from None
    old = [p for p in out.iterdir() if re.match(r"^events-\d{5}\.h5$", p.name)]
    if old and not overwrite:
        raise LartpcError(f"--out {out}: already holds event shards; choose an empty folder")
    for p in old:
        p.unlink()
    written: list[Path] = []
    buf: list[Event] = []
    converted = skipped = source_index = 0

    def flush() -> None:
        path = out / SHARD_PATTERN.format(len(written))
        write_shard(path, buf, geom, generator="lartpc.data.convert",
                    generator_version=",".join(p.name for p in files)[:1000])
        written.append(path)
        buf.clear()

    try:
        for p in files:
            f = _open_upstream(p)
            try:
                wires, labels = f["image/wires"], f["label/type"]
                it = range(wires.shape[0])
                if progress:
                    from tqdm import tqdm

                    it = tqdm(it, desc=p.name, unit="ev")
                for i in it:
                    lab = label_of(labels[i])
                    if lab is None:
                        skipped += 1
                    else:
                        row, col, q = dense_to_sparse(wires[i, -1], geom)
                        buf.append(Event(row, col, q, lab[0], {"pdg": lab[1]}, source_index))
                        converted += 1
                        if len(buf) == shard_size:
                            flush()
                    source_index += 1
            except OSError as e:
                raise LartpcError(f"{p}: cannot read event {source_index} ({e})") from None
            finally:
                f.close()
        if buf or not written:
            flush()
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    log.info("converted %d events, skipped %d (label not exactly one of %s)",
             converted, skipped, ", ".join(CLASSES))
    return ConvertResult(written, converted, skipped)
