"""The sparse loader's CUDA branches, run on a CPU through a whole training: the device
copy, streams, events, page-locking and ``.to("cuda")`` stood in, the loader told its
device is CUDA. What the GPU lease runs first (issue 36's graphed trainings with the
table cache, loader threads and loader processes) then trains here as the plain CPU
training does, bit for bit. A method on the wrong class, a tensor handed over unwaited, a wrong
keyword on a CUDA-only call stop the lease's first training; here they fail a test
(one such bug reached a commit: the cache's CUDA way on the dense loader)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from test_step_overlap import _fit, _same

from lartpc.data import loaders
from lartpc.train import trainer as trainer_mod

pytestmark = pytest.mark.sparse

TORCH = "model.sparse=torch"


class _Stream:
    device = torch.device("cpu")

    def wait_event(self, event) -> None:
        assert isinstance(event, _Event) and event.recorded, "waited on an unrecorded event"

    def synchronize(self) -> None:
        pass


class _Event:
    def __init__(self, *args, **kwargs):
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        pass


def stand_in_cuda(m: pytest.MonkeyPatch) -> dict:
    """CUDA's calls on the loaders' path stood in (``m``): what was taken, counted
    (``copies``: the address each device copy was made from)."""
    taken = {"streams": 0, "copies": [], "loaders": 0}

    def stream(device):
        taken["streams"] += 1
        return _Stream()

    def to_device(stream, view):
        assert isinstance(stream, _Stream), stream
        taken["copies"].append(view.data_ptr())
        return view.clone()

    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
            return self
        return real_to(self, *args, **kwargs)

    real_make = trainer_mod.make_loader

    def make_loader(*args, **kwargs):
        loader = real_make(*args, **kwargs)
        if loader is not None:
            loader.device = torch.device("cuda")  # from here on its CUDA branches
            taken["loaders"] += 1
        return loader

    m.setattr(loaders, "_to_device", to_device)
    m.setattr(loaders, "loader_stream", stream)
    m.setattr(torch.cuda, "Event", _Event)
    m.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    m.setattr(torch.cuda, "device", lambda *args: nullcontext())
    m.setattr(torch.cuda, "stream", lambda *args: nullcontext())
    m.setattr(torch.Tensor, "pin_memory", lambda t: t.clone())
    m.setattr(torch.Tensor, "to", to)
    m.setattr(trainer_mod, "make_loader", make_loader)
    return taken


@pytest.mark.parametrize("sets", [
    # gpu_issues.sh's first training: the cache, three threads, the step's graph
    ("data.table_cache=true", "data.prefetch_threads=3", "train.cuda_graph=true"),
    # without the cache: tables built on each thread's stream
    ("data.prefetch_threads=3", "train.cuda_graph=true"),
    # loader processes, with and without the cache
    ("data.loader_processes=2", "train.cuda_graph=true"),
    ("data.loader_processes=2", "data.table_cache=true"),
])
def test_the_loaders_cuda_branches_train_as_the_cpu_does(world, train_events_dir, tmp_path,
                                                         sets):
    plain = _fit(world, train_events_dir, tmp_path / "plain", "tiny-scnet", TORCH, *sets)
    with pytest.MonkeyPatch.context() as m:
        taken = stand_in_cuda(m)
        cuda = _fit(world, train_events_dir, tmp_path / "cuda", "tiny-scnet", TORCH, *sets)
    assert taken["loaders"] >= 1 and taken["streams"] >= 1
    if "data.prefetch_threads=3" not in sets or "data.table_cache=true" in sets:
        assert taken["copies"]  # the one-copy way (cache or processes) was taken
    _same(plain, cuda)
