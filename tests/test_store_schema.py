"""Event-store schema versions: v2 adds truth and attributes; v1 stores keep loading."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from lartpc.data import EventStore, EventStoreError
from lartpc.data.store import SCHEMA_VERSION, Event, write_shard
from lartpc.geometry import Geometry
from lartpc.sim import GENERATOR_VERSION, simulate_event

GEOM = Geometry(downsample=8)


def _events(n=4):
    return [simulate_event(i, 3, GEOM) for i in range(n)]


def test_v2_records_visible_energy_and_generator_version(tmp_path):
    evs = _events()
    p = write_shard(tmp_path / "events-00000.h5", evs, GEOM, generator_version=GENERATOR_VERSION,
                    attrs={"source_geometry": "isotropic"})
    s = EventStore(p)
    assert s.attrs["schema_version"] == SCHEMA_VERSION == 2
    assert s.attrs["generator_version"].endswith("+sim4")  # the latest physics
    assert s.attrs["source_geometry"] == "isotropic"
    for ev, orig in zip(s.read_many(range(4)), evs, strict=True):
        vis = ev.truth["visible_energy_mev"]
        assert vis == pytest.approx(orig.truth["visible_energy_mev"], rel=1e-6)
        assert 10.0 <= vis <= ev.truth["kinetic_energy_mev"] * 1.01 + 60  # + a Michel e+
    with pytest.raises(EventStoreError, match="clashes"):
        write_shard(tmp_path / "x.h5", evs, GEOM, attrs={"seed": 3})


def test_version_1_store_still_loads(tmp_path):
    # a v1 file: same datasets without truth/visible_energy_mev, no extra attributes
    p = write_shard(tmp_path / "events-00000.h5", _events(), GEOM, generator_version="0.1+sim1")
    with h5py.File(p, "a") as f:
        f.attrs["schema_version"] = 1
        del f["truth/visible_energy_mev"]
    s = EventStore(p)
    assert len(s) == 4 and s.attrs["schema_version"] == 1
    ev = s[2]
    assert len(ev) > 0 and "visible_energy_mev" not in ev.truth
    assert ev.truth["pdg"] == -13  # event 2 is the muon


def test_unknown_schema_version_is_refused(tmp_path):
    p = write_shard(tmp_path / "events-00000.h5", [Event(np.zeros(1, np.int16),
                    np.zeros(1, np.int16), np.ones(1, np.float32), 0)], GEOM)
    with h5py.File(p, "a") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(EventStoreError, match="events-00000.h5.*schema_version 99"):
        EventStore(p)


def _replace(f: h5py.File, name: str, data) -> None:
    del f[name]
    f[name] = data


@pytest.mark.parametrize("damage,message", [
    # NaN or fractional pixel coordinates used to be accepted and cast to row 0
    (lambda f: _replace(f, "row", np.full(f["row"].shape, np.nan)),
     "dataset 'row' holds float64; expected integers"),
    (lambda f: _replace(f, "col", f["col"][:] + 0.5), "dataset 'col' holds float64"),
    # each of these used to end in a traceback (exit 1, the code of a diverged run)
    (lambda f: _replace(f, "charge", np.array([b"x"] * f["charge"].shape[0])),
     "dataset 'charge' holds |S1; expected numbers"),
    (lambda f: _replace(f, "offsets", f["offsets"][:].astype(float)),
     "dataset 'offsets' holds float64; expected integers"),
    (lambda f: _replace(f, "row", f["row"][:-1]), "dataset 'row' has "),
    (lambda f: _replace(f, "label", f["label"][:][:, None]),
     "dataset 'label' has shape (4, 1); expected 1-D"),
])
def test_bad_shard_datasets_are_one_line_errors(tmp_path, damage, message):
    import subprocess
    import sys

    p = write_shard(tmp_path / "events-00000.h5", _events(), GEOM)
    with h5py.File(p, "a") as f:
        damage(f)
    r = subprocess.run([sys.executable, "-m", "lartpc", "inspect", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"{p}: {message}" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
