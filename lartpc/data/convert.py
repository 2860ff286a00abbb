"""Upstream dense HDF5 (LArSoft converter output) -> sparse event store.

Upstream layout: ``image/wires`` int32 (N, planes, ticks, wires), gzip, one event per
chunk, and ``label/type`` int32 (N, 10) per-event *counts* of
``e-, e+, proton, pi0, pi+, pi-, mu-, mu+, K+, gamma``. The study's image is the last
(collection) plane with ticks summed in groups of 3, zero-padded to 3600 x 3600. Smaller
tick/wire counts (test files) are accepted and padded the same way.

The real files are chunked ten events per chunk (10 x 3 x 9600 x 3600 int32, ~4 GB
before deflate). Reading one event at a time through HDF5's default 1 MiB chunk cache
would decompress every chunk ten times, so events are read in blocks aligned with the
chunks along the event axis: each chunk is decompressed once, at the cost of holding one
block of collection planes (10 x 9600 x 3600 int32 = 1.4 GB) in memory.

Time origin: upstream recorded 6,400 ticks with a -400 us trigger offset, so x = 0 sits
at tick 800 (time pixel ~267); the generator puts it at tick 3,200 (pixel ~1,067, the
SPEC's 2.2-drift-time window with a pretrigger of one third). ``time_origin="file"``
keeps the file's ticks; ``"generator"`` shifts them so x = 0 lands where the generator
puts it. Charge: the file holds ADC counts, summed over 3 ticks here; the generator
stores 10^3 electrons. ``charge_scale`` multiplies the summed ADC (1 = raw sums); to
compare with simulation use (electrons per ADC count) / 1000, a calibration the user
supplies for their files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lartpc import CLASSES
from lartpc.cliparse import check_positive, geometry_of
from lartpc.data.staging import check_input_file, existing_shards, replace_store
from lartpc.data.store import Event, ShardBuffer
from lartpc.errors import LartpcError
from lartpc.geometry import Geometry

log = logging.getLogger(__name__)
UPSTREAM_PARTICLES = ("e-", "e+", "proton", "pi0", "pi+", "pi-", "mu-", "mu+", "K+", "gamma")
#: upstream particle column -> (class name, PDG code); anything else is not a study class
CLASS_OF_COLUMN = {0: ("electron", 11), 1: ("electron", -11), 9: ("gamma", 22),
                   7: ("muon", -13), 4: ("pion", 211), 8: ("kaon", 321)}
#: upstream trigger: -400 us at 2 MHz, i.e. x = 0 arrives at tick 800
UPSTREAM_TRIGGER_TICK = 800
TIME_ORIGINS = ("file", "generator")


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


def dense_to_sparse(plane: np.ndarray, geom: Geometry, *, row_shift: int = 0,
                    charge_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collection-plane (ticks, wires) ADC array -> sparse pixels of ``geom``.

    ``row_shift`` moves every time pixel (full resolution); pixels pushed outside the
    image are dropped. ``charge_scale`` multiplies the summed ADC.
    """
    g = geom.tick_group
    n_t = plane.shape[0] // g
    # integer ADC summed exactly; a float image (some files store ADC as floats) in float
    total = np.float64 if plane.dtype.kind == "f" else np.int64
    img = plane[: n_t * g].reshape(n_t, g, plane.shape[1]).sum(axis=1, dtype=total)
    row, col = np.nonzero(img > 0)
    q = img[row, col].astype(np.float64) * charge_scale
    if row_shift:
        row = row + row_shift
        ok = (row >= 0) & (row < geom.full_size)
        row, col, q = row[ok], col[ok], q[ok]
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
        if not isinstance(f.get(name), h5py.Dataset):
            f.close()
            raise LartpcError(f"{path}: missing dataset '{name}' (not an upstream LArSoft file)")
    w, lab = f["image/wires"], f["label/type"]
    # read before closing: a closed file's datasets no longer know their shapes
    shapes, kinds = (w.shape, lab.shape), (w.dtype.kind, lab.dtype.kind)
    if w.ndim != 4 or lab.ndim != 2 or lab.shape[1] != len(UPSTREAM_PARTICLES) \
            or lab.shape[0] != w.shape[0]:
        f.close()
        raise LartpcError(f"{path}: expected image/wires (N, planes, ticks, wires) and label/type "
                          f"(N, 10), got {shapes[0]} and {shapes[1]}")
    for name, kind, allowed, what in (("image/wires", kinds[0], "iuf", "numbers"),
                                      ("label/type", kinds[1], "iu", "integer counts")):
        if kind not in allowed:
            dtype = f[name].dtype
            f.close()
            raise LartpcError(f"{path}: dataset '{name}' holds {dtype}, expected {what}")
    return f


def row_shift_for(time_origin: str, geom: Geometry,
                  trigger_tick: int = UPSTREAM_TRIGGER_TICK) -> int:
    """Full-resolution time-pixel shift that implements ``time_origin``.

    ``"file"``: 0. ``"generator"``: (generator pretrigger - file trigger tick) / tick
    group, e.g. (3200 - 800) / 3 = 800 pixels, moving x = 0 from pixel ~267 to ~1,067.
    """
    if time_origin not in TIME_ORIGINS:
        raise LartpcError(f"--time-origin {time_origin!r}: choose one of {', '.join(TIME_ORIGINS)}")
    if time_origin == "file":
        return 0
    if trigger_tick < 0:
        raise LartpcError(f"--trigger-tick: must be >= 0, got {trigger_tick}")
    return round((geom.pretrigger_ticks - trigger_tick) / geom.tick_group)


def _blocks(wires) -> list[tuple[int, int]]:
    """Event ranges ``[b0, b1)`` aligned with the dataset's chunks along the event axis."""
    n = wires.shape[0]
    step = wires.chunks[0] if wires.chunks else 1
    return [(b0, min(b0 + step, n)) for b0 in range(0, n, step)]


def convert(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
            downsample: int = 1, shard_size: int = 1000, overwrite: bool = False,
            progress: bool = False, time_origin: str = "file",
            trigger_tick: int = UPSTREAM_TRIGGER_TICK, charge_scale: float = 1.0
            ) -> ConvertResult:
    """Convert upstream files into ``out_dir/events-NNNNN.h5``, one chunk-row at a time.

    Parameters
    ----------
    inputs : upstream HDF5 files, converted in order.
    out_dir : output folder (created; must hold no shards unless ``overwrite``).
    downsample : bin factor K of the 3600 x 3600 image.
    shard_size : events per output file.
    overwrite : replace the shards already in ``out_dir`` (once the new ones are all
        written, so a failed conversion keeps the old store).
    progress : show a progress bar.
    time_origin : ``"file"`` (keep the file's ticks) or ``"generator"`` (shift so that
        x = 0 lands on the generator's time pixel; see :func:`row_shift_for`).
    trigger_tick : tick of x = 0 in the files (upstream: 800 = 400 us at 2 MHz).
    charge_scale : factor on the summed ADC (e.g. electrons per ADC / 1000 to compare
        with simulated charge in 10^3 electrons); 1 keeps raw sums.

    Returns
    -------
    ConvertResult with the written paths, converted and skipped event counts. Nothing
    is left behind on failure.
    """
    geom = geometry_of(downsample)
    check_positive(shard_size, "--shard-size")
    if not (np.isfinite(charge_scale) and charge_scale > 0):
        raise LartpcError(f"--charge-scale: must be a positive number, got {charge_scale}")
    shift = row_shift_for(time_origin, geom, trigger_tick)
    files = [Path(p) for p in inputs]
    if not files:
        raise LartpcError("convert: no input files given")
    for p in files:  # fail before writing anything
        check_input_file(p)
        f = _open_upstream(p)
        shp = f["image/wires"].shape
        f.close()
        if shp[2] // geom.tick_group > geom.full_size or shp[3] > geom.full_size:
            raise LartpcError(f"{p}: image/wires {shp} does not fit a {geom.full_size}-pixel image")
    out = Path(os.path.abspath(out_dir))  # names the new folder after the swap, as "." not
    with replace_store(out, overwrite, files) as stage:
        attrs = {"time_origin": time_origin, "time_shift_rows": shift,
                 "charge_scale": float(charge_scale)}
        counts = _convert_into(stage, files, geom, shift, charge_scale, shard_size, progress,
                               attrs)
        if not counts["converted"]:  # raised inside: the staged store goes, --out stays
            raise LartpcError(f"{', '.join(map(str, files))}: no event converted (of "
                              f"{counts['source']}: {counts['skipped']} with a label not "
                              f"exactly one of {', '.join(CLASSES)})")
    log.info("converted %d events, skipped %d (label not exactly one of %s)",
             counts["converted"], counts["skipped"], ", ".join(CLASSES))
    return ConvertResult(existing_shards(out), counts["converted"], counts["skipped"])


def _convert_into(out: Path, files: list[Path], geom: Geometry, shift: int,
                  charge_scale: float, shard_size: int, progress: bool, attrs: dict) -> dict:
    """Every input file's events as shards in ``out`` (a staging folder); the counts."""
    counts = {"converted": 0, "skipped": 0, "source": 0}
    shards = ShardBuffer(out, shard_size, geom, generator="lartpc.data.convert",
                         generator_version=",".join(p.name for p in files)[:1000], attrs=attrs)
    for p in files:
        _convert_file(p, geom, shift, charge_scale, counts, shards.add, progress)
    shards.close()
    return counts


def _convert_file(p: Path, geom: Geometry, shift: int, charge_scale: float, counts: dict,
                  take, progress: bool) -> None:
    f = _open_upstream(p)
    bar = None
    b0 = 0
    try:
        wires = f["image/wires"]
        labels = f["label/type"][:]
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=wires.shape[0], desc=p.name, unit="ev")
        for b0, b1 in _blocks(wires):
            labs = [label_of(v) for v in labels[b0:b1]]
            # one read per chunk-row: HDF5 decompresses each chunk once
            block = wires[b0:b1, -1] if any(lab is not None for lab in labs) else None
            for j, lab in enumerate(labs):
                if lab is None:
                    counts["skipped"] += 1
                else:
                    if block.dtype.kind == "f" and not np.isfinite(block[j]).all():
                        raise LartpcError(f"{p}: image/wires of event {b0 + j} (of this "
                                          "file) holds NaN or infinite values")
                    row, col, q = dense_to_sparse(block[j], geom, row_shift=shift,
                                                  charge_scale=charge_scale)
                    take(Event(row, col, q, lab[0], {"pdg": lab[1]}, counts["source"]))
                    counts["converted"] += 1
                counts["source"] += 1
            if bar:
                bar.update(b1 - b0)
    except OSError as e:
        raise LartpcError(f"{p}: cannot read its events from {b0} on ({e})") from None
    finally:
        if bar:
            bar.close()
        f.close()
