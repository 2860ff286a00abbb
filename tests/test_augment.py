"""``data.augment=mirror``: which events are mirrored, what the batches hold, and that
a training with it trains on mirrored events and resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from train_helpers import final_params, kill_after_steps, rows, run, train_cmd

from lartpc.data import EventStore
from lartpc.data.augment import mirror, mirror_flags
from lartpc.data.loaders import build_loader


def test_flags_are_a_fixed_fair_choice_per_seed_epoch_and_event():
    ids = np.arange(20_000)
    wire, time = mirror_flags(3, 0, ids)
    again = mirror_flags(3, 0, ids[::-1])  # order and batch do not matter, only the id
    assert np.array_equal(again[0][::-1], wire) and np.array_equal(again[1][::-1], time)
    combos = np.bincount(2 * wire + time, minlength=4) / len(ids)
    assert np.all(np.abs(combos - 0.25) < 0.015), combos  # each of the four ~1/4
    for other in (mirror_flags(3, 1, ids), mirror_flags(4, 0, ids)):  # next epoch, seed
        same = (other[0] == wire) & (other[1] == time)
        assert abs(same.mean() - 0.25) < 0.015  # independent: 1/4 agree by chance


@pytest.fixture(scope="module")
def store(events_dir):
    return EventStore(events_dir)


def _flipped(img: np.ndarray, wire: bool, time: bool) -> np.ndarray:
    img = img[:, ::-1] if wire else img
    return img[::-1, :] if time else img


@pytest.mark.parametrize("mode", ["blosc", "sparse"])
def test_batches_hold_the_mirrored_events_and_the_loader_keeps_its_own(store, mode):
    idx = np.arange(40)
    loader = build_loader(store, mode, idx, 8, seed=5)
    shape = store.geometry.shape
    seen = np.zeros(4, int)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for b in loader:
            m = mirror(b, seed=7, epoch=epoch)
            wire, time = mirror_flags(7, epoch, b.event_ids)
            seen += np.bincount(2 * wire + time, minlength=4)
            assert torch.equal(m.labels, b.labels)
            for j, ev in enumerate(store.read_many(b.event_ids)):
                img = ev.dense(shape)
                want = _flipped(img, wire[j], time[j])
                if mode == "blosc":
                    got, orig = m.dense[j, 0].numpy(), b.dense[j, 0].numpy()
                else:
                    got, orig = _scatter(m, j, shape), _scatter(b, j, shape)
                assert np.array_equal(got, want)
                assert np.array_equal(orig, img), "the loader's batch was changed"
    assert np.all(seen > 0), seen  # all four cases occurred


def _scatter(b, j: int, shape) -> np.ndarray:
    c, f = b.coords.numpy(), b.features.numpy()[:, 0]
    sel = c[:, 0] == j
    img = np.zeros(shape, np.float32)
    img[c[sel, 1], c[sel, 2]] = f[sel]
    return img


@pytest.mark.slow
def test_mirrored_training_differs_and_resumes_exactly(train_events_dir, tmp_path):
    plain, ref, cut = tmp_path / "plain", tmp_path / "ref", tmp_path / "cut"
    # 6 epochs of 8 steps: the kill after 11 steps lands well before the end however
    # fast SCNet's steps are (3 epochs left about a second after the 11th row)
    sets = ("train.checkpoint_every_steps=2", "train.epochs=6")
    mirrored = (*sets, "data.augment=mirror")
    for out, s in ((plain, sets), (ref, mirrored)):
        r = run(train_cmd(train_events_dir, out, *s, config="tiny-scnet"))
        assert r.returncode == 0, r.stderr
    kill_after_steps(train_cmd(train_events_dir, cut, *mirrored, config="tiny-scnet"), cut, 11)
    assert json.loads((cut / "run.json").read_text())["status"] == "running", \
        "the run finished before it could be killed"
    r = run(train_cmd(train_events_dir, cut, *mirrored, config="tiny-scnet"))
    assert r.returncode == 0, r.stderr
    loss = {k: [x["local_loss"] for x in rows(k / "rank-000.csv")] for k in (plain, ref, cut)}
    assert loss[cut] == loss[ref]
    assert loss[ref][0] != loss[plain][0]  # the first step already sees mirrored events
    pa, pb = final_params(ref), final_params(cut)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert json.loads((ref / "run.json").read_text())["config"]["data"]["augment"] == "mirror"
