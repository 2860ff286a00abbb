"""The gradient exchange timed on the device (lartpc.dist.spans): on CUDA the exchange's
time is two events in the step's stream, read when the step is read back, instead of a
host synchronisation every step. No GPU here: the events are stood in, and the loop is
run with a world whose exchange returns a span."""

from __future__ import annotations

import pytest
from test_step_overlap import _build, _segment
from train_helpers import rows

from lartpc.dist import spans
from lartpc.dist.ddp import BucketExchange
from lartpc.dist.world import LocalWorld
from lartpc.train.readback import Unread


class _Span(spans.DeviceSpan):
    """A DeviceSpan stood in: ``seconds`` of device time, read once."""

    def __init__(self, seconds: float, reads: list):  # no events: no super().__init__
        self._seconds, self.reads = seconds, reads

    def seconds(self) -> float:
        self.reads.append(self)
        return self._seconds


def _unread(compute_s: float, comm_s: float, *found) -> Unread:
    import torch

    u = Unread(torch.tensor([1.0, 0.5]), {}, found)
    u.fields.update(compute_s=compute_s, comm_s=comm_s)
    return u


def test_settled_moves_the_device_time_from_compute_to_comm():
    reads: list = []
    u = _unread(0.010, 0.001, _Span(0.003, reads), _Span(0.001, reads))
    f = u.settled()
    assert f["compute_s"] == pytest.approx(0.006) and f["comm_s"] == pytest.approx(0.005)
    assert u.settled() == f and len(reads) == 2  # read once
    # never more than the step's compute part: the three parts still add to its wall time
    u = _unread(0.002, 0.001, _Span(0.010, reads))
    f = u.settled()
    assert (f["compute_s"], f["comm_s"]) == (0.0, pytest.approx(0.003))
    assert _unread(0.004, 0.001).settled() == {"compute_s": 0.004, "comm_s": 0.001}


class _Event:
    """torch.cuda.Event stood in: a tick counter for its time (ms)."""

    clock = [0.0]

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at: float | None = None

    def record(self, stream=None):
        self.clock[0] += 2.5
        self.at = self.clock[0]

    def synchronize(self):
        assert self.at is not None

    def elapsed_time(self, end: _Event) -> float:
        return end.at - self.at


def test_the_last_buckets_handoff_to_the_end_is_the_exposed_exchange(monkeypatch):
    import torch

    state = BucketExchange()
    assert state.exposed() == 0.0  # before any bucket
    state.last_handoff = 0.0  # the CPU's perf_counter: seconds since
    assert isinstance(state.exposed(), float) and state.last_handoff is None
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    state.last_handoff = spans.mark()  # on CUDA, as the hook marks it
    span = state.exposed()
    assert isinstance(span, spans.DeviceSpan) and state.last_handoff is None
    assert span.seconds() == pytest.approx(2.5e-3)  # one record after the hand-off's


@pytest.mark.sparse
def test_the_loop_books_a_device_span_as_the_steps_comm(world, train_events_dir, tmp_path,
                                                         monkeypatch):
    """A world whose exchange comes back as a span (CUDA's way): each step's span is
    read once, when its numbers are, and moved from compute_s to comm_s, with and
    without reading a step late; the training time still adds up row by row."""
    reads: list = []
    original = LocalWorld.step_optimizer

    def step_optimizer(self, opt, scaler=None):
        original(self, opt, scaler)
        return _Span(0.003, reads)

    monkeypatch.setattr(LocalWorld, "step_optimizer", step_optimizer)
    for overlap in ("true", "false"):
        out = tmp_path / overlap
        reads.clear()
        t = _build(world, train_events_dir, out, "tiny-jishnet",
                   [f"train.overlap_readback={overlap}"])
        assert _segment(world, t, out) == "completed"
        log = rows(out / "rank-000.csv")
        assert len(reads) == len(log) == t.state.global_step
        # each row's moved time: 3 ms, or all of its compute part when that was less
        assert all(float(r["comm_s"]) >= 0.003 or float(r["compute_s"]) == 0.0 for r in log)
        assert sum(float(r["comm_s"]) >= 0.003 for r in log) >= len(log) // 2
        assert t.state.train_time_s == pytest.approx(
            sum(float(r[c]) for r in log for c in ("data_s", "compute_s", "comm_s")),
            rel=1e-9)
        t.close()


def test_a_capture_redirects_stale_streams_and_restores_the_switch(monkeypatch):
    """DDP keeps each parameter's gradient node on the default stream; a capture turns
    torch's stale-stream switch on for itself and restores it, error or not."""
    import torch

    from lartpc.train.graphed import stale_streams_redirected

    state = [False]
    monkeypatch.setattr(torch.autograd.graph, "set_override_stale_capture_stream",
                        lambda on: state.__setitem__(0, on))
    monkeypatch.setattr(torch._C, "_override_stale_capture_stream", lambda: state[0])
    with stale_streams_redirected():
        assert state[0] is True
    assert state[0] is False
    with pytest.raises(RuntimeError), stale_streams_redirected():
        raise RuntimeError("capture failed")
    assert state[0] is False
    monkeypatch.delattr(torch.autograd.graph, "set_override_stale_capture_stream")
    with stale_streams_redirected():  # an older torch: nothing to switch
        assert state[0] is False


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preset", ["tiny-scnet", "tiny-jishnet"])
def test_a_ddp_wrapped_graphed_training_captures_on_cuda(train_events_dir, tmp_path, preset):
    """One torchrun rank on CUDA (the torch backend: NCCL, the model in DDP, whose
    gradient nodes sit on the default stream): the step is captured, not left to the
    eager fallback, and DDP's noise-scale steps give the rank log a finite comm_s read
    from CUDA events."""
    import json
    import math

    from train_helpers import run, torchrun_train_cmd

    out = tmp_path / "run"
    sets = ["train.cuda_graph=true", "train.device=cuda", "train.noise_every_steps=2",
            "dist.backend=torch"]
    if preset == "tiny-scnet":
        sets += ["model.sparse=torch", "data.loader=sparse"]
    r = run(torchrun_train_cmd(train_events_dir, out, *sets, ranks=1, config=preset),
            timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["backend"] == "torch" and info["cuda_graph"]["captures"] >= 1
    assert not info["cuda_graph"]["fallback"], info["cuda_graph"]
    log = rows(out / "rank-000.csv")
    assert log and all(math.isfinite(float(x["comm_s"])) and float(x["comm_s"]) >= 0
                       for x in log)
