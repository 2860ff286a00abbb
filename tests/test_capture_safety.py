"""The code the CUDA graphs capture waits for nothing on the host (issues 35 and 36).

On a GPU an operation that reads a device value back to the host (``.item()``,
``bool(t)``, ``.tolist()``), whose output size depends on values (``nonzero``, a boolean
mask, ``unique``) or that copies from pageable host memory (``torch.tensor([...])`` on
a device) synchronises with the device, which a CUDA graph's capture refuses: the
training then steps eagerly (``train.cuda_graph``), the tables are built as before
(``sparse_torch.TABLES = auto``), and the lease's measurement is lost. The captures
themselves run only on a GPU (``-m gpu``); here, on a CPU, every operation of what
they capture goes through :class:`HostWaits`, which records those operations, and the
tests want none:

- SCNet's tables (``table_graph.TableGraph._run``: :func:`table_graph.static_tables`
  and the copies into its output buffers), on a real batch;
- the training's static step (``StaticStep._forward_backward``: forward, loss,
  backward, the step's values), SCNet's on padded tables and JishNet's, with the
  published layers and with the fused stem and second stage under Triton's interpreter
  (every backward of the second stage, every way the stem sums); the interpreter's own
  copies in and out of a kernel launch are not the captured code and are not counted.

Adam's update is outside the training's graph (its rate follows the schedule); ``bench
model --cuda-graph`` captures it in its ``capturable`` form, which runs on a GPU only.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import traceback

import pytest
import torch
from test_graphed_step import _device_dense, _jishnet_step
from test_sparse_torch import _batches, _pair
from torch.utils._python_dispatch import TorchDispatchMode
from triton_cpu import DEVICE, event_images  # first: sets TRITON_INTERPRET on CPU

import lartpc
from lartpc.data.batch import Batch
from lartpc.data.store import EventStore
from lartpc.models import table_graph
from lartpc.models.scnet import KERNEL, POOLS
from lartpc.train.graphed import GraphedStep, StaticStep
from lartpc.train.padding import Capacities

aten = torch.ops.aten

#: operations that wait for the device on CUDA whatever their arguments: a value read
#: back, or an output whose size is a device value
ALWAYS = {aten._local_scalar_dense: "reads a value back (.item(), bool(), int(), float())",
          aten.nonzero: "output size read back (nonzero, one-argument where)",
          aten._unique: "output size read back (unique)",
          aten._unique2: "output size read back (unique)",
          aten.unique_dim: "output size read back (unique)",
          aten.unique_consecutive: "output size read back (unique_consecutive)",
          aten.masked_select: "output size read back (masked_select)",
          aten.bincount: "output size read back (bincount)",
          aten.equal: "reads a value back (torch.equal)",
          aten.allclose: "reads a value back (torch.allclose)"}


def _why(func, args, kwargs) -> str | None:
    """Why ``func`` on these arguments would wait for the device on CUDA, or None."""
    packet = func.overloadpacket
    if packet in ALWAYS:
        return ALWAYS[packet]
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            return "output size read back (a boolean mask as an index)"
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "output size read back (repeat_interleave without output_size)"
    if packet is aten.lift_fresh and args[0].dim() > 0:
        return "a tensor from host data (torch.tensor of a list: a pageable copy)"
    return None


#: the folders of the project's code and of Triton's (by where they are installed, not
#: by name: a checkout's own folder may be called lartpc)
OURS = (os.path.dirname(lartpc.__file__) + os.sep, os.path.abspath(__file__))
TRITON = os.path.dirname(importlib.util.find_spec("triton").origin) + os.sep


def _where() -> str:
    """The innermost frame of the project's own code (or this test's): file:line (name)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(OURS):
            name = "/".join(frame.filename.rsplit(os.sep, 2)[-2:])
            return f"{name}:{frame.lineno} ({frame.name})"
    return "?"


def _in_triton_launch() -> bool:
    """Whether the caller is Triton's interpreter launching a kernel (its copies of the
    arguments to and from host memory stand in for the GPU's, and are not captured)."""
    return any(f.filename.startswith(TRITON) for f in traceback.extract_stack()[:-2])


class HostWaits(TorchDispatchMode):
    """Records, as (operation, why, where), each operation run inside it that would
    make the host wait for a CUDA device, and each ``.tolist()`` / ``.numpy()`` (which
    a CPU tensor answers without an operation) of the thread that entered it (a
    loader's threads run meanwhile); the backward's operations too (on a CPU the
    autograd engine runs them on the calling thread)."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, str, str]] = []
        self.seen: set[str] = set()  #: every operation's name (what was checked)
        self._saved = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.seen.add(func.overloadpacket.__name__)
        why = _why(func, args, kwargs)
        if why is not None and not _in_triton_launch():
            self.found.append((str(func), why, _where()))
        return func(*args, **kwargs)

    def __enter__(self):
        self._thread = threading.get_ident()
        for name in ("tolist", "numpy"):
            self._saved[name] = torch.Tensor.__dict__.get(name)  # None: inherited
            original = getattr(torch.Tensor, name)

            def reads(t, *a, _name=name, _original=original, **k):
                if threading.get_ident() == self._thread and not _in_triton_launch():
                    self.found.append((f"Tensor.{_name}", "reads a tensor back",
                                       _where()))
                return _original(t, *a, **k)

            setattr(torch.Tensor, name, reads)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, own in self._saved.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        return super().__exit__(*exc)


def test_the_recorder_finds_what_would_wait():
    """The check can fail: each way of waiting for the device is recorded, with the
    line it came from, and the operations a capture may hold are not."""
    x = torch.randn(50)
    before = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
    waits = [lambda: x.sum().item(), lambda: bool(x.sum() > 0), lambda: x.tolist(),
             lambda: x.numpy(), lambda: x.nonzero(), lambda: x[x > 0],
             lambda: torch.unique(x), lambda: torch.where(x > 0),
             lambda: torch.repeat_interleave(torch.arange(3)), lambda: torch.equal(x, x),
             lambda: torch.tensor([1, 2, 3]), lambda: x.clone().__setitem__(x > 0, 0.0)]
    for wait in waits:
        with HostWaits() as rec:
            wait()
        assert len(rec.found) >= 1, rec.found
        where = rec.found[0][2]
        assert where.startswith("tests/test_capture_safety.py:") and "<lambda>" in where, where
    with HostWaits() as rec:
        keys, order = torch.sort(x, stable=True)
        rank = torch.cumsum((x > 0).int(), 0)
        torch.index_select(x, 0, order).masked_fill(x > 0, 0).scatter_reduce_(
            0, rank.long().clamp(max=49), x, "amin")
        torch.repeat_interleave(x, torch.ones(50, dtype=torch.long), output_size=50)
        x.clone()[:, None].expand(50, 3).sum()
    assert rec.found == []
    with HostWaits() as rec:  # another thread's reads are not this code's
        other = threading.Thread(target=x.tolist)
        other.start()
        other.join()
    assert rec.found == []
    assert {name: getattr(torch.Tensor, name) for name in before} == before  # put back


def _checked(monkeypatch, cls, name) -> tuple[list, set]:
    """``cls.name`` run under :class:`HostWaits` from now on: what it found, and the
    names of the operations it saw."""
    found: list = []
    seen: set = set()
    original = getattr(cls, name)

    def run(self, *args, **kwargs):
        with HostWaits() as rec:
            out = original(self, *args, **kwargs)
        found.extend(rec.found)
        seen.update(rec.seen)
        return out

    monkeypatch.setattr(cls, name, run)
    return found, seen


def test_scnets_table_graph_waits_for_nothing(monkeypatch, train_events_dir):
    """What the tables' graph captures, on a batch of 7 real events, at capacities with
    room (then fitting exactly, whose padding rows are none)."""
    from lartpc.models import sparse_torch

    found, seen = _checked(monkeypatch, table_graph.TableGraph, "_run")
    monkeypatch.setattr(table_graph, "FAILED", set())
    (batch,) = _batches(train_events_dir, n=1)
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    sizes = sparse_torch.sizes(sparse_torch.build_maps(batch.coords, 7, shape, KERNEL,
                                                       POOLS, tables="torch"))
    for rows in ([n + 64 for n in sizes], list(sizes)):
        maps = sparse_torch.build_maps(batch.coords, 7, shape, KERNEL, POOLS, rows=rows,
                                       tables="graph")
        assert maps.unpadded == tuple(sizes)
    assert {"sort", "cumsum", "scatter_reduce_"} <= seen  # the graph's way was checked
    assert found == []


@pytest.mark.sparse
def test_scnets_static_step_waits_for_nothing(monkeypatch, train_events_dir):
    """The training's captured step of SCNet on padded tables: forward, loss, backward
    and the step's values, over three real batches (the sizes growing once)."""
    found, seen = _checked(monkeypatch, StaticStep, "_forward_backward")
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape, seed=5)
    step = GraphedStep(model, torch.nn.functional.cross_entropy, Capacities(), 7,
                       capture=False)
    for batch in _batches(train_events_dir, n=3, model=model):
        assert step(batch) is not None
    assert step.stats["steps"] == 3 and "_log_softmax_backward_data" in seen, sorted(seen)
    assert found == []


@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_jishnets_static_step_waits_for_nothing(monkeypatch, train_events_dir, amp):
    """JishNet's captured step with the published layers (a CPU's default), in float32
    and under bf16 autocast."""
    found, seen = _checked(monkeypatch, StaticStep, "_forward_backward")
    store = EventStore(train_events_dir)
    _, step, _ = _jishnet_step(store, amp)
    for batch in _device_dense(store, 8):
        assert step(batch) is not None
    assert step.stats["steps"] == 2 and "convolution_backward" in seen, sorted(seen)
    assert found == []


@pytest.mark.parametrize("backward,sums,skip", [("hybrid", "dot", False),
                                                ("igrad", "hoist", True),
                                                ("map", "band", False),
                                                ("triton", "patch", False),
                                                ("map:vec", "taps", False)])
def test_jishnets_fused_step_waits_for_nothing(monkeypatch, backward, sums, skip):
    """JishNet's captured step with the fused stem and second stage (a GPU's default),
    under bf16 autocast as trained on a GPU, on one real event (300 x 300: the
    interpreter is slow): every backward of the second stage, every way the stem sums,
    and the stem with its empty blocks left out (``stem_skip_empty``)."""
    import lartpc.models.fused_stage2 as fs2
    import lartpc.models.fused_stem as fst
    from lartpc.models.jishnet import JishNet
    from lartpc.train.graphed import DenseGraphedStep

    monkeypatch.setattr(fst, "SUMS", sums)
    kind, _, vec = backward.partition(":")
    monkeypatch.setattr(fs2, "BACKWARD", kind)
    monkeypatch.setattr(fs2, "VEC", vec == "vec")
    found, seen = _checked(monkeypatch, StaticStep, "_forward_backward")
    x = event_images(1, 12, seed=11)
    torch.manual_seed(0)
    model = JishNet(tuple(x.shape[-2:]), stem="fused", stage2="fused", elu_after_pool=True,
                    channels_last=True, stem_skip_empty=skip).to(DEVICE)
    step = DenseGraphedStep(model, torch.nn.functional.cross_entropy, 1, capture=False,
                            autocast=lambda: torch.autocast(DEVICE, dtype=torch.bfloat16,
                                                            cache_enabled=False))
    batch = Batch(labels=torch.tensor([3], device=DEVICE), shape=tuple(x.shape[-2:]), dense=x)
    assert step(batch) is not None and step(batch) is not None
    assert step.stats["steps"] == 2 and "convolution_backward" in seen, sorted(seen)
    assert found == []

