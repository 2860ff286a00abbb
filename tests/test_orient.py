"""``data.orient=start``: the start-finding stage applied as a loader reads its shard
gives the events ``orient_store`` writes, and a training through it is the training on
the oriented copy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lartpc.jobs.local.orient_store import main as orient_store
from test_breakdown import _breakdown
from train_helpers import final_params, run, train_cmd

from lartpc.config import load_config
from lartpc.data import EventStore
from lartpc.data.loaders import build_loader
from lartpc.errors import ConfigError, LartpcError


@pytest.fixture(scope="module")
def oriented_copy(isotropic_events_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("orient") / "copy"
    assert orient_store([str(isotropic_events_dir), str(out)]) == 0
    return out


def _image(batch, j: int, shape) -> np.ndarray:
    """Event ``j`` of a batch as a dense (H, W) array, whichever kind the batch is."""
    if batch.dense is not None:
        return batch.dense[j, 0].numpy().copy()
    img = np.zeros(shape, np.float32)
    mine = batch.coords[:, 0] == j
    rc = batch.coords[mine].numpy()
    img[rc[:, 1], rc[:, 2]] = batch.features[mine, 0].numpy()
    return img


@pytest.mark.parametrize("mode", ["blosc", "sparse"])
def test_loader_turns_the_events_as_the_oriented_copy_holds_them(isotropic_events_dir,
                                                                 oriented_copy, mode, capsys):
    raw, copy = EventStore(isotropic_events_dir), EventStore(oriented_copy)
    idx = np.arange(3, 40)
    turned = build_loader(raw, mode, idx, 6, shuffle=False, orient="start")
    ahead = build_loader(copy, mode, idx, 6, shuffle=False)
    plain = build_loader(raw, mode, idx, 6, shuffle=False)
    assert turned.orient_s > 0 and ahead.orient_s == 0
    shape, moved = raw.geometry.shape, 0
    for a, b, c in zip(turned, ahead, plain, strict=True):
        assert torch.equal(a.labels, b.labels) and np.array_equal(a.event_ids, b.event_ids)
        np.testing.assert_array_equal(a.truth["direction"], c.truth["direction"])  # as is
        for j in range(a.data_size):
            img = _image(a, j, shape)
            assert np.array_equal(img, _image(b, j, shape))
            moved += not np.array_equal(img, _image(c, j, shape))
    assert 0 < moved < len(idx)  # some events turned, some already faced that way


def test_orient_needs_full_resolution_and_a_known_rule(events_dir):
    with pytest.raises(ConfigError, match=r"data.orient = 'start' with data.downsample = 4"):
        load_config("tiny-scnet", ["data.orient=start"])
    with pytest.raises(ConfigError, match="data.orient"):
        load_config("tiny-scnet", ["data.orient=sideways", "data.downsample=1"])
    store = EventStore(events_dir)  # downsampled by 4
    with pytest.raises(LartpcError, match=rf"{events_dir}.*downsample 4"):
        build_loader(store, "sparse", np.arange(5), 5, orient="start")
    with pytest.raises(LartpcError, match="orient 'sideways'"):
        build_loader(store, "sparse", np.arange(5), 5, orient="sideways")


def _train(data, out, *sets):
    r = run(train_cmd(data, out, "data.downsample=1", "train.epochs=1", *sets,
                      config="tiny-scnet"))
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
def test_training_through_the_stage_is_training_on_the_oriented_copy(
        isotropic_events_dir, oriented_copy, tmp_path):
    on_copy = _train(oriented_copy, tmp_path / "copy")
    turned = _train(isotropic_events_dir, tmp_path / "turned", "data.orient=start")
    assert json.loads((turned / "run.json").read_text())["config"]["data"]["orient"] == "start"
    a, b = final_params(on_copy), final_params(turned)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the network trained on the copy, scored on the events as they are, turned as
    # they are read: its own evaluation, event for event
    out = tmp_path / "bd.json"
    r = _breakdown(on_copy, isotropic_events_dir, "--orient", "start", "--json", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["orient"] == "start" and res["matches_run_confusion"] is True


def test_bench_loader_reports_the_stages_cost(isotropic_events_dir, capsys):
    from lartpc.cli import main

    rc = main(["bench", "loader", "--data", str(isotropic_events_dir), "--mode", "sparse",
               "--batch-per-rank", "5", "--repeats", "1", "--steps", "2", "--orient", "start"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["orient"] == "start" and out["events"] == 40
    assert 0 < out["orient_s"] <= out["dlt_s"]  # paid once, inside the loading time
    assert out["orient_ms_per_event"] == pytest.approx(1e3 * out["orient_s"] / 40)
