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


@pytest.fixture(scope="session")
def completed_run(train_events_dir, tmp_path_factory):
    """A completed one-epoch run on :func:`train_events_dir`, for tests to copy and damage
    (never altered itself)."""
    from train_helpers import run, train_cmd

    out = tmp_path_factory.mktemp("completed") / "run"
    r = run(train_cmd(train_events_dir, out, "train.epochs=1"))
    assert r.returncode == 0, r.stderr
    return out

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


#: The test files that start the local SLURM (tests/slurm_harness.py): one controller
#: on this host serves them in turn, so under pytest-xdist they are one unit of work.
SLURM_FILES = ("tests/test_slurm.py", "tests/test_slurm_multinode.py")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, where it is installed
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite on one pytest-xdist worker per core (at most 4) with
    `--dist loadfile`: a file's tests stay on one worker, so its module fixtures (a
    two-rank training, a SLURM controller) are made once; here the SLURM files also
    share one worker (xdist's `xdist_group` marks would say that, but pytest 9.2 no longer
    lets xdist 3.8 tag the test ids it groups them by)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlurmFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "slurm" if scope in SLURM_FILES else scope

    return SlurmFilesTogether(config, log)
