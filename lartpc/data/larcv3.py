"""larcv3 files (DeepLearnPhysics' format, used by SPINE and the PILArNet datasets) to and
from the event store.

Reading: one ``sparse2d`` producer and one projection (the tensor whose ImageMeta2D has
that projection id) become the store's pixels; the image size is the meta's voxel
counts (rows = axis 0, columns = axis 1, so voxel index = row * columns + column, the
layout larcv's own ``as_array`` uses), zero-padded to a square when the two differ and
binned by ``downsample``; voxels that are K x K of the study's pixels (an export of a
store downsampled by K, :func:`source_binning`) make a store downsampled by K times
that. Voxels with value <= 0 are not pixels (the store holds charge
> 0) and are counted. The label is the class of the *first* particle of a ``particle``
producer, through a PDG -> class mapping (:class:`ClassMap`: the study's five by
default, or a user's TOML). An event whose particle maps to no class, that has no
particle, or whose tensor has no pixel is skipped and counted, never guessed. Every
input is checked (HDF5 readable, producers present, projection present, one image
size) before anything is written, and the store is written through
:func:`lartpc.data.staging.replace_store`: one atomic rename, nothing left behind on
failure, a killed conversion cleaned up by the next writer.

Writing (:func:`export`): each event becomes one entry: its pixels as a ``sparse2d``
tensor of the given projection (meta: the store's image size, physical lengths from
the geometry), and one particle with its PDG, momentum, vertex, energies; the file
records the store's whole geometry (:data:`GEOMETRY_ATTR`), which a meta cannot hold
(wire and tick counts, pretrigger), and reading gives it back.

The larcv library (PyPI ``larcv``, built by jobs/env/install_larcv.sh) is an optional
extra; without it every larcv3 option ends in one line (:func:`require_larcv`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lartpc.cliparse import check_positive
from lartpc.data.convert import ConvertResult
from lartpc.data.staging import SHARD_NAME, check_input_file, existing_shards, replace_store
from lartpc.data.store import Event, EventStore, ShardBuffer, shard_geometry
from lartpc.errors import LartpcError
from lartpc.fsutil import atomic_path, output_file
from lartpc.geometry import Geometry

log = logging.getLogger(__name__)
#: What the study's five classes are made of (the upstream converter's mapping).
STUDY_PDG = {"gamma": (22,), "electron": (11, -11), "muon": (-13,), "pion": (211,),
             "kaon": (321,)}
DEFAULT_PRODUCER = "lartpc"
#: what a producer name written may hold (larcv3 makes HDF5 group names of it)
PRODUCER_NAME = re.compile(r"[A-Za-z0-9_]+")
#: projection ids ``export`` writes (a LArTPC has a few wire planes; MicroBooNE's
#: collection plane is projection 2)
MAX_PROJECTIONS = 16
#: image rows and columns are int16 in the store
_MAX_SIDE = 32767
#: root attribute of a file :func:`export` wrote: the store's geometry (JSON of its
#: :class:`~lartpc.geometry.Geometry` fields), which :func:`convert_larcv3` reads back
GEOMETRY_ATTR = "lartpc_geometry"


def require_larcv():
    """The ``larcv`` module, or one clear error when the optional extra is absent."""
    try:
        import larcv
    except ImportError:
        raise LartpcError("larcv3 format needs the larcv library (optional extra): run "
                          "`make install` or `bash jobs/env/install_larcv.sh`") from None
    return larcv


@dataclass(slots=True)
class Larcv3Result(ConvertResult):
    """:class:`ConvertResult` with why events were skipped, in words."""

    reasons: str = ""


@dataclass(frozen=True)
class ClassMap:
    """Class names in label order and the PDG code -> label index mapping."""

    classes: tuple[str, ...]
    pdg: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: dict, origin: str) -> ClassMap:
        """From ``{class name: [pdg, ...]}`` in label order."""
        if not isinstance(table, dict) or len(table) < 2:
            raise LartpcError(f"{origin}: [classes] must name two or more classes, each with "
                              "a list of PDG codes")
        if len(table) > 127:
            raise LartpcError(f"{origin}: {len(table)} classes; at most 127")
        pdg: dict[int, int] = {}
        for i, (name, codes) in enumerate(table.items()):
            if not name.strip() or "," in name:
                raise LartpcError(f"{origin}: class name {name!r}: must be non-empty, no commas")
            if not isinstance(codes, list) or not codes or not all(
                    isinstance(c, int) and not isinstance(c, bool) for c in codes):
                raise LartpcError(f"{origin}: class {name!r}: expected a non-empty list of "
                                  f"integer PDG codes, got {codes!r}")
            for c in codes:
                if c in pdg:
                    raise LartpcError(f"{origin}: PDG {c} is in two classes "
                                      f"({list(table)[pdg[c]]!r} and {name!r})")
                pdg[c] = i
        return cls(tuple(table), pdg)

    @classmethod
    def load(cls, path: str | os.PathLike | None) -> ClassMap:
        """The study's five classes, or a user's TOML file with a ``[classes]`` table:
        ``name = [pdg, ...]`` per class, in label order."""
        if path is None:
            return cls.from_table({k: list(v) for k, v in STUDY_PDG.items()}, "default")
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as e:
            raise LartpcError(f"--classes {path}: cannot read ({e.strerror})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise LartpcError(f"--classes {path}: not TOML ({e})") from None
        if set(data) != {"classes"}:
            raise LartpcError(f"--classes {path}: expected one table [classes] of "
                              f"name = [pdg, ...], got {', '.join(data) or 'nothing'}")
        return cls.from_table(data["classes"], f"--classes {path}")

    def to_json(self) -> str:
        """The mapping recorded in the store (attribute ``pdg_classes``)."""
        by_class: dict[str, list[int]] = {c: [] for c in self.classes}
        for code, i in self.pdg.items():
            by_class[self.classes[i]].append(code)
        return json.dumps(by_class)


# ---------------------------------------------------------------- reading larcv3 files

def _check_file(p: Path, producer: str, particles: str) -> dict[str, np.ndarray]:
    """The file is whole HDF5 with larcv3's groups and both producers (checked with h5py,
    before larcv's C++ reader sees it); per producer kind (``sparse2d``, ``particle``),
    how many objects each entry holds (its ``extents``' N).

    larcv's reader does not clear an entry that holds none: it hands back the last
    entry's particle or tensors, so those counts, not the reader, say an entry is empty.
    """
    import h5py

    check_input_file(p)
    try:
        with h5py.File(p, "r") as f:
            if "Data" not in f or "Events" not in f or "event_id" not in f["Events"]:
                raise LartpcError(f"{p}: not a larcv3 file (no Data and Events groups)")
            groups = list(f["Data"])
            for kind, name in (("sparse2d", producer), ("particle", particles)):
                if f"{kind}_{name}_group" not in groups:
                    have = sorted(g[len(kind) + 1:-len("_group")] for g in groups
                                  if g.startswith(kind + "_") and g.endswith("_group"))
                    raise LartpcError(f"{p}: no {kind} producer {name!r} "
                                      f"(the file has: {', '.join(have) or 'none'})")
            # read every dataset once: a truncated file fails here, not in larcv's C++
            n = len(f["Events"]["event_id"][...])
            held = {}
            for kind, name in (("sparse2d", producer), ("particle", particles)):
                grp = f["Data"][f"{kind}_{name}_group"]
                for ds in grp.values():
                    if isinstance(ds, h5py.Dataset):
                        _read_through(ds)
                ext = grp.get("extents")
                if not isinstance(ext, h5py.Dataset) or "N" not in (ext.dtype.names or ()) \
                        or len(ext) != n:
                    raise LartpcError(f"{p}: Data/{kind}_{name}_group/extents is not one "
                                      f"(first, N) row per event ({n} events)")
                held[kind] = np.asarray(ext["N"][...], dtype=np.int64)
            return held
    except LartpcError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LartpcError(f"{p}: cannot read as larcv3/HDF5 ({msg})") from None


def _read_through(ds, rows: int = 1 << 20) -> None:
    """Read every row of the h5py dataset ``ds`` (a damaged chunk raises), ``rows`` at a
    time, so that a multi-GB file is checked in bounded memory."""
    if ds.ndim == 0:
        ds[()]
        return
    for i in range(0, len(ds), rows):
        ds[i:i + rows]


#: larcv's logger levels: 2 "normal" prints every file opened; 3 warnings and worse
_QUIET = 3


def _open_reader(larcv, paths: Sequence[Path], producer: str, particles: str):
    """larcv's IOManager over ``paths``, reading only the two products used."""
    cfg = larcv.IOManager.default_config()
    cfg.update(Name="lartpc", IOMode=0, Verbosity=_QUIET)
    cfg["Input"].update(InputFiles=[str(p) for p in paths],
                        ReadOnlyType=["sparse2d", "particle"],
                        ReadOnlyName=[producer, particles])
    io = larcv.IOManager(cfg)
    io.initialize()
    return io


def _tensor(ev_sparse, projection: int):
    for k in range(ev_sparse.size()):
        t = ev_sparse.sparse_tensor(k)
        if t.meta().projection_id() == projection:
            return t
    return None


def _projections(ev_sparse) -> list[int]:
    return sorted(ev_sparse.sparse_tensor(k).meta().projection_id()
                  for k in range(ev_sparse.size()))


def _truth(part) -> dict:
    """Store truth of a larcv3 Particle: PDG, momentum and direction, vertex, kinetic
    energy (initial energy minus the mass that momentum and energy imply), deposited
    energy, path length."""
    p = float(part.p())
    e = float(part.energy_init())
    direction = np.array([part.px(), part.py(), part.pz()], np.float64) / p if p > 0 \
        else np.zeros(3)
    ke = e - math.sqrt(max(e * e - p * p, 0.0)) if e > 0 else 0.0
    return {"pdg": int(part.pdg_code()), "momentum_mev": p, "kinetic_energy_mev": ke,
            "vertex_cm": np.array([part.x(), part.y(), part.z()], np.float32),
            "direction": direction.astype(np.float32),
            "path_length_cm": float(part.distance_travel()),
            "visible_energy_mev": float(part.energy_deposit()), "end_process": ""}


def _pixels(t, shape: tuple[int, int], geom: Geometry, binned: int, counts: dict,
            where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    idx = np.asarray(t.indexes(), np.int64)
    val = np.asarray(t.values(), np.float32)
    rows, cols = shape
    if idx.size and (idx.min() < 0 or idx.max() >= rows * cols):
        raise LartpcError(f"{where}: voxel index {int(idx.max())} outside the "
                          f"{rows} x {cols} image of its meta")
    keep = val > 0
    counts["dropped_voxels"] += int((~keep).sum())
    if not np.all(np.isfinite(val[keep])):
        raise LartpcError(f"{where}: non-finite voxel value")
    idx, val = idx[keep], val[keep]
    row, col = idx // cols, idx % cols
    k = geom.downsample // binned  # the voxels' own binning is done already
    dup = len(np.unique(idx)) != len(idx)
    if k > 1 or dup:
        row, col = row // k, col // k
        flat = row * geom.width + col
        uniq, inv = np.unique(flat, return_inverse=True)
        val = np.bincount(inv, weights=val).astype(np.float32)
        row, col = uniq // geom.width, uniq % geom.width
    return row.astype(np.int16), col.astype(np.int16), val


def _projection_tensor(io, producer: str, projection: int, shape, where: str,
                       voxel: tuple[float, float] | None = None):
    """The entry's tensor of ``projection``, its meta's (rows, columns) checked against
    ``shape`` and its voxels' (drift, wire) sides in cm against ``voxel`` (None: not
    yet known)."""
    t = _tensor(io.get_data("sparse2d", producer), projection)
    if t is None:
        have = _projections(io.get_data("sparse2d", producer))
        raise LartpcError(f"{where}: sparse2d producer {producer!r} has no projection "
                          f"{projection} (it has: {', '.join(map(str, have)) or 'none'})")
    m = t.meta()
    s = (int(m.number_of_voxels(0)), int(m.number_of_voxels(1)))
    if shape is not None and s != tuple(shape):
        raise LartpcError(f"{where}: a {s[0]} x {s[1]} image; the first event's is "
                          f"{shape[0]} x {shape[1]} (one size per store)")
    if voxel is not None:
        cm = _voxel_cm(t)
        if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(cm, voxel, strict=True)):
            raise LartpcError(f"{where}: voxels of {cm[0]:g} x {cm[1]:g} cm; the first "
                              f"event's are {voxel[0]:g} x {voxel[1]:g} cm (one voxel "
                              "size per store)")
    return t, s


def _voxel_cm(t) -> tuple[float, float]:
    """A tensor's voxel sides in cm: (drift, across wires)."""
    m = t.meta()
    return float(m.voxel_dimensions(0)), float(m.voxel_dimensions(1))


def _image_shape(larcv, files: list[Path], producer: str, particles: str,
                 projection: int) -> tuple[tuple[int, int], tuple[float, float]]:
    """The (rows, columns) of the projection's meta and its voxels' sides in cm, in the
    first event of each file, the same in all (every other event is checked as it
    converts)."""
    shape = voxel = None
    for p in files:
        io = _open_reader(larcv, [p], producer, particles)
        try:
            if io.get_n_entries() == 0:
                raise LartpcError(f"{p}: holds no events")
            io.read_entry(0)
            t, shape = _projection_tensor(io, producer, projection, shape,
                                          f"{p}: entry 0", voxel)
            voxel = voxel or _voxel_cm(t)
        finally:
            io.finalize()
    assert shape is not None and voxel is not None
    if min(shape) < 1 or max(shape) > _MAX_SIDE:
        raise LartpcError(f"{files[0]}: image {shape[0]} x {shape[1]}: sides must be "
                          f"1..{_MAX_SIDE}")
    return shape, voxel


def source_binning(row_cm: float, col_cm: float) -> int:
    """K where a voxel is K x K of the study's full-resolution pixels: both its sides
    (``row_cm`` in drift, ``col_cm`` across wires) K times the study's pixel (time pixel
    and wire pitch, :class:`~lartpc.geometry.Geometry`) to 1e-6, as ``lartpc export``
    writes a store downsampled by K; else 1: the voxels are taken as full-resolution
    pixels, whatever their size."""
    g = Geometry()
    k = round(col_cm / g.wire_pitch_cm)
    if k >= 2 and all(math.isclose(cm, k * unit, rel_tol=1e-6) for cm, unit in
                      ((row_cm, g.time_pixel_cm), (col_cm, g.wire_pitch_cm))):
        return k
    return 1


def recorded_geometry(files: Sequence[Path]) -> Geometry | None:
    """The store geometry the files record (:data:`GEOMETRY_ATTR`, as :func:`export`
    writes it), the same in every file; None when none records one.

    Raises
    ------
    LartpcError
        Naming the file whose record is unreadable, or differs from the first file's.
    """
    found = [_geometry_attr(p) for p in files]
    for p, g in zip(files, found, strict=True):
        if g != found[0]:
            raise LartpcError(f"{p}: records {_differences(g, found[0])}; {files[0]} "
                              f"records {_differences(found[0], g)} (one geometry per store)")
    return found[0]


def _differences(g: Geometry | None, other: Geometry | None) -> str:
    """The fields of ``g`` that differ from ``other``'s, in words."""
    if g is None or other is None:
        return "no store geometry" if g is None else "a store geometry"
    a, b = g.to_attrs(), other.to_attrs()
    return "geometry " + ", ".join(f"{k}={v}" for k, v in a.items() if b[k] != v)


def _geometry_attr(p: Path) -> Geometry | None:
    import h5py

    with h5py.File(p, "r") as f:
        text = f.attrs.get(GEOMETRY_ATTR)
    if text is None:
        return None
    try:
        fields = json.loads(text)
    except (TypeError, ValueError) as e:
        raise LartpcError(f"{p}: attribute {GEOMETRY_ATTR} is not JSON ({e})") from None
    if not isinstance(fields, dict):
        raise LartpcError(f"{p}: attribute {GEOMETRY_ATTR} is not a JSON object")
    return shard_geometry(p, fields)


def store_geometry(recorded: Geometry | None, shape: tuple[int, int],
                   voxel: tuple[float, float], downsample: int,
                   where: Path) -> tuple[Geometry, int]:
    """The converted store's geometry and the voxels' own binning K.

    ``recorded`` (an export's): that geometry, binned ``downsample`` times further; it
    must describe the files' images (``shape`` voxels of ``voxel`` cm, drift and across
    wires). Else inferred from the meta: the image ``shape`` zero-padded to a square,
    ``n_ticks`` 3 per row, no pretrigger, and voxels K x K of the study's pixels
    (:func:`source_binning`) taken as an image downsampled by K.
    """
    rows, cols = shape
    if recorded is None:
        binned = source_binning(*voxel)
        # the store is the full-resolution image downsampled by K times --downsample
        return Geometry(full_size=max(shape) * binned, n_wires=cols * binned,
                        n_ticks=rows * binned * 3, pretrigger_ticks=0,
                        downsample=binned * downsample), binned
    k = recorded.downsample
    cm = (k * recorded.time_pixel_cm, k * recorded.wire_pitch_cm)
    if tuple(shape) != recorded.shape or not all(
            math.isclose(a, b, rel_tol=1e-6) for a, b in zip(voxel, cm, strict=True)):
        raise LartpcError(f"{where}: records a {recorded.height} x {recorded.width} image of "
                          f"{cm[0]:g} x {cm[1]:g} cm pixels, but its images are {rows} x "
                          f"{cols} voxels of {voxel[0]:g} x {voxel[1]:g} cm")
    return dataclasses.replace(recorded, downsample=k * downsample), k


def convert_larcv3(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
                   producer: str = DEFAULT_PRODUCER, projection: int = 0,
                   particles: str | None = None, class_map: ClassMap | None = None,
                   downsample: int = 1, shard_size: int = 1000, overwrite: bool = False,
                   progress: bool = False) -> Larcv3Result:
    """Convert larcv3 files into ``out_dir/events-NNNNN.h5`` (see the module's text).

    Returns a :class:`Larcv3Result`: ``skipped`` counts the events with no particle,
    a PDG in no class, or no pixels; ``reasons`` says which, in words. Raises
    :class:`LartpcError` (nothing written) for a file that cannot be used, or when no
    event converts.
    """
    larcv = require_larcv()
    cmap = class_map or ClassMap.load(None)
    particles = particles or producer
    check_positive(shard_size, "--shard-size")
    files = [Path(p) for p in inputs]
    if not files:
        raise LartpcError("convert: no input files given")
    held = {p: _check_file(p, producer, particles) for p in files}  # before writing
    (rows, cols), voxel = _image_shape(larcv, files, producer, particles, projection)
    side = max(rows, cols)
    if downsample < 1 or side % downsample:
        raise LartpcError(f"--downsample: downsample={downsample}: must be a positive "
                          f"divisor of {side} (the files' image is {rows} x {cols})")
    geom, binned = store_geometry(recorded_geometry(files), (rows, cols), voxel, downsample,
                                  files[0])
    counts = {"converted": 0, "no_pixels": 0, "no_particle": 0, "dropped_voxels": 0,
              "source": 0}
    unmapped: dict[int, int] = {}
    attrs = {"source_format": "larcv3", "sparse2d_producer": producer,
             "particle_producer": particles, "projection": projection,
             "pdg_classes": cmap.to_json(), "source_rows": rows, "source_cols": cols,
             "source_binning": binned}
    out = Path(os.path.abspath(out_dir))  # names the new folder after the swap, as "." not
    with replace_store(out, overwrite, files) as stage:
        shards = ShardBuffer(stage, shard_size, geom, generator="lartpc.data.larcv3",
                             generator_version=",".join(p.name for p in files)[:1000],
                             attrs=attrs, classes=cmap.classes)

        for p in files:
            io = _open_reader(larcv, [p], producer, particles)
            bar = None
            try:
                n = io.get_n_entries()
                if progress:
                    from tqdm import tqdm

                    bar = tqdm(total=n, desc=p.name, unit="ev", disable=None)  # a terminal only
                for i in range(n):
                    io.read_entry(i)
                    ev = _event(io, producer, particles, projection, (rows, cols), voxel,
                                geom, binned, cmap, counts, unmapped, f"{p}: entry {i}",
                                {k: int(v[i]) for k, v in held[p].items()})
                    counts["source"] += 1
                    if bar:
                        bar.update(1)
                    if ev is None:
                        continue
                    shards.add(ev)
                    counts["converted"] += 1
            finally:
                if bar:
                    bar.close()
                io.finalize()
        if not counts["converted"]:
            raise LartpcError(f"{', '.join(map(str, files))}: no event converted "
                              f"({skip_summary(counts, unmapped, cmap)})")
        shards.close()
    skipped = counts["no_pixels"] + counts["no_particle"] + sum(unmapped.values())
    res = Larcv3Result(existing_shards(out), counts["converted"], skipped,
                       skip_summary(counts, unmapped, cmap))
    log.info("converted %d events, skipped %d (%s)", res.converted, skipped, res.reasons)
    return res


def _event(io, producer, particles, projection, shape, voxel, geom, binned, cmap, counts,
           unmapped, where, held: dict[str, int]) -> Event | None:
    """The entry read into ``io`` as an Event (None: skipped, counted); ``held``: how
    many tensors and particles the file says it has (:func:`_check_file`)."""
    if held["sparse2d"] == 0:  # larcv would hand back the last entry's tensors
        raise LartpcError(f"{where}: sparse2d producer {producer!r} has no projection "
                          f"{projection} (it has: none)")
    t, _ = _projection_tensor(io, producer, projection, shape, where, voxel)
    ev_part = io.get_data("particle", particles)
    if held["particle"] == 0 or ev_part.size() == 0:
        counts["no_particle"] += 1
        return None
    part = ev_part.at(0)
    pdg = int(part.pdg_code())
    if pdg not in cmap.pdg:
        unmapped[pdg] = unmapped.get(pdg, 0) + 1
        return None
    row, col, q = _pixels(t, shape, geom, binned, counts, where)
    if not len(q):
        counts["no_pixels"] += 1
        return None
    return Event(row, col, q, cmap.pdg[pdg], _truth(part), counts["source"])


def skip_summary(counts: dict, unmapped: dict[int, int], cmap: ClassMap) -> str:
    """What was skipped and why, in words."""
    parts = []
    if unmapped:
        codes = ", ".join(f"{c} x{n}" for c, n in sorted(unmapped.items()))
        parts.append(f"{sum(unmapped.values())} whose particle's PDG maps to none of "
                     f"{','.join(cmap.classes)} ({codes})")
    if counts["no_particle"]:
        parts.append(f"{counts['no_particle']} with no particle")
    if counts["no_pixels"]:
        parts.append(f"{counts['no_pixels']} with no pixels")
    if counts["dropped_voxels"]:
        parts.append(f"{counts['dropped_voxels']} voxels <= 0 dropped")
    return "; ".join(parts) or "none skipped"


# ---------------------------------------------------------------- writing larcv3 files

def _particle(larcv, ev: Event):
    t = ev.truth
    part = larcv.Particle()
    part.pdg_code(int(t.get("pdg", 0)))
    p = float(t.get("momentum_mev", 0.0))
    d = np.asarray(t.get("direction", np.zeros(3)), np.float64)
    part.momentum(*(p * d).tolist())
    v = np.asarray(t.get("vertex_cm", np.zeros(3)), np.float64)
    part.position(float(v[0]), float(v[1]), float(v[2]), 0.0)
    ke = float(t.get("kinetic_energy_mev", 0.0))
    # initial energy = T + m, the mass from p^2 = T^2 + 2 T m
    part.energy_init(ke + (p * p - ke * ke) / (2 * ke) if ke > 0 else 0.0)
    part.energy_deposit(float(t.get("visible_energy_mev", -1.0)))
    part.distance_travel(float(t.get("path_length_cm", 0.0)))
    part.creation_process("primary")
    part.track_id(1)
    part.parent_track_id(1)
    return part


def _check_replaceable(out: Path, overwrite: bool) -> None:
    """An existing ``out`` is replaced only with ``overwrite`` and only when it is a
    larcv3 file (an earlier export): never a folder or a user's other file."""
    if not os.path.lexists(out):
        return
    if out.is_dir():
        raise LartpcError(f"{out}: is a folder; name the larcv3 file to write")
    if not overwrite:
        raise LartpcError(f"{out}: exists; choose another name or pass --overwrite")
    import h5py

    try:
        with h5py.File(out, "r") as f:
            ours = "Data" in f and "Events" in f
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise LartpcError(f"{out}: exists and is not a larcv3 file; refusing to replace "
                          "it (choose another name)")


def _record_geometry(path: Path, geom: Geometry) -> None:
    """Write the store's geometry into the larcv3 file at ``path`` (a root attribute,
    which larcv's reader ignores), for :func:`convert_larcv3` to give back whole: the
    meta holds the image and its voxel sizes only, not the wires, ticks and
    pretrigger."""
    import h5py

    with h5py.File(path, "a") as f:
        f.attrs[GEOMETRY_ATTR] = json.dumps(geom.to_attrs())


def export(store_path: str | os.PathLike, out_file: str | os.PathLike, *,
           producer: str = DEFAULT_PRODUCER, projection: int = 0,
           overwrite: bool = False, progress: bool = False) -> int:
    """Write the store as one larcv3 file (``sparse2d`` and ``particle`` of
    ``producer``); the number of events. The file appears whole or not at all."""
    if not PRODUCER_NAME.fullmatch(producer):
        raise LartpcError(f"--producer {producer!r}: letters, digits and _ only (larcv3 "
                          "names its HDF5 groups after it)")
    if not 0 <= projection < MAX_PROJECTIONS:
        raise LartpcError(f"--projection {projection}: 0 to {MAX_PROJECTIONS - 1}")
    larcv = require_larcv()
    store = EventStore(store_path)
    out = output_file(out_file)
    if any(out.exists() and os.path.samefile(out, p) for p in store.paths):
        raise LartpcError(f"{out}: is a shard of the store being exported; choose another "
                          "name")
    if SHARD_NAME.match(out.name):  # in a store's folder, a file the store would read
        raise LartpcError(f"{out}: named as an event store names its shards; choose "
                          "another name")
    _check_replaceable(out, overwrite)
    if not out.parent.is_dir():
        raise LartpcError(f"{out}: folder {out.parent} does not exist")
    if len(store) == 0:
        raise LartpcError(f"{store_path}: holds no events; nothing to export")
    g = store.geometry
    metas = []  # the projections below the one written hold empty tensors
    for i in range(projection + 1):
        meta = larcv.ImageMeta2D()
        meta.set_dimension(0, g.height * g.downsample * g.time_pixel_cm, g.height, 0.0)
        meta.set_dimension(1, g.width * g.downsample * g.wire_pitch_cm, g.width, 0.0)
        meta.set_projection_id(i)
        metas.append(meta)
    meta = metas[-1]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(store), desc=out.name, unit="ev", disable=None)
    with atomic_path(out) as tmp:
        cfg = larcv.IOManager.default_config()
        cfg.update(Name="lartpc", IOMode=1, Verbosity=_QUIET)
        cfg["Output"].update(OutFileName=str(tmp))
        io = larcv.IOManager(cfg)
        io.initialize()
        try:
            for i in range(0, len(store), 256):
                for j, ev in enumerate(store.read_many(range(i, min(i + 256, len(store))))):
                    io.set_id(0, 0, i + j)
                    tensors = io.get_data("sparse2d", producer)
                    for below in metas[:-1]:
                        tensors.set(larcv.VoxelSet(), below)
                    vs = larcv.VoxelSet()
                    idx = ev.row.astype(np.uint64) * np.uint64(g.width) + ev.col.astype(np.uint64)
                    vs.set(idx, ev.charge.astype(np.float32))
                    tensors.set(vs, meta)
                    io.get_data("particle", producer).append(_particle(larcv, ev))
                    io.save_entry()
                    if bar:
                        bar.update(1)
        finally:
            io.finalize()
            if bar:
                bar.close()
        _record_geometry(tmp, g)
    store.close()
    return len(store)
