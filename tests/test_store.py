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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four small stores (two shards each) that differ in one way each from ``iso``:
    beam source, another seed, the sim3 physics."""
    from lartpc.sim import write_dataset

    base = tmp_path_factory.mktemp("runs")
    made = {"iso": {}, "beam": {"source_geometry": "beam"}, "seed1": {"seed": 1},
            "sim3": {"physics": "sim3"}}
    for name, kw in made.items():
        write_dataset(base / name, 4, downsample=9, shard_size=2,
                      **{"seed": 0, **kw})
    return base


def _mixed(tmp_path, *sources):
    """A folder holding the given shards, renamed ``events-00000.h5``, ... in order."""
    out = tmp_path / "mixed"
    out.mkdir()
    for i, src in enumerate(sources):
        shutil.copy(src, out / f"events-{i:05d}.h5")
    return out


@pytest.mark.parametrize("other,attribute", [("beam", "source_geometry"), ("seed1", "seed"),
                                             ("sim3", "generator_version")])
def test_shards_of_different_runs_are_refused(runs, tmp_path, capsys, other, attribute):
    """Shards made differently (here: another source geometry, seed or physics, the same
    geometry and classes) never pass as one store: one line naming both files and the
    attribute, exit 2."""
    out = _mixed(tmp_path, runs / "iso" / "events-00000.h5", runs / other / "events-00001.h5")
    with pytest.raises(EventStoreError, match=f"disagree on {attribute}") as e:
        EventStore(out)
    assert "events-00000.h5" in str(e.value) and "events-00001.h5" in str(e.value)
    assert main(["inspect", str(out), "--truth-limits"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"disagree on {attribute}" in err[0], err


def test_a_shard_copied_under_another_name_is_refused(events_dir, tmp_path, capsys):
    """The same shard twice: its events would count twice and could sit in training and
    validation both."""
    src = events_dir / "events-00000.h5"
    out = _mixed(tmp_path, src, events_dir / "events-00001.h5", src)
    with pytest.raises(EventStoreError, match="repeat") as e:
        EventStore(out)
    assert "events-00000.h5 and events-00002.h5" in str(e.value)
    assert main(["inspect", str(out)]) == 2
    assert "20 events" in capsys.readouterr().err


def test_the_shards_of_one_run_still_make_a_store(runs, events_dir, tmp_path):
    """A run's own shards, in any number; and the events of one seed made in two
    pieces (evaluate --regenerate's way) with no event twice."""
    from lartpc.sim.subset import write_events

    assert len(EventStore(runs / "iso")) == 4 and len(EventStore(events_dir)) == 40
    write_events(tmp_path / "a", [0, 2], seed=0, source_geometry="isotropic", downsample=9)
    write_events(tmp_path / "b", [3, 1], seed=0, source_geometry="isotropic", downsample=9)
    s = EventStore(_mixed(tmp_path, tmp_path / "a" / "events-00000.h5",
                          tmp_path / "b" / "events-00000.h5"))
    assert [ev.event_id for ev in s.read_many(range(4))] == [0, 2, 3, 1]
