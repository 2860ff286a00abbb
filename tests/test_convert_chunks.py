"""Converter on files chunked like upstream; time origin and charge-scale options."""

from __future__ import annotations

from collections import Counter

import h5py
import numpy as np
import pytest

from lartpc.cli import main
from lartpc.data import EventStore
from lartpc.data.convert import convert

EVENTS_PER_CHUNK = 10  # upstream: chunks of (10, 3, 9600, 3600) int32, deflate 5
MU, PI, PROTON = 7, 4, 2  # label/type columns


def _write_chunked(path, labels, ticks=96, wires=36, seed=0):
    """Upstream layout with upstream's chunk shape ratio: 10 events x all planes x the
    whole image per chunk (smaller images). Returns the collection planes written."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    planes = np.zeros((n, ticks, wires), np.int32)
    with h5py.File(path, "w") as f:
        # maxshape lets a file of fewer than 10 events keep the 10-event chunk
        w = f.create_dataset("image/wires", (n, 3, ticks, wires), np.int32,
                             chunks=(EVENTS_PER_CHUNK, 3, ticks, wires),
                             maxshape=(None, 3, ticks, wires),
                             compression="gzip", compression_opts=5)
        for i in range(n):
            t = rng.integers(0, ticks, 40)
            c = rng.integers(0, wires, 40)
            planes[i, t, c] = rng.integers(1, 500, 40)
        w[:, 2] = planes
        w[:, 0] = 7  # an induction plane the converter must ignore
        lab = np.zeros((n, 10), np.int32)
        lab[np.arange(n), labels] = 1
        f["label/type"] = lab
    return planes


@pytest.fixture
def read_log(monkeypatch):
    """Every read of image/wires, as the set of event-axis chunks it touches."""
    log: list[set[int]] = []
    orig = h5py.Dataset.__getitem__

    def spy(self, key):
        if self.name == "/image/wires":
            k0 = key[0] if isinstance(key, tuple) else key
            if isinstance(k0, slice):
                lo, hi, _ = k0.indices(self.shape[0])
                idx = range(lo, hi)
            else:
                idx = [int(k0)]
            log.append({i // EVENTS_PER_CHUNK for i in idx})
        return orig(self, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    return log


def test_each_chunk_is_read_once(tmp_path, read_log):
    # 35 events = 3 full chunks + a partial one; chunk 2 holds only protons (skipped)
    labels = [MU] * 20 + [PROTON] * 10 + [PI] * 5
    src = tmp_path / "up.h5"
    planes = _write_chunked(src, labels)
    res = convert([src], tmp_path / "o")
    assert (res.converted, res.skipped) == (25, 10)
    # a chunk with a HDF5 default 1 MiB cache is decompressed on every read touching
    # it: one read per chunk means one decompression per chunk (event-wise: ten)
    touched = Counter(c for chunks in read_log for c in chunks)
    assert touched == {0: 1, 1: 1, 3: 1}
    assert all(len(c) == 1 for c in read_log)  # no read straddles two chunks
    s = EventStore(tmp_path / "o")
    for k, src_i in ((0, 0), (19, 19), (20, 30), (24, 34)):
        ev = s[k]
        img = planes[src_i].reshape(32, 3, 36).sum(axis=1)
        assert ev.event_id == src_i
        assert ev.charge.sum() == img.sum() > 0
        assert img[ev.row, ev.col].tolist() == ev.charge.tolist()


def test_time_origin_and_charge_scale(tmp_path):
    src = tmp_path / "up.h5"
    planes = _write_chunked(src, [MU] * 3, ticks=96 * 3, seed=1)
    convert([src], tmp_path / "file")
    convert([src], tmp_path / "gen", time_origin="generator", charge_scale=0.25)
    a, b = EventStore(tmp_path / "file"), EventStore(tmp_path / "gen")
    # upstream: x = 0 at tick 800 (pixel ~267); generator: tick 3200 (pixel ~1067)
    assert b.attrs["time_origin"] == "generator" and b.attrs["time_shift_rows"] == 800
    assert a.attrs["time_shift_rows"] == 0 and a.attrs["charge_scale"] == 1.0
    for i in range(3):
        assert b[i].row.tolist() == (a[i].row + 800).tolist()
        np.testing.assert_allclose(b[i].charge, 0.25 * a[i].charge)
        assert a[i].charge.sum() == planes[i].sum()


def test_generator_origin_drops_pixels_pushed_past_the_image(tmp_path):
    src = tmp_path / "up.h5"
    with h5py.File(src, "w") as f:
        w = f.create_dataset("image/wires", (1, 3, 9600, 8), np.int32, chunks=(1, 3, 9600, 8),
                             compression="gzip")
        w[0, 2, 3000, 1] = 5  # pixel 1000 -> 1800
        w[0, 2, 9599, 2] = 9  # pixel 3199 -> 3999: outside the 3600-row image
        lab = np.zeros((1, 10), np.int32)
        lab[0, MU] = 1
        f["label/type"] = lab
    convert([src], tmp_path / "o", time_origin="generator")
    ev = EventStore(tmp_path / "o")[0]
    assert ev.row.tolist() == [1800] and ev.charge.tolist() == [5.0]


@pytest.mark.parametrize("argv,needle", [
    (["--charge-scale", "0"], "--charge-scale"),
    (["--charge-scale", "nan"], "--charge-scale"),
    (["--time-origin", "generator", "--trigger-tick", "-5"], "--trigger-tick"),
    # the larcv3 options would be ignored here: refused, not silently dropped
    (["--classes", "two.toml"], "--classes: applies to --from larcv3 only"),
    (["--projection", "2"], "--projection: applies to --from larcv3 only"),
    (["--producer", "wire"], "--producer: applies to --from larcv3 only"),
    (["--particles", "truth"], "--particles: applies to --from larcv3 only"),
])
def test_bad_convert_options(tmp_path, capsys, argv, needle):
    src = tmp_path / "up.h5"
    _write_chunked(src, [MU] * 2)
    out = tmp_path / "o"
    assert main(["convert", str(src), "--out", str(out), *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists() or not list(out.iterdir())
