"""jobs/local/orient_store: every event mirrored so that the start found in the image
lies at its low-wire, early end; labels, charge and truth kept."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lartpc.jobs.local.orient_store import main

from lartpc.data.orient import find_start
from lartpc.data.store import EventStore


def _found_direction(ev, geom):
    return find_start(geom, ev.row.astype(float), ev.col.astype(float), ev.charge)[1]


def test_oriented_copy_faces_one_way_and_keeps_the_events(isotropic_events_dir, tmp_path, capsys):
    out = tmp_path / "oriented"
    assert main([str(isotropic_events_dir), str(out), "--workers", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    src, dst = EventStore(isotropic_events_dir), EventStore(out)
    assert got["events"] == len(src) == len(dst) == 40 and got["shards"] == 2
    assert 0 < got["mirrored_wire_axis"] < 40 and 0 < got["mirrored_time_axis"] < 40
    assert dst.attrs["oriented_by"] == "find_start"
    for key in ("seed", "generator_version", "source_geometry"):
        assert dst.attrs[key] == src.attrs[key]
    np.testing.assert_array_equal(dst.labels, src.labels)
    facing, wire_flips = 0, 0
    for a, b in zip(src.read_many(range(40)), dst.read_many(range(40)), strict=True):
        np.testing.assert_array_equal(np.sort(a.charge), np.sort(b.charge))
        np.testing.assert_array_equal(a.truth["direction"], b.truth["direction"])
        flipped = not np.array_equal(a.col, b.col)
        wire_flips += flipped
        if flipped:  # a mirror image, pixel for pixel
            np.testing.assert_array_equal(b.col, src.geometry.width - 1 - a.col)
        dx, dz = _found_direction(b, dst.geometry)
        facing += bool(dz >= 0 and dx >= 0)
    assert wire_flips == got["mirrored_wire_axis"]
    # the rule finds the same start in the mirror image, now facing +wire, +time
    assert facing >= 36, facing


def test_refusals_name_the_folder_and_write_nothing(isotropic_events_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(isotropic_events_dir), str(isotropic_events_dir)])
    assert e.value.code == 2 and "is the source" in capsys.readouterr().err
    full = tmp_path / "full"
    assert main([str(isotropic_events_dir), str(full)]) == 0
    before = sorted(p.stat().st_mtime_ns for p in full.iterdir())
    with pytest.raises(SystemExit) as e:
        main([str(isotropic_events_dir), str(full)])
    assert e.value.code == 2 and "already holds 2 event shard(s)" in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in full.iterdir()) == before
