"""Shared fixtures: small event sets made by the project's own generator."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def events_dir(tmp_path_factory):
    """40 generated events, downsampled by 4 (900 x 900), in 2 shards."""
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("events_ds4")
    write_dataset(d, 40, seed=1234, downsample=4, shard_size=20, workers=1)
    return d


@pytest.fixture(scope="session")
def full_res_events_dir(tmp_path_factory):
    """10 generated events at full resolution (3600 x 3600), one shard."""
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("events_full")
    write_dataset(d, 10, seed=99, downsample=1, shard_size=10, workers=1)
    return d


@pytest.fixture(scope="session")
def isotropic_events_dir(tmp_path_factory):
    """40 isotropic gamma, electron and muon events at full resolution, in 2 shards:
    starts that can be anywhere, pointing anywhere (the start-finding stage's case)."""
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("isotropic")
    write_dataset(d, 40, seed=13, classes="gamma,electron,muon", source_geometry="isotropic",
                  shard_size=20)
    return d


@pytest.fixture(scope="session")
def train_events_dir(tmp_path_factory):
    """70 generated events downsampled by 9 (400 x 400): small enough to train on in
    seconds, real enough that the loss moves."""
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("events_ds9")
    write_dataset(d, 70, seed=4321, downsample=9, shard_size=35, workers=1)
    return d

# Same setting as the `lartpc` command (see lartpc/cli.py), for in-process torch use.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="module")
def world():
    """A one-process world on the CPU (no launcher), torch on one thread: the trainings
    in the loop's tests."""
    import torch

    from lartpc import dist

    torch.set_num_threads(1)
    return dist.init("none", "cpu")
