"""larcv3 files in and out (issue 41): files written by the real larcv library convert to
a store equal pixel for pixel and label for label; store -> larcv3 -> store is exact; bad
input is one line, exit 2, nothing written; a converted store with its own classes trains.

The larcv library is an optional extra (jobs/env/install_larcv.sh, run by `make
install`). Without it these tests skip with the reason, except under
LARTPC_REQUIRE_LARCV=1 (CI, .ci/run), where that is a failure.
"""

from __future__ import annotations

import json
import os
import sys

import h5py
import numpy as np
import pytest
from train_helpers import rows, run, train_cmd

from lartpc.cli import main
from lartpc.data import EventStore
from lartpc.data.larcv3 import STUDY_PDG, ClassMap
from lartpc.errors import LartpcError

try:
    import larcv
except ImportError as e:  # the optional extra is not installed
    larcv = None
    _WHY = f"larcv (optional extra, jobs/env/install_larcv.sh) is not importable: {e}"

needs_larcv = pytest.mark.skipif(
    larcv is None and os.environ.get("LARTPC_REQUIRE_LARCV") != "1",
    reason=_WHY if larcv is None else "")
#: a PDG code no default class takes (a proton)
UNMAPPED = 2212
PROJECTIONS = (0, 1)


@pytest.fixture(autouse=True)
def _larcv_required(request):
    if larcv is None and os.environ.get("LARTPC_REQUIRE_LARCV") == "1" \
            and request.node.get_closest_marker("skipif") is not None:
        pytest.fail(f"LARTPC_REQUIRE_LARCV=1 but {_WHY}")


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory):
    """20 generated events, 400 x 400 (downsample 9): four of each class."""
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("sim")
    write_dataset(d, 20, seed=41, downsample=9, shard_size=8, workers=1)
    return d


def _events(store_path):
    s = EventStore(store_path)
    return s, s.read_many(range(len(s)))


def write_larcv(path, events, width, *, pdgs=None, producer="wire", particles="truth",
                empty=False, rows=None, no_particle=()):
    """A larcv3 file written by larcv's own IOManager: per event, projection 0 holds the
    event's pixels and projection 1 the pixels of the event in reverse order (so the two
    differ); one particle with the event's PDG (or ``pdgs[i]``), none in the entries
    numbered in ``no_particle``."""
    io = larcv.IOManager(larcv.IOManager.kWRITE)
    io.set_out_file(str(path))
    io.initialize()
    metas = []
    for proj in PROJECTIONS:
        m = larcv.ImageMeta2D()
        m.set_dimension(0, 400 * 0.5, rows or width, 0.0)
        m.set_dimension(1, 400 * 0.3, width, 0.0)
        m.set_projection_id(proj)
        metas.append(m)
    for i, ev in enumerate(events):
        io.set_id(1, 0, i)
        for proj, src in zip(PROJECTIONS, (ev, events[len(events) - 1 - i]), strict=True):
            vs = larcv.VoxelSet()
            if not empty:
                idx = src.row.astype(np.uint64) * np.uint64(width) + src.col.astype(np.uint64)
                assert rows is None or len(src.row) == 0 or src.row.max() < rows
                vs.set(idx, src.charge.astype(np.float32))
            io.get_data("sparse2d", producer).set(vs, metas[proj])
        part = larcv.Particle()
        part.pdg_code(int(ev.truth["pdg"] if pdgs is None else pdgs[i]))
        if i not in no_particle:
            io.get_data("particle", particles).append(part)
        io.save_entry()
    io.finalize()


def _same_pixels(a, b):
    np.testing.assert_array_equal(a.row, b.row)
    np.testing.assert_array_equal(a.col, b.col)
    np.testing.assert_array_equal(a.charge, b.charge)


@needs_larcv
def test_larcv_file_converts_pixel_for_pixel(sim_store, tmp_path, capsys):
    store, events = _events(sim_store)
    pdgs = [int(e.truth["pdg"]) for e in events]
    pdgs[3] = UNMAPPED
    src = tmp_path / "in.h5"
    write_larcv(src, events, store.geometry.width, pdgs=pdgs)
    kept = [i for i in range(len(events)) if i != 3]
    for proj in PROJECTIONS:
        out = tmp_path / f"p{proj}"
        assert main(["convert", "--from", "larcv3", str(src), "--out", str(out),
                     "--producer", "wire", "--particles", "truth", "--projection", str(proj),
                     "--shard-size", "7"]) == 0
        said = capsys.readouterr().out
        assert "converted 19 events" in said and "skipped 1" in said
        assert f"{UNMAPPED} x1" in said
        got = EventStore(out)
        assert got.geometry.shape == store.geometry.shape
        assert got.classes == store.classes
        assert len(got) == len(kept)
        for j, i in enumerate(kept):
            want = events[i] if proj == 0 else events[len(events) - 1 - i]
            ev = got[j]
            _same_pixels(ev, want)
            assert ev.label == events[i].label
            assert ev.truth["pdg"] == pdgs[i]
        # every class is there
        assert set(got.labels.tolist()) == set(range(5))
        assert got.attrs["source_format"] == "larcv3"


@needs_larcv
def test_an_empty_entry_never_takes_the_last_ones(sim_store, tmp_path, capsys):
    """larcv's reader hands back the last entry's particle (or tensors) for an entry
    that holds none: such an entry is skipped as having no particle (or refused as
    having no projection), never given its neighbour's label or pixels."""
    store, events = _events(sim_store)
    src = tmp_path / "in.h5"
    write_larcv(src, events, store.geometry.width, no_particle={4})
    out = tmp_path / "out"
    assert main(["convert", "--from", "larcv3", str(src), "--out", str(out), "--producer",
                 "wire", "--particles", "truth"]) == 0
    said = capsys.readouterr().out
    assert "converted 19 events" in said and "1 with no particle" in said, said
    got = EventStore(out)
    for j, i in enumerate(i for i in range(len(events)) if i != 4):
        _same_pixels(got[j], events[i])
        assert got[j].label == events[i].label
    # larcv's writer repeats the last tensors for an entry given none: set its count by hand
    src = tmp_path / "in2.h5"
    write_larcv(src, events, store.geometry.width)
    with h5py.File(src, "r+") as f:
        ext = f["Data/sparse2d_wire_group/extents"]
        row = ext[6]
        row["N"] = 0
        ext[6] = row
    assert main(["convert", "--from", "larcv3", str(src), "--out", str(tmp_path / "o2"),
                 "--producer", "wire", "--particles", "truth"]) == 2
    err = capsys.readouterr().err
    assert f"{src}: entry 6: sparse2d producer 'wire' has no projection 0 (it has: none)" \
        in err, err
    assert not (tmp_path / "o2").exists()


@needs_larcv
def test_store_to_larcv3_to_store_is_exact(sim_store, tmp_path, capsys):
    store, events = _events(sim_store)
    f = tmp_path / "out.h5"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 0
    assert "wrote 20 events" in capsys.readouterr().out
    # larcv's own reader sees every event, its meta and its particle
    io = larcv.IOManager(larcv.IOManager.kREAD)
    io.add_in_file(str(f))
    io.initialize()
    assert io.get_n_entries() == len(events)
    io.read_entry(2)
    t = io.get_data("sparse2d", "lartpc").sparse_tensor(0)
    assert (t.meta().number_of_voxels(0), t.meta().number_of_voxels(1)) == store.geometry.shape
    dense = np.zeros(store.geometry.shape, np.float32)
    dense.flat[np.asarray(t.indexes(), np.int64)] = t.values()
    np.testing.assert_array_equal(dense, events[2].dense(store.geometry.shape))
    assert io.get_data("particle", "lartpc").at(0).pdg_code() == events[2].truth["pdg"]
    io.finalize()

    back = tmp_path / "back"
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(back)]) == 0
    got, again = _events(back)
    assert got.geometry.shape == store.geometry.shape
    np.testing.assert_array_equal(got.labels, store.labels)
    for a, b in zip(again, events, strict=True):
        _same_pixels(a, b)
        assert a.truth["pdg"] == b.truth["pdg"]
        np.testing.assert_allclose(a.truth["momentum_mev"], b.truth["momentum_mev"], rtol=1e-5)
        np.testing.assert_allclose(a.truth["kinetic_energy_mev"],
                                   b.truth["kinetic_energy_mev"], rtol=1e-3)
        np.testing.assert_allclose(a.truth["vertex_cm"], b.truth["vertex_cm"], rtol=1e-5)


def _bad_missing_producer(path, events, width):
    write_larcv(path, events, width)
    return ["--producer", "nosuch"], "no sparse2d producer 'nosuch'"


def _bad_empty(path, events, width):
    write_larcv(path, events, width, empty=True)
    return [], "no pixels"


def _bad_unknown_pdg(path, events, width):
    write_larcv(path, events, width, pdgs=[UNMAPPED] * len(events))
    return [], f"{UNMAPPED} x"


def _bad_projection(path, events, width):
    write_larcv(path, events, width)
    return ["--projection", "2"], "no projection 2"


def _bad_truncated(path, events, width):
    write_larcv(path, events, width)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return [], "cannot read"


@needs_larcv
@pytest.mark.parametrize("make", [_bad_missing_producer, _bad_empty, _bad_unknown_pdg,
                                  _bad_projection, _bad_truncated])
def test_bad_input_is_one_line_and_writes_nothing(sim_store, tmp_path, capfd, make):
    store, events = _events(sim_store)
    src = tmp_path / "in" / "bad.h5"
    src.parent.mkdir()
    good = tmp_path / "in" / "good.h5"
    write_larcv(good, events[:4], store.geometry.width, producer="lartpc",
                particles="lartpc")
    extra, message = make(src, events[:6], store.geometry.width)
    if make is _bad_missing_producer:
        extra = ["--producer", "nosuch"]
    else:
        extra = ["--producer", "wire", "--particles", "truth", *extra]
    capfd.readouterr()
    out = tmp_path / "store"
    inputs = [str(src)] if make in (_bad_missing_producer,) else [str(src)]
    code = main(["convert", "--from", "larcv3", *inputs, "--out", str(out), *extra])
    cap = capfd.readouterr()
    assert code == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert "bad.h5" in lines[0] and message in lines[0]
    # nothing partly written: no shard, no staging folder, no lock beside it
    assert not out.exists() or not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) in (["in", "store"], ["in"])


@needs_larcv
def test_export_refuses_an_existing_file(sim_store, tmp_path, capsys):
    f = tmp_path / "out.h5"
    f.write_bytes(b"mine")
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 2
    assert "exists" in capsys.readouterr().err
    assert f.read_bytes() == b"mine"


@needs_larcv
def test_export_replaces_only_an_earlier_larcv3_file(sim_store, tmp_path, capsys):
    """--overwrite replaces a larcv3 file, never a user's other file or a folder, and no
    output is named as a store's shard (in a store's folder the store would read it)."""
    mine = tmp_path / "notes.py"
    mine.write_text("x = 1\n")
    assert main(["export", "--to", "larcv3", str(sim_store), str(mine), "--overwrite"]) == 2
    assert "exists and is not a larcv3 file" in capsys.readouterr().err
    assert mine.read_text() == "x = 1\n"
    assert main(["export", "--to", "larcv3", str(sim_store), str(tmp_path), "--overwrite"]) == 2
    assert "is a folder; name the larcv3 file to write" in capsys.readouterr().err
    f = tmp_path / "ev.larcv.h5"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 0
    assert main(["export", "--to", "larcv3", str(sim_store), str(f), "--overwrite"]) == 0
    other = tmp_path / "store2"
    other.mkdir()
    assert main(["export", "--to", "larcv3", str(sim_store),
                 str(other / "events-00001.h5")]) == 2
    assert "named as an event store names its shards" in capsys.readouterr().err
    assert list(other.iterdir()) == []


@needs_larcv
def test_export_to_another_projection_converts_back(sim_store, tmp_path, capsys):
    """--projection 2 (MicroBooNE's collection plane): the projections below it hold
    empty tensors (larcv3 would not save the entry otherwise) and convert reads it back
    pixel for pixel."""
    _, events = _events(sim_store)
    f, back = tmp_path / "p2.h5", tmp_path / "back"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f), "--projection", "2"]) == 0
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(back),
                 "--projection", "2"]) == 0
    for a, b in zip(_events(back)[1], events, strict=True):
        _same_pixels(a, b)


@needs_larcv
@pytest.mark.parametrize("extra, message", [
    (["--producer", "a/b c"], "--producer 'a/b c': letters, digits and _ only"),
    (["--producer", ""], "--producer '': letters"),
    (["--projection=-1"], "--projection -1: 0 to 15"),
    (["--projection", "99"], "--projection 99: 0 to 15"),
])
def test_export_bad_options_are_one_line(sim_store, tmp_path, capsys, extra, message):
    f = tmp_path / "x.h5"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


@needs_larcv
def test_export_never_writes_over_the_store_it_reads(sim_store, tmp_path, capsys):
    shard = sorted(sim_store.glob("events-*.h5"))[0]
    before = shard.read_bytes()
    assert main(["export", "--to", "larcv3", str(sim_store), str(shard), "--overwrite"]) == 2
    assert "is a shard of the store being exported" in capsys.readouterr().err
    assert shard.read_bytes() == before


def test_missing_larcv_is_one_line(sim_store, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "larcv", None)  # import larcv raises ImportError
    f = tmp_path / "x.h5"
    f.write_bytes(b"")
    for argv in (["convert", "--from", "larcv3", str(f), "--out", str(tmp_path / "o")],
                 ["export", "--to", "larcv3", str(sim_store), str(tmp_path / "e.h5")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "larcv library" in err[0] and "install_larcv.sh" in err[0]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    assert not (tmp_path / "e.h5").exists()


def test_class_map_default_and_toml(tmp_path):
    default = ClassMap.load(None)
    assert default.classes == ("gamma", "electron", "muon", "pion", "kaon")
    assert {c: default.pdg[c] for codes in STUDY_PDG.values() for c in codes} == {
        22: 0, 11: 1, -11: 1, -13: 2, 211: 3, 321: 4}
    t = tmp_path / "m.toml"
    t.write_text('[classes]\nshower = [22, 11, -11]\ntrack = [-13, 13]\nhadron = [211, 321]\n')
    m = ClassMap.load(t)
    assert m.classes == ("shower", "track", "hadron") and m.pdg[13] == 1
    t.write_text('[classes]\nshower = [22]\ntrack = [22]\n')
    with pytest.raises(LartpcError, match="PDG 22 is in two classes"):
        ClassMap.load(t)


@needs_larcv
@pytest.mark.slow
def test_converted_store_trains_with_its_own_classes(tmp_path):
    """A 3-class mapping: the run's head, eval.csv, confusion.csv and the analysis all
    follow the store's classes."""
    from lartpc.analysis.runs import load_run

    from lartpc.sim import write_dataset

    sim = tmp_path / "sim"
    write_dataset(sim, 40, seed=7, downsample=9, shard_size=40, workers=1)
    store, events = _events(sim)
    src = tmp_path / "in.h5"
    write_larcv(src, events, store.geometry.width, producer="lartpc", particles="lartpc")
    mapping = tmp_path / "three.toml"
    mapping.write_text("[classes]\nshower = [22, 11, -11]\ntrack = [-13]\n"
                       "hadron = [211, 321]\n")
    data = tmp_path / "events"
    assert main(["convert", "--from", "larcv3", str(src), "--out", str(data),
                 "--classes", str(mapping)]) == 0
    conv = EventStore(data)
    assert conv.classes == ("shower", "track", "hadron")
    assert conv.class_counts().tolist() == [16, 8, 16]
    out = tmp_path / "run"
    res = run(train_cmd(data, out, "data.downsample=1"))
    assert res.returncode == 0, res.stderr[-3000:]
    header = (out / "confusion.csv").read_text().splitlines()[0]
    assert header == "true,shower,track,hadron"
    ev = rows(out / "eval.csv")
    assert {"acc_shower", "acc_track", "acc_hadron"} <= set(ev[0])
    assert "acc_gamma" not in ev[0]
    loaded = load_run(out)
    assert loaded.classes == ("shower", "track", "hadron")
    assert loaded.confusion.shape == (3, 3) and loaded.confusion.sum() == int(ev[-1]["n_events"])
    # `lartpc evaluate` rescores the run on its held-out events in the same classes
    scored = tmp_path / "eval.json"
    res = run([sys.executable, "-m", "lartpc", "evaluate", str(out), "--store", str(data),
               "--json", str(scored)])
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(scored.read_text())
    assert got["classes"] == ["shower", "track", "hadron"]
    assert got["matches_run_confusion"] is True
    # the analysis tables name them; the paper's five-class matrix is not set beside them
    rep = tmp_path / "report"
    assert main(["analyze", "report", str(out), "--out", str(rep)]) == 0
    md = (rep / "confusion" / "run_confusion.md").read_text()
    assert "| true \\ predicted | shower | track | hadron | n |" in md
    assert "<h4>paper (" not in (rep / "report.html").read_text()


@needs_larcv
def test_env_names_the_larcv_build(capsys):
    assert main(["env"]) == 0
    assert f"larcv: {larcv.__version__}" in capsys.readouterr().out.splitlines()


@needs_larcv
def test_non_square_image_is_padded_and_downsample_bins_it(sim_store, tmp_path, capsys):
    """A 300 x 400 meta: the store's image is 400 x 400 with the pixels where they were;
    --downsample 4 sums them into 100 x 100."""
    from lartpc.data.store import Event

    _, events = _events(sim_store)
    cut = []
    for ev in events:
        keep = ev.row < 300
        cut.append(Event(ev.row[keep], ev.col[keep], ev.charge[keep], ev.label, ev.truth))
    src = tmp_path / "in.h5"
    write_larcv(src, cut, 400, rows=300)
    full, binned = tmp_path / "full", tmp_path / "binned"
    args = ["convert", "--from", "larcv3", str(src), "--producer", "wire",
            "--particles", "truth"]
    assert main([*args, "--out", str(full)]) == 0
    assert main([*args, "--out", str(binned), "--downsample", "4"]) == 0
    kept = [ev for ev in cut if len(ev.row)]
    assert f"skipped {len(cut) - len(kept)}" in capsys.readouterr().out
    a, b = EventStore(full), EventStore(binned)
    assert a.geometry.shape == (400, 400) and b.geometry.shape == (100, 100)
    assert (a.attrs["source_rows"], a.attrs["source_cols"]) == (300, 400)
    for want, got, small in zip(kept, a.read_many(range(len(a))), b.read_many(range(len(b))),
                                strict=True):
        _same_pixels(got, want)
        dense = np.zeros((100, 100))
        np.add.at(dense, (want.row // 4, want.col // 4), want.charge.astype(np.float64))
        np.testing.assert_allclose(small.dense((100, 100)), dense, rtol=1e-5)


@needs_larcv
def test_display_names_a_larcv3_stores_charge_as_its_voxel_values(sim_store, tmp_path):
    from lartpc.commands.display import charge_unit

    f, back = tmp_path / "ev.h5", tmp_path / "back"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 0
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(back)]) == 0
    assert charge_unit(EventStore(back).attrs) == "the larcv3 file's voxel values"


@needs_larcv
def test_an_exported_downsampled_store_converts_back_as_it_was(sim_store, tmp_path, capsys):
    """export writes a downsampled store's voxels at their own size (9 x 0.3 cm across
    wires); convert reads that size back: the same geometry (downsample 9 of the
    3600-pixel image, the study's pitches) and the same pixels; --downsample 2 then bins
    further (downsample 18). Voxels of another size stay full-resolution pixels."""
    from lartpc.data.larcv3 import source_binning
    from lartpc.geometry import Geometry

    store, events = _events(sim_store)
    f, back, binned = tmp_path / "ds9.h5", tmp_path / "back", tmp_path / "binned"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 0
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(back)]) == 0
    conv, got = _events(back)
    g, want = conv.geometry, store.geometry
    assert (g.downsample, g.full_size, g.shape) == (9, 3600, want.shape)
    assert (g.wire_pitch_cm, g.time_pixel_cm) == (want.wire_pitch_cm, want.time_pixel_cm)
    for a, b in zip(got, events, strict=True):
        _same_pixels(a, b)
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(binned),
                 "--downsample", "2"]) == 0
    assert EventStore(binned).geometry.downsample == 18
    full = Geometry()
    assert source_binning(9 * full.time_pixel_cm, 9 * full.wire_pitch_cm) == 9
    assert source_binning(full.time_pixel_cm, full.wire_pitch_cm) == 1
    assert source_binning(0.5, 0.3) == 1  # not the study's pixels: taken as they are
    assert source_binning(9 * full.time_pixel_cm, 4 * full.wire_pitch_cm) == 1


@needs_larcv
def test_files_with_other_voxel_sizes_are_refused(sim_store, tmp_path, capfd):
    """Two files of the same voxel counts but other voxel sizes (an export of a store
    downsampled by 9, and 0.5 x 0.3 cm voxels) would make one store of two pitches:
    refused in one line naming the second file, nothing written."""
    store, events = _events(sim_store)
    exported, other = tmp_path / "ds9.h5", tmp_path / "other.h5"
    assert main(["export", "--to", "larcv3", str(sim_store), str(exported)]) == 0
    write_larcv(other, events[:4], store.geometry.width, producer="lartpc",
                particles="lartpc")
    capfd.readouterr()
    out = tmp_path / "store"
    code = main(["convert", "--from", "larcv3", str(exported), str(other), "--out", str(out)])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "other.h5: entry 0" in err[0] and "one voxel size per store" in err[0]
    assert "0.5 x 0.3 cm" in err[0]
    assert not out.exists()


@needs_larcv
@pytest.mark.parametrize("fixture", ["sim_store", "full_res_events_dir"])
def test_the_round_trip_keeps_every_geometry_field(fixture, request, tmp_path):
    """export records the store's geometry in the file; convert gives it back whole:
    3456 wires, 9600 ticks, a 3200-tick pretrigger, the downsample (not the 3600 x
    3600 image's 3600 wires, 10800 ticks, no pretrigger it would infer from the meta);
    --downsample bins further and keeps the rest."""
    import dataclasses

    src = request.getfixturevalue(fixture)
    want = EventStore(src).geometry
    f, back, binned = tmp_path / "ev.h5", tmp_path / "back", tmp_path / "binned"
    assert main(["export", "--to", "larcv3", str(src), str(f)]) == 0
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(back)]) == 0
    got = EventStore(back).geometry
    assert (got.n_wires, got.n_ticks, got.pretrigger_ticks) == (3456, 9600, 3200)
    assert got == want
    assert main(["convert", "--from", "larcv3", str(f), "--out", str(binned),
                 "--downsample", "2"]) == 0
    assert EventStore(binned).geometry == dataclasses.replace(
        want, downsample=2 * want.downsample)


def _drop_geometry(path):
    with h5py.File(path, "a") as h:
        del h.attrs["lartpc_geometry"]


def _other_downsample(path):
    with h5py.File(path, "a") as h:
        g = json.loads(h.attrs["lartpc_geometry"])
        h.attrs["lartpc_geometry"] = json.dumps({**g, "downsample": 4, "height": 900,
                                                 "width": 900})


@needs_larcv
@pytest.mark.parametrize("spoil,both,said", [
    (_drop_geometry, False, "second.h5: records no store geometry; "),
    (_other_downsample, False, "second.h5: records geometry downsample=4, height=900, "
                               "width=900; "),
    (_other_downsample, True, "ev.h5: records a 900 x 900 image of 0.6588 x 1.2 cm pixels, "
                              "but its images are 400 x 400 voxels of 1.4823 x 2.7 cm")])
def test_a_recorded_geometry_that_does_not_hold_is_refused(sim_store, tmp_path, capfd,
                                                           spoil, both, said):
    """Files that record different geometries (or one records none), or a geometry that
    the files' own images contradict: one line naming the file, nothing written."""
    f, second, out = tmp_path / "ev.h5", tmp_path / "second.h5", tmp_path / "o"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 0
    assert main(["export", "--to", "larcv3", str(sim_store), str(second)]) == 0
    for p in (f, second) if both else (second,):
        spoil(p)
    capfd.readouterr()
    assert main(["convert", "--from", "larcv3", str(f), str(second), "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not out.exists()


@needs_larcv
def test_a_file_given_twice_is_refused(sim_store, tmp_path, capfd):
    """convert --from larcv3 f.h5 f.h5 would hold every event twice: one line, nothing
    written."""
    f, out = tmp_path / "ev.h5", tmp_path / "o"
    assert main(["export", "--to", "larcv3", str(sim_store), str(f)]) == 0
    capfd.readouterr()
    assert main(["convert", "--from", "larcv3", str(f), str(f), "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{f}: given twice (as {f})" in err[0], err
    assert not out.exists()
