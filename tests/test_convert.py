"""Upstream dense layout -> event store (files built here in that layout)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from lartpc.cli import main
from lartpc.data import EventStore
from lartpc.data.convert import convert, label_of

# label/type columns: e-, e+, proton, pi0, pi+, pi-, mu-, mu+, K+, gamma
ONE_HOT = {"e-": 0, "e+": 1, "pi+": 4, "mu+": 7, "K+": 8, "gamma": 9}


def _label(*names):
    v = np.zeros(10, np.int32)
    for n in names:
        v[ONE_HOT.get(n, 2 if n == "proton" else 6)] += 1
    return v


def _write_upstream(path, labels, ticks=96, wires=36, hits=None):
    n = len(labels)
    with h5py.File(path, "w") as f:
        w = f.create_dataset("image/wires", (n, 3, ticks, wires), np.int32,
                             chunks=(1, 1, ticks, wires), compression="gzip")
        for i, (t, c, v) in enumerate(hits or []):
            # write only the hits' bounding block, so untouched chunks stay unallocated
            t0, t1, c0, c1 = t.min(), t.max() + 1, c.min(), c.max() + 1
            block = np.zeros((t1 - t0, c1 - c0), np.int32)
            block[t - t0, c - c0] = v
            w[i, 2, t0:t1, c0:c1] = block
            w[i, 0, t0:t1, c0:c1] = 999 * (block > 0)  # induction plane: must be ignored
        f["label/type"] = np.array(labels, np.int32)


def test_label_mapping():
    assert label_of(_label("e+")) == (1, -11)
    assert label_of(_label("e-")) == (1, 11)
    assert label_of(_label("gamma")) == (0, 22)
    assert label_of(_label("mu+")) == (2, -13)
    assert label_of(_label("pi+")) == (3, 211)
    assert label_of(_label("K+")) == (4, 321)
    assert label_of(_label("mu-")) is None  # not a study class
    assert label_of(_label("pi+", "proton")) is None  # not exactly one particle
    assert label_of(np.zeros(10)) is None


def test_convert_small_layout(tmp_path, capsys):
    src = tmp_path / "up.h5"
    hits = [(np.array([0, 1, 2, 3, 95]), np.array([5, 5, 5, 6, 35]), np.array([10, 20, 30, 7, 4])),
            (np.array([10]), np.array([0]), np.array([1])),
            (np.array([50, 51]), np.array([20, 20]), np.array([3, 4]))]
    _write_upstream(src, [_label("mu+"), _label("pi+", "proton"), _label("K+")], hits=hits)
    out = tmp_path / "store"
    assert main(["convert", str(src), "--out", str(out)]) == 0
    assert "skipped 1" in capsys.readouterr().out
    s = EventStore(out)
    assert len(s) == 2 and s.geometry.shape == (3600, 3600)
    assert s.labels.tolist() == [2, 4]
    mu = s[0]
    # ticks 0,1,2 -> time pixel 0 (sum 60), tick 3 -> pixel 1, tick 95 -> pixel 31
    got = {(int(r), int(c)): float(q) for r, c, q in zip(mu.row, mu.col, mu.charge, strict=True)}
    assert got == {(0, 5): 60.0, (1, 6): 7.0, (31, 35): 4.0}
    assert s[1].event_id == 2 and s[1].truth["pdg"] == 321
    k = s[1]
    assert k.row.tolist() == [16, 17] and k.charge.tolist() == [3.0, 4.0]


def test_convert_downsample(tmp_path):
    src = tmp_path / "up.h5"
    hits = [(np.array([0, 3, 30]), np.array([0, 1, 7]), np.array([1, 2, 5]))]
    _write_upstream(src, [_label("gamma")], hits=hits)
    res = convert([src], tmp_path / "o", downsample=4)
    assert (res.converted, res.skipped) == (1, 0)
    ev = EventStore(tmp_path / "o")[0]
    # time pixels 0,1 wires 0,1 -> bin (0,0) = 3; time pixel 10, wire 7 -> bin (2,1)
    assert dict(zip(zip(ev.row.tolist(), ev.col.tolist(), strict=True), ev.charge.tolist(),
                    strict=True)) == {(0, 0): 3.0, (2, 1): 5.0}


def test_convert_true_upstream_shape(tmp_path):
    # The real per-event shape (3, 9600, 3600) int32, gzip, chunked; mostly unwritten
    # chunks keep the file tiny.
    src = tmp_path / "full.h5"
    t = np.arange(3000, 3300)
    hits = [(t, 100 + t // 10, np.full(t.shape, 5)), (np.array([9599]), np.array([3599]),
                                                      np.array([8]))]
    _write_upstream(src, [_label("e-"), _label("gamma")], ticks=9600, wires=3600, hits=hits)
    res = convert([src], tmp_path / "o")
    s = EventStore(tmp_path / "o")
    assert res.converted == 2
    e0 = s[0]
    assert e0.charge.sum() == 5 * 300 and e0.row.min() == 1000 and e0.row.max() == 1099
    assert s[1].row.tolist() == [3199] and s[1].col.tolist() == [3599]


@pytest.mark.parametrize("missing", ["image/wires", "label/type"])
def test_missing_dataset(tmp_path, capsys, missing):
    src = tmp_path / "up.h5"
    _write_upstream(src, [_label("mu+")])
    with h5py.File(src, "a") as f:
        del f[missing]
    out = tmp_path / "o"
    assert main(["convert", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "up.h5" in err and missing in err
    assert not out.exists() or not list(out.iterdir())


def test_truncated_upstream(tmp_path, capsys):
    src = tmp_path / "up.h5"
    _write_upstream(src, [_label("mu+")] * 2)
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 3])
    out = tmp_path / "o"
    assert main(["convert", str(src), "--out", str(out)]) == 2
    assert "up.h5" in capsys.readouterr().err
    assert not out.exists() or not list(out.iterdir())


def test_second_input_bad_leaves_nothing(tmp_path, capsys):
    good, bad = tmp_path / "good.h5", tmp_path / "bad.h5"
    _write_upstream(good, [_label("mu+")] * 3)
    with h5py.File(bad, "w") as f:
        f["something"] = np.zeros(3)
    out = tmp_path / "o"
    assert main(["convert", str(good), str(bad), "--out", str(out), "--shard-size", "1"]) == 2
    assert "bad.h5" in capsys.readouterr().err
    assert not list(out.glob("events-*.h5")) if out.exists() else True


def test_failed_overwrite_keeps_the_old_store(tmp_path, capsys):
    """`convert --overwrite` deleted the old shards before converting; a conversion
    that failed part-way left the folder empty. Now the new shards are staged beside it
    and swapped in only when every input converted."""
    old_src, good, bad = tmp_path / "old.h5", tmp_path / "good.h5", tmp_path / "bad.h5"
    _write_upstream(old_src, [_label("K+")] * 2)
    out = tmp_path / "store"
    assert main(["convert", str(old_src), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _write_upstream(good, [_label("mu+")] * 3)
    hit = (np.array([1, 2]), np.array([3, 3]), np.array([5, 6]))
    _write_upstream(bad, [_label("mu+")] * 3, hits=[hit] * 3)
    with h5py.File(bad, "r") as f:  # the last event's collection-plane chunk
        info = f["image/wires"].id.get_chunk_info_by_coord((2, 2, 0, 0))
    with open(bad, "r+b") as f:  # garbage in it: passes every up-front check, fails mid-way
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    assert main(["convert", str(good), str(bad), "--out", str(out), "--overwrite",
                 "--shard-size", "1"]) == 2
    assert "bad.h5" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert EventStore(out).labels.tolist() == [4, 4]
    assert main(["convert", str(good), "--out", str(out), "--overwrite"]) == 0
    assert EventStore(out).labels.tolist() == [2, 2, 2]


def test_bad_downsample_named_and_nothing_written(tmp_path, capsys):
    src = tmp_path / "up.h5"
    _write_upstream(src, [_label("mu+")])
    out = tmp_path / "o"
    assert main(["convert", str(src), "--out", str(out), "--downsample", "7"]) == 2
    assert "--downsample: downsample=7: must be a positive divisor of 3600" in \
        capsys.readouterr().err
    assert not out.exists()


def test_other_value_errors_are_not_blamed_on_downsample(tmp_path, monkeypatch):
    """The command once read every ValueError of the conversion as a bad --downsample."""
    import lartpc.data.convert as conv

    def broken(*args, **kwargs):
        raise ValueError("a reader's own failure")

    monkeypatch.setattr(conv, "_convert_into", broken)
    src = tmp_path / "up.h5"
    _write_upstream(src, [_label("mu+")])
    with pytest.raises(ValueError, match="a reader's own failure"):
        main(["convert", str(src), "--out", str(tmp_path / "o")])


def test_a_float_image_converts_its_fractions_and_refuses_nan(tmp_path, capsys):
    """Float ADC is summed as float (it was cast to integers, dropping fractions); a NaN
    in an image is an error naming the file and event (it converted to an empty event)."""
    src = tmp_path / "float.h5"
    with h5py.File(src, "w") as f:
        w = np.zeros((2, 3, 96, 36), np.float32)
        w[0, 2, 0:3, 5] = [0.5, 0.25, 0.5]
        w[1, 2, 3, 7] = np.nan
        f["image/wires"] = w
        f["label/type"] = np.array([_label("mu+"), _label("K+")], np.int32)
    out = tmp_path / "store"
    assert main(["convert", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "float.h5: image/wires of event 1 (of this file) holds NaN" in err
    assert not out.exists() or not any(out.iterdir())
    with h5py.File(src, "r+") as f:
        f["image/wires"][1, 2, 3, 7] = 2.0
    assert main(["convert", str(src), "--out", str(out)]) == 0
    assert EventStore(out)[0].charge.tolist() == [1.25]


def test_no_event_converted_is_an_error_and_writes_no_store(tmp_path, capsys):
    """Every event's label outside the five classes: exit 2 and no empty store (training
    on it failed later with advice about ranks and eval_fraction)."""
    src = tmp_path / "protons.h5"
    _write_upstream(src, [_label("proton")] * 3)
    out = tmp_path / "store"
    assert main(["convert", str(src), "--out", str(out)]) == 2
    assert "no event converted (of 3: 3 with a label not exactly one of" in \
        capsys.readouterr().err
    assert not out.exists()  # the folder it made for the store goes too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["protons.h5"]


def test_event_numbers_count_within_each_file(tmp_path, capsys):
    """With several inputs, a bad event is numbered within its own file."""
    good, bad = tmp_path / "good.h5", tmp_path / "bad.h5"
    _write_upstream(good, [_label("mu+")] * 3)
    with h5py.File(bad, "w") as f:
        w = np.zeros((2, 3, 96, 36), np.float32)
        w[1, 2, 3, 7] = np.nan
        f["image/wires"] = w
        f["label/type"] = np.array([_label("mu+"), _label("K+")], np.int32)
    assert main(["convert", str(good), str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.h5: image/wires of event 1 (of this file) holds NaN" in capsys.readouterr().err


def test_inputs_that_are_shards_of_out_are_never_removed(tmp_path, capsys):
    """convert --overwrite into the folder its inputs sit in, named as shards: refused
    before anything is written (the new store would have removed them)."""
    out = tmp_path / "dd"
    out.mkdir()
    for i in range(2):
        _write_upstream(out / f"events-0000{i}.h5", [_label("mu+")] * 2)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    inputs = [str(out / "events-00000.h5"), str(out / "events-00001.h5")]
    assert main(["convert", *inputs, "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'events-00000.h5'}: is a shard of --out {out}" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_bad_input_shapes_are_one_line(tmp_path, capsys):
    """image/wires a group, not a dataset; an input that is a folder."""
    src = tmp_path / "grp.h5"
    with h5py.File(src, "w") as f:
        f.create_group("image/wires")
        f["label/type"] = np.array([_label("mu+")], np.int32)
    assert main(["convert", str(src), "--out", str(tmp_path / "o")]) == 2
    assert "grp.h5: missing dataset 'image/wires'" in capsys.readouterr().err
    assert main(["convert", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert f"{tmp_path}: is a folder; give the input files in it" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_out_given_as_the_current_folder_counts_its_files(tmp_path, capsys, monkeypatch):
    """--out . : the store replaces the folder the shell is in; the count and the folder
    named are the new store's (it said 0 files: "." still named the old one)."""
    src = tmp_path / "up.h5"
    _write_upstream(src, [_label("mu+")] * 3)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["convert", str(src), "--out", ".", "--shard-size", "2"]) == 0
    said = capsys.readouterr().out
    assert "converted 3 events into 2 file(s)" in said, said
    assert len(EventStore(here)) == 3


def test_display_names_a_converted_stores_charge_unit(tmp_path):
    """A converted store's charges are summed ADC (times --charge-scale), not the
    generator's 10^3 electrons: the display's colour bar says which."""
    from lartpc.commands.display import charge_unit

    src = tmp_path / "up.h5"
    _write_upstream(src, [_label("mu+")] * 2)
    convert([src], tmp_path / "raw")
    assert charge_unit(EventStore(tmp_path / "raw").attrs) == "summed ADC"
    convert([src], tmp_path / "scaled", charge_scale=0.25)
    assert charge_unit(EventStore(tmp_path / "scaled").attrs) == "summed ADC x 0.25"


def _two_events(path, charge=10):
    hits = [(np.array([0, 3]), np.array([5, 6]), np.array([charge, 7])),
            (np.array([50]), np.array([20]), np.array([3]))]
    _write_upstream(path, [_label("mu+"), _label("K+")], hits=hits)


def test_an_input_given_twice_is_refused_before_writing(tmp_path, capsys):
    """The same file twice (by one name, or a byte copy under another) would put each of
    its events in the store twice: refused in one line naming both, nothing written.
    Two files of the same size but other events convert."""
    import shutil

    src, copy, other = tmp_path / "up.h5", tmp_path / "copy.h5", tmp_path / "other.h5"
    _two_events(src)
    shutil.copy(src, copy)
    _two_events(other, charge=11)
    out = tmp_path / "o"
    for second, said in ((src, f"{src}: given twice (as {src})"),
                         (copy, f"{copy}: a copy of {src} (the same bytes)")):
        assert main(["convert", str(src), str(second), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
        assert not out.exists()
    assert other.stat().st_size == src.stat().st_size
    assert main(["convert", str(src), str(other), "--out", str(out)]) == 0
    assert [ev.event_id for ev in EventStore(out).read_many(range(4))] == [0, 1, 2, 3]


def test_a_converted_stores_shard_copied_in_again_is_refused(tmp_path, capsys):
    """A converted store's events are known by their source index (inputs in order):
    a copy of one of its shards under a new name repeats them, and is refused."""
    import shutil

    src, out = tmp_path / "up.h5", tmp_path / "o"
    _two_events(src)
    assert main(["convert", str(src), "--out", str(out), "--shard-size", "1"]) == 0
    shutil.copy(out / "events-00001.h5", out / "events-00002.h5")
    assert main(["inspect", str(out)]) == 2
    err = capsys.readouterr().err
    assert "events-00001.h5 and events-00002.h5 repeat events" in err, err
