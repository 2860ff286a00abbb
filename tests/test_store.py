"""Event store reading generated shards; truncated and foreign files."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from lartpc.cli import main
from lartpc.data import EventStore, EventStoreError


def test_random_access_matches_sequential(events_dir):
    s = EventStore(events_dir)
    idx = [37, 2, 21, 19, 20]
    many = s.read_many(idx)
    for i, ev in zip(idx, many, strict=True):
        one = s[i]
        assert ev.event_id == i == one.event_id
        np.testing.assert_array_equal(ev.charge, one.charge)
        img = ev.dense(s.geometry.shape)
        assert img.sum() == pytest.approx(float(ev.charge.sum()), rel=1e-5)


def test_full_resolution_fixture(full_res_events_dir):
    s = EventStore(full_res_events_dir)
    assert s.geometry.shape == (3600, 3600) and len(s) == 10
    rows = np.concatenate([s[i].row for i in range(len(s))])
    cols = np.concatenate([s[i].col for i in range(len(s))])
    # time pixels: pretrigger 1066.7 + x / 0.1647 cm <= 2621 (0.1098 cm/us x 1.5 us),
    # widened by the readout's time response (3 sigma of 2.7 ticks = 3 pixels) and by
    # noise-only ROIs anywhere in the window; wires < 3456
    assert rows.max() < 3200 and cols.max() < 3456
    signal = rows[(rows >= 1066 - 3) & (rows <= 2622 + 3)]
    assert len(signal) > 0.99 * len(rows)


def test_truncated_file(events_dir, tmp_path, capsys):
    src = sorted(events_dir.glob("events-*.h5"))[0]
    bad = tmp_path / "events-00000.h5"
    data = src.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(EventStoreError, match="events-00000.h5"):
        EventStore(bad)
    assert main(["inspect", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


def test_foreign_hdf5(tmp_path, capsys):
    f = tmp_path / "foreign.h5"
    with h5py.File(f, "w") as h:
        h["image/wires"] = np.zeros((1, 3, 4, 4), np.int32)
    with pytest.raises(EventStoreError, match="not a lartpc event file"):
        EventStore(f)
    assert main(["display", str(f), "--out", str(tmp_path / "x.png")]) == 2
    assert "foreign.h5" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_inspect_reports(events_dir, capsys):
    assert main(["inspect", str(events_dir), "--json"]) == 0
    import json

    s = json.loads(capsys.readouterr().out)
    assert s["events"] == 40 and s["events_per_class"]["kaon"] == 8
    assert s["geometry"]["downsample"] == 4
    p = s["active_pixels_percentiles"]
    assert 0 < p["p5"] <= p["p50"] <= p["p95"]
    assert s["bytes_per_event"] > 0


def test_copy_of_folder_reads_same(events_dir, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(events_dir, dst)
    assert EventStore(dst).labels.tolist() == EventStore(events_dir).labels.tolist()
