"""Bad training inputs (config fields, shard attributes, charges) are one clear error,
raised before anything is written."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
from train_helpers import run, train_cmd

from lartpc.config import load_config
from lartpc.data import EventStore, EventStoreError
from lartpc.data.store import Event, write_shard
from lartpc.errors import ConfigError
from lartpc.geometry import Geometry


@pytest.mark.parametrize("sets,message", [
    (['train.betas=["a","b"]'], "train.betas = ['a', 'b']: expected a list of numbers"),
    (["train.betas=[0.9,1.0]"], "train.betas = [0.9, 1.0]: expected two numbers in [0, 1)"),
    (["train.betas=[-0.1,0.9]"], "expected two numbers in [0, 1)"),
    (["train.betas=[0.9]"], "expected two numbers in [0, 1)"),
    (["train.eps=-1e-8"], "train.eps = -1e-08: must be > 0"),
    (["train.weight_decay=-0.01"], "train.weight_decay = -0.01: must be >= 0"),
    (["train.seed=-1"], "train.seed = -1: must be >= 0"),
    (["train.lr=inf"], "train.lr = inf: must be finite"),
    (["train.lr=nan"], "train.lr = nan: must be > 0"),
    (["train.momentum=-0.5"], "train.momentum = -0.5: must be >= 0"),
    (["train.checkpoint_every_steps=-1"], "train.checkpoint_every_steps = -1: must be >= 0"),
    (["train.checkpoint_every_s=-600"], "train.checkpoint_every_s = -600.0: must be >= 0"),
    (["data.prefetch=-1"], "data.prefetch = -1: must be >= 0"),
    (["data.blosc_clevel=12"], "data.blosc_clevel = 12: must be in 0..9"),
    (["dist.timeout_s=0"], "dist.timeout_s = 0.0: must be > 0"),
])
def test_config_rejects_out_of_range(sets, message):
    with pytest.raises(ConfigError) as e:
        load_config("tiny-jishnet", sets)
    assert message in str(e.value)


def test_a_folder_given_as_config_is_named_as_one(tmp_path, monkeypatch):
    """``--config events4`` where events4 is a folder (a store, say): not "does not
    exist", but a folder, and the presets there are."""
    (tmp_path / "events4").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config("events4")
    assert str(e.value).startswith("config events4: is a folder, not a TOML config file; "
                                   "presets: ")
    assert "tiny-jishnet" in str(e.value) and "does not exist" not in str(e.value)
    with pytest.raises(ConfigError, match="config file nowhere.toml does not exist"):
        load_config("nowhere.toml")


def test_config_keeps_valid_edge_values():
    cfg = load_config("tiny-jishnet", ["train.betas=[0,0.5]", "train.weight_decay=0",
                                       "train.time_limit_s=inf", "train.seed=0"])
    assert cfg.train.betas == [0.0, 0.5] and cfg.train.time_limit_s == float("inf")


def _shard(path, charges: list[np.ndarray], geometry: Geometry):
    events = [Event(np.arange(len(c), dtype=np.int16), np.zeros(len(c), np.int16),
                    c.astype(np.float32), label=i % 5, event_id=i)
              for i, c in enumerate(charges)]
    return write_shard(path, events, geometry)


def test_negative_charge_is_named_by_file_and_event(tmp_path):
    path = _shard(tmp_path / "events-00000.h5", [np.ones(3), np.ones(4), np.ones(2)],
                  Geometry(downsample=9))
    with h5py.File(path, "r+") as f:
        f["charge"][4] = -2.5  # second pixel of event 1 (event 0 owns pixels 0..2)
    store = EventStore(path)
    assert [len(e) for e in store.read_many([0, 2])] == [3, 2]  # clean events still read
    with pytest.raises(EventStoreError) as e:
        store.read_many([0, 1, 2])
    assert str(e.value) == (f"{path}: event 1 has negative charge (min -2.5); "
                            "charges must be >= 0")


@pytest.mark.parametrize("value,message", [(np.nan, "non-finite"), (np.inf, "non-finite"),
                                           (-np.inf, "non-finite")])
def test_non_finite_charge_is_named(tmp_path, value, message):
    path = _shard(tmp_path / "events-00000.h5", [np.ones(3), np.ones(4)], Geometry(downsample=9))
    with h5py.File(path, "r+") as f:
        f["charge"][5] = value
    with pytest.raises(EventStoreError, match=f"event 1 has {message} charge"):
        EventStore(path).read_many([0, 1])


def test_writer_refuses_negative_charge(tmp_path):
    with pytest.raises(EventStoreError, match="negative charge"):
        _shard(tmp_path / "events-00000.h5", [np.array([1.0, -1.0])], Geometry(downsample=9))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("attr,value,message", [
    ("downsample", 0, "attribute downsample=0: expected a whole number > 0"),
    ("downsample", 7, "attribute downsample=7: must be a positive divisor of 3600"),
    ("downsample", 2.5, "attribute downsample=2.5: expected a whole number > 0"),
    ("wire_pitch_cm", np.nan, "attribute wire_pitch_cm=nan: expected a number > 0"),
    ("full_size", "big", "attribute full_size='big'"),
    ("height", 401, "attribute height=401 disagrees with the geometry (400"),
])
def test_bad_geometry_attribute_names_file_and_attribute(tmp_path, attr, value, message):
    path = _shard(tmp_path / "events-00000.h5", [np.ones(3)], Geometry(downsample=9))
    with h5py.File(path, "r+") as f:
        f.attrs[attr] = value
    with pytest.raises(EventStoreError) as e:
        EventStore(path)
    assert str(e.value).startswith(f"{path}: {message}")


def test_train_refuses_bad_shard_attribute_without_traceback(train_events_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(train_events_dir, data)
    with h5py.File(data / "events-00001.h5", "r+") as f:
        f.attrs["downsample"] = 0
    out = tmp_path / "run"
    r = run(train_cmd(data, out), timeout=120)
    assert r.returncode == 2
    assert "events-00001.h5: attribute downsample=0" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


@pytest.mark.parametrize("sets,message", [
    (['train.betas=["a","b"]'], "train.betas = ['a', 'b']"),
    (["train.betas=[0.9,1.5]"], "expected two numbers in [0, 1)"),
    (["train.lr=inf"], "train.lr = inf: must be finite"),
    (["data.test_fraction=0.9"], "data.test_fraction = 0.9: must be in [0, 1 - "
                                 "data.eval_fraction) = [0, 0.8)"),
    # 3 events, one per class: round(0.2 * 1) = 0 held out of each class
    (["data.max_events=3"], "3 events (data.max_events=3, store 70) with "
                            "data.eval_fraction=0.2 leave no evaluation event: the split "
                            "is taken per class (round(fraction x events of the class); "
                            "classes hold 1, 1, 1)"),
])
def test_train_refuses_bad_input_before_run_json(train_events_dir, tmp_path, sets, message):
    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out, *sets), timeout=120)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_plan_for_the_world_size_is_checked(train_events_dir):
    from lartpc.errors import LartpcError
    from lartpc.train.plan import plan_run

    store = EventStore(train_events_dir)
    # 20 events, 4 per class: round(0.2 * 4) = 1 held out per class
    cfg = load_config("tiny-jishnet", ["data.downsample=9", "data.max_events=20",
                                       "data.eval_fraction=0.2"])
    plan = plan_run(cfg, store, 2)
    assert (len(plan.train), len(plan.eval)) == (15, 5)
    with pytest.raises(LartpcError, match="15 training events for 16 ranks"):
        plan_run(cfg, store, 16)
