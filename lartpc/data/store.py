"""Sparse HDF5 event store: sharded files ``events-00000.h5``, ``events-00001.h5``, ...

Schema (version 2; version 1 files still load), per file:

======================  ===========  ==================================================
dataset                 dtype/shape  meaning
======================  ===========  ==================================================
``offsets``             int64 (n+1)  event i owns pixels ``offsets[i]:offsets[i+1]``
``row``                 int16 (P,)   time pixel (image row)
``col``                 int16 (P,)   wire (image column)
``charge``              float32 (P,) collected charge, arbitrary units (>0)
``label``               int8 (n,)    class index in :data:`lartpc.CLASSES` order
``event_id``            int64 (n,)   generation index (event i of seed S), or source index
``truth/pdg``           int32 (n,)   PDG code of the primary
``truth/momentum_mev``  float32 (n,)
``truth/kinetic_energy_mev`` float32 (n,)
``truth/vertex_cm``     float32 (n,3) x (drift), y, z
``truth/direction``     float32 (n,3) unit vector
``truth/path_length_cm`` float32 (n,) primary's path until stop/decay/interaction/exit
``truth/end_process``   S8 (n,)      one of ``stop, decay, interact, exit`` ('' if unknown)
``truth/visible_energy_mev`` float32 deposited in the active volume (v2; -1 if unknown)
======================  ===========  ==================================================

File attributes: ``schema_version``, the :class:`~lartpc.geometry.Geometry` fields
(plus ``height``, ``width``), ``classes``, ``generator``, ``generator_version``, ``seed``,
and (v2) any extra attributes the writer records (the generator's ``source_geometry``,
readout options; the converter's time origin and charge scale).
Shards are written to a temporary name and renamed, so a killed writer never leaves a
torn ``events-*.h5``. A store is one run's events: its shards have the same attributes
(:func:`check_one_run`) and no event twice (:func:`check_distinct_events`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from lartpc import CLASSES
from lartpc.errors import LartpcError
from lartpc.fsutil import atomic_path
from lartpc.geometry import Geometry

SCHEMA_VERSION = 2
#: versions this reader accepts; v1 lacks truth/visible_energy_mev and extra attributes
READABLE_SCHEMA_VERSIONS = (1, 2)
SHARD_PATTERN = "events-{:05d}.h5"
_SHARD_RE = re.compile(r"^events-\d{5}\.h5$")
END_PROCESSES = ("stop", "decay", "interact", "exit")
TRUTH_FIELDS = {
    "pdg": (np.int32, ()),
    "momentum_mev": (np.float32, ()),
    "kinetic_energy_mev": (np.float32, ()),
    "vertex_cm": (np.float32, (3,)),
    "direction": (np.float32, (3,)),
    "path_length_cm": (np.float32, ()),
    "end_process": ("S8", ()),
    "visible_energy_mev": (np.float32, ()),
}
#: truth values written when an event does not provide the field
_MISSING = {"visible_energy_mev": -1.0}


class EventStoreError(LartpcError, ValueError):
    """A store file is missing, foreign, truncated or inconsistent."""


@dataclass(slots=True)
class Event:
    """One event: sparse pixels plus label and truth."""

    row: np.ndarray  # int16
    col: np.ndarray  # int16
    charge: np.ndarray  # float32
    label: int
    truth: dict = field(default_factory=dict)
    event_id: int = -1

    def __len__(self) -> int:
        return len(self.charge)

    def dense(self, shape: tuple[int, int], out: np.ndarray | None = None) -> np.ndarray:
        """Scatter into a float32 image of ``shape`` (zeros elsewhere)."""
        img = np.zeros(shape, np.float32) if out is None else out
        if out is not None:
            img.fill(0)
        img[self.row, self.col] = self.charge
        return img


def _default_truth() -> dict:
    out = {k: (np.zeros(s, dt) if s else np.zeros((), dt)[()])
           for k, (dt, s) in TRUTH_FIELDS.items()}
    out.update(_MISSING)
    return out


def write_shard(
    path: str | os.PathLike,
    events: Sequence[Event],
    geometry: Geometry,
    *,
    generator: str = "lartpc.sim",
    generator_version: str = "",
    seed: int = -1,
    compression: str | None = "gzip",
    attrs: dict | None = None,
    classes: Sequence[str] = CLASSES,
) -> Path:
    """Write ``events`` to ``path`` atomically (temporary file, then rename).

    ``attrs`` are extra file attributes (str, int or float values), e.g. how the events
    were made; they may not replace the schema's own attributes. ``classes`` names the
    label indices (the study's five unless a converted store brings its own).
    """
    path = Path(path)
    n = len(events)
    counts = np.array([len(e) for e in events], np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])

    def cat(name: str, dt) -> np.ndarray:
        if not n:
            return np.zeros(0, dt)
        return np.concatenate([getattr(e, name) for e in events]).astype(dt, copy=False)

    row, col, charge = cat("row", np.int16), cat("col", np.int16), cat("charge", np.float32)
    labels = np.array([e.label for e in events], np.int8)
    if n and (labels.min() < 0 or labels.max() >= len(classes)):
        raise EventStoreError(f"{path}: label out of range 0..{len(classes) - 1}")
    if len(charge) and not np.all(np.isfinite(charge)):
        raise EventStoreError(f"{path}: non-finite charge")
    if len(charge) and charge.min() < 0:
        raise EventStoreError(f"{path}: negative charge")
    if len(row) and (row.min() < 0 or row.max() >= geometry.height
                     or col.min() < 0 or col.max() >= geometry.width):
        raise EventStoreError(f"{path}: pixel outside the {geometry.shape} image")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        kw = {"compression": compression} if compression and len(row) else {}
        f.create_dataset("offsets", data=offsets)
        f.create_dataset("row", data=row, **kw)
        f.create_dataset("col", data=col, **kw)
        f.create_dataset("charge", data=charge, **kw)
        f.create_dataset("label", data=labels)
        f.create_dataset("event_id", data=np.array([e.event_id for e in events], np.int64))
        t = f.create_group("truth")
        for key, (dt, shape) in TRUTH_FIELDS.items():
            vals = [e.truth.get(key, _default_truth()[key]) for e in events]
            t.create_dataset(key, data=np.array(vals, dtype=dt).reshape((n, *shape)))
        f.attrs["schema_version"] = SCHEMA_VERSION
        for k, v in geometry.to_attrs().items():
            f.attrs[k] = v
        f.attrs["classes"] = ",".join(classes)
        f.attrs["generator"] = generator
        f.attrs["generator_version"] = generator_version
        f.attrs["seed"] = seed
        for k, v in (attrs or {}).items():
            if k in f.attrs:
                raise EventStoreError(f"{path}: extra attribute {k!r} clashes with the schema")
            f.attrs[k] = v
    return path


class ShardBuffer:
    """Events, as a converter makes them, into numbered shards of ``shard_size`` events
    in ``folder`` (:data:`SHARD_PATTERN`); ``write`` holds :func:`write_shard`'s other
    arguments. :meth:`close` writes the last, short shard (an empty one when nothing
    was added, so that a store always has a shard)."""

    def __init__(self, folder: Path, shard_size: int, geometry: Geometry, **write):
        self.folder, self.shard_size, self.geometry, self.write = (
            Path(folder), shard_size, geometry, write)
        self.written: list[Path] = []
        self._events: list[Event] = []

    def add(self, ev: Event) -> None:
        self._events.append(ev)
        if len(self._events) == self.shard_size:
            self._flush()

    def close(self) -> None:
        if self._events or not self.written:
            self._flush()

    def _flush(self) -> None:
        path = self.folder / SHARD_PATTERN.format(len(self.written))
        write_shard(path, self._events, self.geometry, **self.write)
        self.written.append(path)
        self._events.clear()


def shard_paths(path_or_dir: str | os.PathLike) -> list[Path]:
    """The shard files a store path names (one file, or the ``events-*.h5`` of a folder)."""
    p = Path(path_or_dir)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise EventStoreError(f"{p}: no such event file or folder")
    files = sorted(q for q in p.iterdir() if _SHARD_RE.match(q.name))
    if not files:
        raise EventStoreError(f"{p}: folder holds no events-NNNNN.h5 files")
    return files


def shard_geometry(path: Path, attrs) -> Geometry:
    """The shard's :class:`Geometry`, every attribute checked first.

    Raises
    ------
    EventStoreError
        Naming ``path`` and the attribute, for a geometry attribute that is not a
        finite positive number (``pretrigger_ticks``: >= 0; integer fields: whole),
        a downsample that does not divide the image, or ``height``/``width`` that
        disagree with the other fields.
    """
    kw = {}
    for f in dataclasses.fields(Geometry):
        if f.name not in attrs:
            continue
        v = attrs[f.name]
        v = v.item() if hasattr(v, "item") else v
        whole = f.type in (int, "int")
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v >= 0 if f.name == "pretrigger_ticks" else v > 0)
        if not ok or (whole and v != int(v)):
            kind = "a whole number" if whole else "a number"
            raise EventStoreError(f"{path}: attribute {f.name}={v!r}: expected {kind} "
                                  f"{'>= 0' if f.name == 'pretrigger_ticks' else '> 0'}")
        kw[f.name] = int(v) if whole else float(v)
    try:
        geom = Geometry(**kw)
    except ValueError as e:
        raise EventStoreError(f"{path}: attribute {e}") from e
    for name, want in (("height", geom.height), ("width", geom.width)):
        got = attrs.get(name)
        got = got.item() if hasattr(got, "item") else got
        if got is not None and got != want:
            raise EventStoreError(f"{path}: attribute {name}={got!r} disagrees with the "
                                  f"geometry ({want} = full_size / downsample)")
    return geom


def shard_classes(path: Path, attrs) -> tuple[str, ...]:
    """The class names a shard's labels index: its ``classes`` attribute (comma-separated),
    or the study's five for a store written before stores named their own."""
    v = _py(attrs.get("classes"))
    if v is None or v == "":
        return CLASSES
    names = tuple(str(v).split(","))
    if len(names) < 2 or any(not n.strip() for n in names) or len(set(names)) != len(names):
        raise EventStoreError(f"{path}: attribute classes={v!r}: expected two or more distinct "
                              "comma-separated names")
    return names


#: dataset -> numpy dtype kinds it may have: pixel coordinates, offsets and labels are
#: integers (a float row would be NaN-tolerant and cast to row 0), charge is a number
SHARD_DATASETS = {"offsets": "iu", "row": "iu", "col": "iu", "charge": "fiu", "label": "iu"}


def check_datasets(path: Path, f: h5py.File) -> None:
    """The shard's datasets exist, are 1-D, have the right kind and matching lengths.

    Raises
    ------
    EventStoreError
        Naming the file and the dataset.
    """
    for name, kinds in SHARD_DATASETS.items():
        if name not in f or not isinstance(f[name], h5py.Dataset):
            raise EventStoreError(f"{path}: missing dataset '{name}'")
        d = f[name]
        if d.ndim != 1:
            raise EventStoreError(f"{path}: dataset '{name}' has shape {d.shape}; expected 1-D")
        if d.dtype.kind not in kinds:
            want = "integers" if kinds == "iu" else "numbers"
            raise EventStoreError(f"{path}: dataset '{name}' holds {d.dtype}; expected {want}")
    n = f["charge"].shape[0]
    for name in ("row", "col"):
        if f[name].shape[0] != n:
            raise EventStoreError(f"{path}: dataset '{name}' has {f[name].shape[0]} entries, "
                                  f"'charge' {n}; they must match")


class _Shard(NamedTuple):
    """What opening a store reads of one shard."""

    offsets: np.ndarray
    labels: np.ndarray  # int64
    event_ids: np.ndarray  # int64; -1 where the shard records none
    geometry: Geometry
    classes: tuple[str, ...]
    attrs: dict


def _open_shard(p: Path) -> _Shard:
    """The shard ``p``'s offsets, labels, event ids and attributes, each checked.

    Raises
    ------
    EventStoreError
        Naming ``p``: not a lartpc event file, unreadable, inconsistent offsets, a label
        out of range, or a bad attribute.
    """
    try:
        with h5py.File(p, "r") as f:
            ver = _py(f.attrs.get("schema_version"))
            if ver not in READABLE_SCHEMA_VERSIONS:
                raise EventStoreError(
                    f"{p}: not a lartpc event file (schema_version {ver!r}, "
                    f"expected one of {READABLE_SCHEMA_VERSIONS})")
            check_datasets(p, f)
            off, lab, npix = f["offsets"][:], f["label"][:], f["charge"].shape[0]
            ids = f["event_id"][:] if isinstance(f.get("event_id"), h5py.Dataset) else None
            geom, classes = shard_geometry(p, f.attrs), shard_classes(p, f.attrs)
            attrs = {k: _attr(v) for k, v in f.attrs.items()}
    except (OSError, KeyError) as e:
        raise EventStoreError(f"{p}: cannot read HDF5 event file ({e})") from e
    if len(off) != len(lab) + 1 or off[0] != 0 or np.any(np.diff(off) < 0) \
            or off[-1] != npix:
        raise EventStoreError(f"{p}: inconsistent offsets (truncated or corrupt file)")
    bad = np.flatnonzero((lab < 0) | (lab >= len(classes)))
    if bad.size:  # every count, split and loss indexes by label
        raise EventStoreError(f"{p}: event {int(bad[0])} label {int(lab[bad[0]])} out "
                              f"of range 0..{len(classes) - 1}")
    if ids is None or ids.shape != lab.shape or ids.dtype.kind not in "iu":
        ids = np.full(len(lab), -1)
    return _Shard(off, lab.astype(np.int64), ids.astype(np.int64), geom, classes, attrs)


def _attr(v):
    """An HDF5 attribute as a plain, comparable Python value."""
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray) and v.size != 1:
        return tuple(v.tolist())
    return v.item() if hasattr(v, "item") else v


#: geometry attributes, named as such when shards disagree on one
_GEOMETRY_ATTRS = frozenset(Geometry().to_attrs())


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


def check_one_run(paths: Sequence[Path], attrs: Sequence[dict]) -> None:
    """Every shard's file attributes equal the first's: geometry, classes, generator
    and its version (physics), seed, source geometry, momenta, dead wires, a converter's
    inputs and options, ... Each says how the events were made, and a store is one
    run's events: the first shard's attributes describe them all (inspect, compact
    weights, evaluate --regenerate read them there).

    Raises
    ------
    EventStoreError
        Naming the first shard, the one that differs and the attribute.
    """
    for p, a in zip(paths[1:], attrs[1:], strict=True):
        for key in sorted(attrs[0].keys() | a.keys()):
            want, got = attrs[0].get(key, "(none)"), a.get(key, "(none)")
            if not _same(want, got):
                what = f"geometry ({key})" if key in _GEOMETRY_ATTRS else key
                raise EventStoreError(
                    f"{p.parent}: shards disagree on {what}: {paths[0].name} has {want!r}, "
                    f"{p.name} has {got!r}; a store's shards must come from one run "
                    "(keep each run's shards in a folder of their own)")


def check_distinct_events(paths: Sequence[Path], event_ids: Sequence[np.ndarray]) -> None:
    """No event twice: a shard's ``event_id`` (the event's index in its seed's dataset,
    or a converter's source index: with :func:`check_one_run`, the same id is the same
    event) in no other shard nor twice in one. Ids < 0 (not recorded) are not checked.

    Raises
    ------
    EventStoreError
        Naming the shards that repeat an event, how many repeat, and one of them.
    """
    ids = np.concatenate(event_ids)
    owner = np.repeat(np.arange(len(event_ids)), [len(i) for i in event_ids])
    known = ids >= 0
    ids, owner = ids[known], owner[known]
    order = np.argsort(ids, kind="stable")
    ids, owner = ids[order], owner[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        a, b = paths[owner[dup[0]]], paths[owner[dup[0] + 1]]
        where = f"{a.name} and {b.name}" if a != b else f"{a.name} (twice)"
        raise EventStoreError(
            f"{a.parent}: {where} repeat events ({dup.size} events held twice, the first "
            f"event {int(ids[dup[0]])}): a repeated event would count twice and could sit "
            "in training and validation both; remove the copied shard")


class EventStore:
    """Read-only random access over one shard file or a folder of shards.

    Opening reads only offsets and labels; pixel arrays are read on demand.
    """

    def __init__(self, path_or_dir: str | os.PathLike):
        self.paths = shard_paths(path_or_dir)
        shards = [_open_shard(p) for p in self.paths]
        check_one_run(self.paths, [s.attrs for s in shards])
        check_distinct_events(self.paths, [s.event_ids for s in shards])
        self._offsets: list[np.ndarray] = [s.offsets for s in shards]
        #: the file attributes, every shard's the same (:func:`check_one_run`)
        self.attrs: dict = shards[0].attrs
        #: class names of the label indices (the store's ``classes``; old stores: the five)
        self.classes: tuple[str, ...] = shards[0].classes
        self.geometry: Geometry = shards[0].geometry
        self.labels = np.concatenate([s.labels for s in shards])
        sizes = np.array([len(o) - 1 for o in self._offsets], np.int64)
        self._file_start = np.concatenate([[0], np.cumsum(sizes)])
        self._handles: dict[int, h5py.File] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return f"EventStore({len(self)} events in {len(self.paths)} file(s), {self.geometry.shape})"

    def class_counts(self) -> np.ndarray:
        """Events per class, in :attr:`classes` order."""
        return np.bincount(self.labels, minlength=len(self.classes))

    def pixel_counts(self) -> np.ndarray:
        """Active pixels per event."""
        return np.concatenate([np.diff(o) for o in self._offsets])

    def locate(self, i: int) -> tuple[int, int]:
        """(file number, index within that file) of global event ``i``."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"event {i} out of range for {len(self)} events")
        i %= len(self)
        fi = int(np.searchsorted(self._file_start, i, side="right") - 1)
        return fi, int(i - self._file_start[fi])

    def _file(self, fi: int) -> h5py.File:
        if self._pid != os.getpid():  # forked: HDF5 handles are not fork-safe
            self._handles, self._pid = {}, os.getpid()
        if fi not in self._handles:
            self._handles[fi] = h5py.File(self.paths[fi], "r")
        return self._handles[fi]

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles = {}

    def __getitem__(self, i: int) -> Event:
        return self.read_many([i])[0]

    def read_many(self, indices: Iterable[int]) -> list[Event]:
        """Events for ``indices`` (in that order), reading each file's span in one go."""
        idx = [int(i) for i in indices]
        by_file: dict[int, list[tuple[int, int]]] = {}
        for pos, i in enumerate(idx):
            fi, j = self.locate(i)
            by_file.setdefault(fi, []).append((pos, j))
        out: list[Event | None] = [None] * len(idx)
        for fi, items in by_file.items():
            path, off = self.paths[fi], self._offsets[fi]
            js = [j for _, j in items]
            lo, hi = off[min(js)], off[max(js) + 1]
            try:
                f = self._file(fi)
                row, col, charge = (f[k][lo:hi] for k in ("row", "col", "charge"))
                truth_ds = f["truth"] if "truth" in f else {}
                truth_all = {k: truth_ds[k][min(js):max(js) + 1] for k in TRUTH_FIELDS
                             if k in truth_ds}
                eids = f["event_id"][min(js):max(js) + 1] if "event_id" in f else None
            except (OSError, KeyError) as e:
                raise EventStoreError(f"{path}: cannot read events {min(js)}..{max(js)} ({e})") \
                    from e
            # One vectorised check of the whole span; per event only if it fails.
            span_ok = _pixels_ok(row, col, charge, self.geometry)
            for pos, j in items:
                a, b = off[j] - lo, off[j + 1] - lo
                label = int(self.labels[self._file_start[fi] + j])
                ev = Event(row[a:b], col[a:b], charge[a:b], label,
                           {k: _py(v[j - min(js)]) for k, v in truth_all.items()},
                           int(eids[j - min(js)]) if eids is not None else -1)
                if not span_ok or not 0 <= label < len(self.classes):
                    _validate(ev, self.geometry, path, j, len(self.classes))
                out[pos] = ev
        return out  # type: ignore[return-value]


def _py(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return v.copy()
    return v.item() if hasattr(v, "item") else v


def _pixels_ok(row: np.ndarray, col: np.ndarray, charge: np.ndarray, geom: Geometry) -> bool:
    """Pixels inside the image and charges finite and >= 0 (NaN fails ``>=``)."""
    if not len(charge):
        return True
    return bool(row.min() >= 0 and row.max() < geom.height and col.min() >= 0
                and col.max() < geom.width and charge.min() >= 0
                and np.isfinite(charge.max()))


def _validate(ev: Event, geom: Geometry, path: Path, j: int, n_classes: int) -> None:
    if len(ev.row) and (ev.row.min() < 0 or ev.row.max() >= geom.height
                        or ev.col.min() < 0 or ev.col.max() >= geom.width):
        raise EventStoreError(f"{path}: event {j} has pixels outside the {geom.shape} image")
    if not np.all(np.isfinite(ev.charge)):
        raise EventStoreError(f"{path}: event {j} has non-finite charge")
    if len(ev.charge) and ev.charge.min() < 0:
        raise EventStoreError(f"{path}: event {j} has negative charge "
                              f"(min {float(ev.charge.min()):.4g}); charges must be >= 0")
    if not 0 <= ev.label < n_classes:
        raise EventStoreError(f"{path}: event {j} label {ev.label} out of range")
