"""``train.cuda_graph`` (issues 36 and 35): SCNet's torch layers stepped on tables
padded to grow-only sizes from static buffers, what a captured CUDA graph replays, and
JishNet's step on a static copy of its minibatch. On a CPU the
same padded static step runs without a graph, so these tests check everything but the
capture: the padded step trains as the unpadded one (to rounding), the sizes grow in
step order and are kept by a checkpoint, an eager step in between leaves the
gradients where the optimizer looks, and the option's refusals. The capture itself is
checked on a GPU (``-m gpu`` below)."""

from __future__ import annotations

import re

import pytest
import torch
from test_sparse_torch import _batches, _pair
from test_step_overlap import _fit
from train_helpers import (
    final_params,
    kill_after_steps,
    rows,
    run,
    torchrun_train_cmd,
    train_cmd,
)

from lartpc.data.store import EventStore
from lartpc.errors import ConfigError
from lartpc.models import sparse_torch
from lartpc.train.graphed import GraphedStep
from lartpc.train.padding import Capacities
from lartpc.train.readback import Unread, step_values

pytestmark = pytest.mark.sparse

GRAPH = ("model.sparse=torch", "train.cuda_graph=true")
#: the killed-and-resumed runs: 4 epochs of 8 steps (55 training events at 7 a step),
#: so that the kill after 11 steps lands well before the end however fast a step is
#: (with 2 epochs, 16 steps, a run could end in the kill's polling interval)
KILLED_EPOCHS = 4
KILLED_STEPS = KILLED_EPOCHS * 8


def test_capacities_grow_in_multiples_and_never_shrink():
    caps = Capacities(multiple=256, headroom=1.25)
    assert caps.fit((1000, 80, 0)) == (1280, 256, 256)
    assert caps.fit((900, 10, 3)) == (1280, 256, 256)  # fits: unchanged
    assert caps.fit((1100, 300, 1)) == (1280, 512, 256)  # only the level that did not fit
    assert caps.rows == (1280, 512, 256)


def _step(model, batch, opt, graphed=None):
    """One Adam step, graphed (when given and it takes the batch) or eager; the loss."""
    out = None if graphed is None else graphed(batch)
    if out is None:
        opt.zero_grad()
        logits = model.forward_sparse(batch.coords, batch.features, batch.data_size,
                                      batch.rulebooks)
        loss = torch.nn.functional.cross_entropy(logits, batch.labels)
        loss.backward()
    else:
        loss = out[1]
    opt.step()
    return float(loss.detach())


def test_padded_static_step_trains_as_the_unpadded_one(train_events_dir):
    """Six Adam steps on real events: the padded static step (sizes growing twice, an
    eager step in the middle) follows the unpadded eager step to rounding."""
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, eager = _pair(shape, seed=3)
    _, static = _pair(shape, seed=3)
    batches = _batches(train_events_dir, n=6, model=eager)
    # the smallest first batch, then larger: the sizes have to grow
    batches.sort(key=lambda b: len(b.coords))
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-3)
    opt_s = torch.optim.Adam(static.parameters(), lr=1e-3)
    caps = Capacities(multiple=16, headroom=1.0)
    graphed = GraphedStep(static, torch.nn.functional.cross_entropy, caps, 7, capture=False)
    for k, batch in enumerate(batches):
        want = _step(eager, batch, opt_e)
        got = _step(static, batch, opt_s, None if k == 3 else graphed)
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (k, got, want)
    assert graphed.stats["steps"] == 5 and graphed.stats["resized"] >= 2
    assert graphed.stats["captures"] == graphed.stats["replays"] == 0  # no graph on a CPU
    for a, b in zip(eager.parameters(), static.parameters(), strict=True):
        assert (a - b).abs().max() <= 1e-4 * a.abs().max()


def test_outputs_are_overwritten_as_a_replay_overwrites_them(train_events_dir):
    """Without a graph the step still writes every step's logits, loss and gradients
    into the same tensors, so these CPU tests see what a caller holding one past the
    next step would see on a GPU: the next step's values."""
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape, seed=4)
    first, second = _batches(train_events_dir, n=2, model=model)
    caps = Capacities()
    caps.fit([2 * n for n in sparse_torch.sizes(first.rulebooks)])  # both fit: one size
    caps.fit(sparse_torch.sizes(second.rulebooks))
    graphed = GraphedStep(model, torch.nn.functional.cross_entropy, caps, 7, capture=False)
    logits, loss = graphed(first)
    held, grad, values = float(loss), model.convs[0].weight.grad, graphed.values
    # the step's (loss, accuracy) for the read-back, computed in the step
    assert torch.equal(values, step_values(loss, logits, first.labels))
    unread = Unread(values, {})  # taken before the next step overwrites them
    logits2, loss2 = graphed(second)
    assert loss2 is loss and logits2 is logits and model.convs[0].weight.grad is grad
    assert graphed.values is values
    assert float(loss) != held and graphed.stats["resized"] == 1
    assert torch.equal(values, step_values(loss, logits, second.labels))
    assert unread.read()[0] == held


def test_loader_pads_to_the_sizes_as_they_stand(train_events_dir):
    """The loader's thread pads to the capacities without growing them; tables that do
    not fit stay as built (the step pads those)."""
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape)
    build = model.rulebook_builder(training=True)
    batch = _batches(train_events_dir, n=1)[0]
    maps = build(batch.coords, batch.data_size)
    caps = Capacities()
    assert caps.padding(build)(batch.coords, batch.data_size).unpadded is None  # no sizes
    rows = caps.fit(sparse_torch.sizes(maps))
    padded = caps.padding(build)(batch.coords, batch.data_size)
    assert sparse_torch.sizes(padded) == rows and padded.unpadded == sparse_torch.sizes(maps)
    caps.rows = tuple(n - 1 for n in sparse_torch.sizes(maps))
    assert caps.padding(build)(batch.coords, batch.data_size).unpadded is None
    assert caps.rows == tuple(n - 1 for n in sparse_torch.sizes(maps))  # not grown


@pytest.mark.slow
def test_killed_run_resumes_exactly_with_its_padded_sizes(train_events_dir, tmp_path):
    """``lartpc train`` with the option: killed after 11 steps (checkpoints every 3),
    resumed, it ends with the uninterrupted run's parameters bit for bit (the checkpoint
    kept the padded sizes, so the resumed steps pad as the first segment's would have);
    run.json counts the static and the eager steps."""
    import json

    from lartpc.train import checkpoint

    sets = (*GRAPH, "train.checkpoint_every_steps=3", f"train.epochs={KILLED_EPOCHS}")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = run(train_cmd(train_events_dir, whole, *sets, config="tiny-scnet"))
    assert r.returncode == 0, r.stderr
    kill_after_steps(train_cmd(train_events_dir, cut, *sets, config="tiny-scnet"), cut, 11)
    state = checkpoint.read(cut / "checkpoint.pt")
    assert 0 < state["global_step"] < KILLED_STEPS
    assert state["padded_sizes"] and all(n % 32 == 0 for n in state["padded_sizes"])
    r = run(train_cmd(train_events_dir, cut, *sets, config="tiny-scnet"))
    assert r.returncode == 0, r.stderr
    pa, pb = final_params(whole), final_params(cut)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    meta = json.loads((whole / "run.json").read_text())
    graph, short = meta["cuda_graph"], KILLED_EPOCHS if meta["train_events"] % 7 else 0
    # an epoch's short last batch (55 events: 7 of 7 and one of 6) steps eagerly
    assert graph["eager_steps"] == short and graph["steps"] == KILLED_STEPS - short
    assert not graph["fallback"]


@pytest.mark.slow
def test_killed_jishnet_run_resumes_exactly_with_its_graphs(train_events_dir, tmp_path):
    """``lartpc train`` with JishNet's graphed step: killed after 11 steps (checkpoints
    every 3), resumed, it ends with the uninterrupted run's parameters bit for bit (the
    resumed segment makes its graphs afresh; nothing of them is in the checkpoint)."""
    import json

    from lartpc.train import checkpoint

    sets = (GRAPH[1], "train.checkpoint_every_steps=3", f"train.epochs={KILLED_EPOCHS}")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = run(train_cmd(train_events_dir, whole, *sets))
    assert r.returncode == 0, r.stderr
    kill_after_steps(train_cmd(train_events_dir, cut, *sets), cut, 11)
    state = checkpoint.read(cut / "checkpoint.pt")
    assert 0 < state["global_step"] < KILLED_STEPS and state["padded_sizes"] is None
    r = run(train_cmd(train_events_dir, cut, *sets))
    assert r.returncode == 0, r.stderr
    pa, pb = final_params(whole), final_params(cut)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    graph = json.loads((whole / "run.json").read_text())["cuda_graph"]
    assert graph["steps"] > 0 and graph["resized"] >= 1 and not graph["fallback"]


@pytest.mark.parametrize("preset,sets,why", [
    ("tiny-scnet", (), "jishnet, or scnet with model.sparse=torch (here scnet, "
     "model.sparse=spconv)"),
    ("tiny-scnet", (GRAPH[0], "train.amp=fp16"), "train.amp=none with scnet (here fp16)"),
    ("tiny-scnet", (GRAPH[0], "train.amp=bf16"), "train.amp=none with scnet (here bf16)"),
    ("tiny-jishnet", ("train.amp=fp16",), "train.amp=none or bf16 with jishnet (here fp16)"),
    ("tiny-jishnet", ("train.compile=true",), "train.compile=false"),
    ("tiny-scnet", (GRAPH[0], "dist.backend=horovod"),
     "dist.backend=torch or none (here horovod)"),
    ("tiny-jishnet", ("dist.backend=horovod",), "dist.backend=torch or none (here horovod)"),
])
def test_config_refusals_name_the_option(preset, sets, why):
    from lartpc.config import load_config

    with pytest.raises(ConfigError, match=rf"^train.cuda_graph=true: it needs .*{re.escape(why)}"):
        load_config(preset, [*sets, GRAPH[1]])


def test_refused_before_anything_is_written(train_events_dir, tmp_path):
    """``lartpc train`` refuses at its config: exit 2, one line, no run folder."""
    out = tmp_path / "run"
    r = run(train_cmd(train_events_dir, out, GRAPH[1], config="tiny-scnet"))
    assert r.returncode == 2 and "train.cuda_graph=true: it needs" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_refused_on_horovods_ranks_taken_on_torchs():
    """The backend a launcher gave (``dist.backend=auto``) is checked when the trainer is
    built: one rank or the torch backend's ranks, not Horovod's."""
    from types import SimpleNamespace

    from lartpc.config import load_config
    from lartpc.train.graphed import check_graphable

    cfg = load_config("tiny-scnet", list(GRAPH))
    for size, backend in ((1, "none"), (1, "torch"), (4, "torch")):
        check_graphable(cfg, SimpleNamespace(size=size, backend=backend))
    for size in (1, 2):
        with pytest.raises(ConfigError, match=r"dist.backend=torch or none \(here "
                                              rf"{size} rank\(s\), horovod\)"):
            check_graphable(cfg, SimpleNamespace(size=size, backend="horovod"))


def _two_torch_ranks(data, out, preset: str, *sets: str) -> None:
    """``lartpc train`` on two torchrun ranks (the torch backend, DDP), to completion."""
    r = run(torchrun_train_cmd(data, out, *sets, config=preset), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("preset,compression,rtol", [
    ("tiny-jishnet", "none", 0.0), ("tiny-jishnet", "fp16", 0.0),
    # SCNet's padded tables change its matrix products' shapes, so their rounding: the
    # one-rank graphed training follows the eager one to 1e-4 on a CPU too (above)
    pytest.param("tiny-scnet", "none", 1e-4, marks=pytest.mark.sparse)])
def test_two_torch_ranks_train_with_the_graph_as_with_ddp(train_events_dir, tmp_path,
                                                          preset, compression, rtol):
    """Two torchrun ranks: the static step's gradients (no DDP hook runs in a replay)
    are averaged after it (``World.average_gradients``) as DDP's buckets average them,
    in float32 or sent as float16, and so are those of a step the graph leaves (each
    rank's short last batch), so the ranks make the same exchange whichever way each
    stepped. JishNet's rank logs and final parameters are the eager DDP training's, bit
    for bit; SCNet's follow them to rounding."""
    import json

    sets = ("train.noise_scale=off", f"train.grad_compression={compression}",
            *((GRAPH[0],) if preset == "tiny-scnet" else ()))
    eager, graph = tmp_path / "eager", tmp_path / "graph"
    _two_torch_ranks(train_events_dir, eager, preset, *sets)
    _two_torch_ranks(train_events_dir, graph, preset, *sets, GRAPH[1])
    info = json.loads((graph / "run.json").read_text())
    assert info["world_size"] == 2 and info["backend"] == "torch"
    assert info["param_divergence"] == 0.0
    stats = info["cuda_graph"]
    # an epoch: rank 0 trains 27 events (3 minibatches of 7, one of 6), rank 1 28 (4 of 7)
    assert not stats["fallback"] and stats["steps"] >= 2 * stats["eager_steps"] > 0
    for rank in ("000", "001"):
        a, b = rows(eager / f"rank-{rank}.csv"), rows(graph / f"rank-{rank}.csv")
        assert len(a) == len(b) > 0
        for key in ("local_loss", "global_loss", "local_acc", "global_acc"):
            want, got = [float(x[key]) for x in a], [float(x[key]) for x in b]
            assert got == pytest.approx(want, rel=rtol, abs=0), key
    pa, pb = final_params(eager), final_params(graph)
    for k in pa:
        assert (pa[k] - pb[k]).abs().max() <= 10 * rtol * pa[k].abs().max(), k


@pytest.mark.slow
def test_two_torch_ranks_with_the_graph_resume_exactly(train_events_dir, tmp_path):
    """Two torchrun ranks with JishNet's graphed step, noise-scale steps (through DDP)
    among the averaged-after-the-replay ones: one epoch, then the second in a new
    segment, ends with the uninterrupted run's rank logs, noise rows and parameters,
    bit for bit."""
    import json

    sets = (GRAPH[1], "train.noise_every_steps=3")
    ref, split = tmp_path / "ref", tmp_path / "split"
    _two_torch_ranks(train_events_dir, ref, "tiny-jishnet", *sets)
    _two_torch_ranks(train_events_dir, split, "tiny-jishnet", *sets, "train.epochs=1")
    _two_torch_ranks(train_events_dir, split, "tiny-jishnet", *sets)
    assert len(rows(ref / "noise.csv")) >= 2 and rows(ref / "noise.csv") == \
        rows(split / "noise.csv")
    for rank in ("000", "001"):
        a, b = rows(ref / f"rank-{rank}.csv"), rows(split / f"rank-{rank}.csv")
        assert len(a) == len(b) > 0
        for key in ("local_loss", "global_loss", "local_acc", "global_acc"):
            assert [x[key] for x in a] == [x[key] for x in b], key
    pa, pb = final_params(ref), final_params(split)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    graph = json.loads((split / "run.json").read_text())["cuda_graph"]  # the second's
    assert graph["steps"] > 0 and not graph["fallback"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_step_equals_the_eager_step_on_cuda(train_events_dir):
    """The captured graph's loss, gradients and read-back values (loss, accuracy) equal
    an eager step's on the same padded tables, replay after replay with new batches
    copied in."""
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, model = _pair(shape, seed=5)
    model = model.cuda()
    batches = [b.to("cuda") for b in _batches(train_events_dir, n=4)]
    graphed = GraphedStep(model, torch.nn.functional.cross_entropy, Capacities(), 7,
                          capture=True)
    for batch in batches:
        logits, loss = graphed(batch)
        got = [float(loss), *(p.grad.clone() for p in model.parameters())]
        values = graphed.values.clone()  # (loss, accuracy), computed in the graph
        model.zero_grad()
        maps = graphed.caps.pad(model.rulebook_builder(training=True)(
            batch.coords, batch.data_size))
        ref_logits = model.forward_tables(batch.features, maps, batch.data_size)
        ref = torch.nn.functional.cross_entropy(ref_logits, batch.labels)
        ref.backward()
        assert abs(got[0] - float(ref)) <= 1e-5 * max(1.0, float(ref))
        torch.testing.assert_close(values, step_values(ref, ref_logits, batch.labels),
                                   rtol=1e-5, atol=0)
        for g, p in zip(got[1:], model.parameters(), strict=True):
            assert (g - p.grad).abs().max() <= 1e-5 * p.grad.abs().max()
    assert graphed.stats["captures"] >= 1 and graphed.stats["replays"] == len(batches)
    assert not graphed.stats["fallback"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_jishnets_captured_step_equals_the_eager_step_on_cuda(train_events_dir, amp):
    """JishNet's captured graph (fused stem and second stage, as on a GPU by default):
    loss, gradients and read-back values equal an eager step's on the same batch (under
    bf16, the eager step's autocast caching its casts as the trainer's does), replay
    after replay, each graph reading one of the loader's rotating buffers in place."""
    from contextlib import nullcontext

    import numpy as np

    from lartpc.data.loaders import build_loader
    from lartpc.models.jishnet import JishNet
    from lartpc.train.graphed import DenseGraphedStep

    store = EventStore(train_events_dir)
    loader = build_loader(store, "device-dense", np.arange(28), 7, device="cuda", seed=1)
    loader.set_epoch(0)
    torch.manual_seed(6)
    model = JishNet(tuple(store.geometry.shape), stem="fused", stage2="fused",
                    elu_after_pool=True, channels_last=amp == "bf16").cuda()

    def autocast(cache=True):
        return nullcontext() if amp == "none" else torch.autocast(
            "cuda", dtype=torch.bfloat16, cache_enabled=cache)

    loss_fn = torch.nn.functional.cross_entropy
    step = DenseGraphedStep(model, loss_fn, 7, capture=True,
                            autocast=lambda: autocast(cache=False))
    tol = 1e-3 if amp == "none" else 1e-2
    for batch in loader.iterate():
        logits, loss = step(batch)
        got = [float(loss), *(p.grad.clone() for p in model.parameters())]
        values = step.values.clone()
        model.zero_grad()
        with autocast():
            ref_logits = model(batch)
            ref = loss_fn(ref_logits.float(), batch.labels)
        ref.backward()
        want = float(ref.detach())
        assert abs(got[0] - want) <= tol * max(1.0, want)
        torch.testing.assert_close(values, step_values(ref, ref_logits, batch.labels),
                                   rtol=tol, atol=0)
        for g, p in zip(got[1:], model.parameters(), strict=True):
            assert (g - p.grad).abs().max() <= tol * p.grad.abs().max()
    # one graph for each of the loader's three buffers (0, 1, 2, then 0 again)
    assert step.stats["captures"] == 3 and step.stats["replays"] == 4
    assert not step.stats["fallback"]


ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                reason="needs a CUDA device")]


@pytest.mark.parametrize("device,preset,sets,rtol", [
    ("cpu", "tiny-scnet", GRAPH[:1], 1e-4),
    pytest.param("cuda", "tiny-scnet", GRAPH[:1], 1e-4, marks=ON_CUDA),
    # (on a CPU: the next two tests; bfloat16 convolutions there take minutes.) bfloat16
    # keeps 8 bits: two trainings whose convolutions cuDNN may time and choose apart
    # drift by more than float32's rounding over 16 Adam steps
    pytest.param("cuda", "tiny-jishnet", ("train.amp=bf16",), 2e-2, marks=ON_CUDA)])
def test_training_with_the_option_follows_the_eager_one(request, train_events_dir, tmp_path,
                                                        device, preset, sets, rtol):
    """Two epochs through the loop (SCNet: tables padded in the loader's thread, on CUDA
    on its stream; JishNet: bfloat16, on CUDA its fused stages' Triton kernels in the
    graph): losses and parameters as without the option, to rounding (``rtol`` of the
    loss, ten times that of each parameter's scale); on CUDA every full minibatch
    replays a captured graph, on a CPU none is captured."""
    from lartpc import dist

    world = request.getfixturevalue("world") if device == "cpu" else dist.init("none", device)
    stats: dict = {}
    pe, le = _fit(world, train_events_dir, tmp_path / "eager", preset, *sets)
    pg, lg = _fit(world, train_events_dir, tmp_path / "graph", preset, *sets, GRAPH[1],
                  graph_stats=stats)
    assert not stats["fallback"] and stats["steps"] + stats["eager_steps"] == len(lg)
    if device == "cuda":
        assert stats["captures"] >= 1 and stats["replays"] == stats["steps"] > 0
    else:
        assert stats["captures"] == stats["replays"] == 0 and stats["steps"] > 0
    assert len(le) == len(lg) > 0
    for a, b in zip(le, lg, strict=True):
        want, got = float(a["global_loss"]), float(b["global_loss"])
        assert abs(got - want) <= rtol * max(1.0, want)
    for a, b in zip(pe, pg, strict=True):
        assert (a - b).abs().max() <= min(10 * rtol, 0.1) * a.abs().max()


def test_jishnets_static_step_trains_bit_for_bit_as_the_eager_one(world, train_events_dir,
                                                                  tmp_path):
    """Through the loop, JishNet's static step (what its graphs replay; on a CPU run
    eagerly) on the device-dense loader's buffers computes what the eager step
    computes, to the bit: the same rank log and the same parameters after two epochs;
    one graph for each of the loader's rotating buffers; an epoch's short last batch
    steps eagerly."""
    from test_step_overlap import _same

    from lartpc.config import load_config
    from lartpc.data.prefetch import n_slots

    stats: dict = {}
    eager = _fit(world, train_events_dir, tmp_path / "eager", "tiny-jishnet")
    static = _fit(world, train_events_dir, tmp_path / "static", "tiny-jishnet", GRAPH[1],
                  graph_stats=stats)
    _same(eager, static)
    assert stats["steps"] > 0 and stats["steps"] + stats["eager_steps"] == len(static[1])
    buffers = n_slots(load_config("tiny-jishnet").data.prefetch)  # 4: all read in place
    assert stats["resized"] == buffers and stats["captures"] == 0 and not stats["fallback"]


def _jishnet_step(store, amp="none"):
    """A JishNet and its static step on a CPU (no capture), minibatch 4; the eager
    step's autocast (caching its casts, as the trainer's)."""
    from contextlib import nullcontext

    from lartpc.models.jishnet import JishNet
    from lartpc.train.graphed import DenseGraphedStep

    torch.manual_seed(0)
    model = JishNet(image_size=tuple(store.geometry.shape))

    def autocast(cache=True):
        return nullcontext() if amp == "none" else torch.autocast(
            "cpu", dtype=torch.bfloat16, cache_enabled=cache)

    step = DenseGraphedStep(model, torch.nn.functional.cross_entropy, 4, capture=False,
                            autocast=lambda: autocast(cache=False))
    return model, step, autocast


def _device_dense(store, n: int):
    """The device-dense loader's batches of 4 (on a CPU) of the first ``n`` events, in
    order: full ones in its rotating buffers 0, 1, 2, 0, ..., a short one last."""
    import numpy as np

    from lartpc.data.loaders import build_loader

    loader = build_loader(store, "device-dense", np.arange(n), 4, seed=1, shuffle=False)
    loader.set_epoch(0)
    return loader.iterate()


@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_jishnets_static_step_reads_the_loaders_buffers_and_skips_a_short_batch(
        train_events_dir, amp):
    """Step by step on real events from the device-dense loader: each of its rotating
    buffers is read where it lies (no copy) by a graph of its own, whose logits, loss
    and gradients live in the same tensors from one use of the buffer to the next (as a
    replay's) and equal an eager step's to the bit, in float32 and under bfloat16
    autocast (whose casts the static step does not cache); its (loss, accuracy) are the
    step's; a batch of another size is left to the eager step."""
    store = EventStore(train_events_dir)
    model, step, autocast = _jishnet_step(store, amp)
    outs = []
    for batch in _device_dense(store, 19):  # 4 full batches (buffers 0, 1, 2, 0), 3 events
        out = step(batch)
        if batch.data_size < 4:
            assert out is None
            continue
        # read where it lies (each batch is a new view of the buffer)
        assert batch.dense_reused and step.x.data_ptr() == batch.dense.data_ptr()
        logits, loss = out
        outs.append((logits, loss, model.convs[0].weight.grad, step.values))
        assert torch.equal(step.values, step_values(loss, logits, batch.labels))
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        with autocast():  # the trainer's eager step
            want = torch.nn.functional.cross_entropy(model(batch).float(), batch.labels)
        want.backward()
        assert float(loss) == float(want.detach())
        assert all(torch.equal(g, p.grad) for g, p in zip(got, model.parameters(), strict=True))
    first, second, _, again = outs
    assert all(a is b for a, b in zip(first, again, strict=True))  # buffer 0's graph again
    assert not any(a is b for a, b in zip(first, second, strict=True))
    assert step.stats == {"steps": 4, "captures": 0, "replays": 0, "resized": 3,
                          "eager_steps": 1, "fallback": None}


def test_jishnets_static_step_copies_other_images_into_its_own_buffer(train_events_dir,
                                                                      monkeypatch):
    """Images in no reused buffer (a copy, here as mirroring makes one), and those of
    a reused buffer past ``MAX_BUFFERS``, are copied into the step's own buffer: one
    more graph, shared by all of them, computing what the eager step does."""
    from dataclasses import replace

    from lartpc.train import graphed

    monkeypatch.setattr(graphed, "MAX_BUFFERS", 2)
    store = EventStore(train_events_dir)
    model, step, _ = _jishnet_step(store)
    batches = _device_dense(store, 16)  # buffers 0, 1, 2, 0
    for k, batch in enumerate(batches):
        if k == 1:  # first a batch of its own, not in the loader's buffer
            own = replace(batch, dense=batch.dense.clone(), dense_reused=False)
            _, loss = step(own)
            assert step.x.data_ptr() != own.dense.data_ptr() and step.key[0] == "copy"
            held = step.x
        _, loss = step(batch)
        in_place = step.x.data_ptr() == batch.dense.data_ptr()
        assert in_place == (k != 2)  # buffer 2: past MAX_BUFFERS
        if k == 2:
            assert step.x is held and torch.equal(held, batch.dense)
        model.zero_grad()
        want = torch.nn.functional.cross_entropy(model(batch), batch.labels)
        assert float(loss) == float(want.detach())
    assert step.stats["steps"] == 5 and step.stats["resized"] == 3  # 2 buffers, 1 copy


def test_only_the_loaders_own_buffers_are_marked_reused(train_events_dir):
    """``Batch.dense_reused`` (a graph may read the images in place) holds for the
    device-dense loader's batches and for nothing made from them: a mirrored copy, a
    noise-scale half (a view at an offset), a bare-step copy."""
    from lartpc.bench.bare_step import _copy
    from lartpc.data.augment import mirror
    from lartpc.train.noise import split_batch

    store = EventStore(train_events_dir)
    batch = next(iter(_device_dense(store, 8)))
    assert batch.dense_reused and batch.to("cpu").dense_reused  # not moved: still it
    seed = next(s for s in range(100) if mirror(batch, s, 0) is not batch)
    assert not mirror(batch, seed, 0).dense_reused
    assert not any(half.dense_reused for half in split_batch(batch))
    assert not _copy(batch, torch.device("cpu")).dense_reused


@pytest.mark.sparse
def test_the_eager_steps_tables_do_not_depend_on_when_the_loader_built_them(
        world, train_events_dir, tmp_path, monkeypatch):
    """The loader's threads pad each batch to the capacities as they stood when they
    built it, which depends on timing; a step the graph leaves to the eager step (an
    epoch's short last batch) pads to those at the step (``StaticStep.settled``). A
    training whose loader padded nothing, as if every batch had been built before the
    capacities grew, is then the same training bit for bit (before, its eager steps
    summed over other rows and it differed at rounding: a run with loader threads
    differed from its rerun now and then)."""
    from test_step_overlap import _same

    from lartpc.train.padding import Padding

    sets = ("model.sparse=torch", "data.rulebooks=loader", "train.cuda_graph=true")
    stats: dict = {}
    padded = _fit(world, train_events_dir, tmp_path / "padded", "tiny-scnet", *sets,
                  graph_stats=stats)
    assert stats["eager_steps"] > 0 and stats["steps"] > 0  # both kinds of step taken
    monkeypatch.setattr(Padding, "__call__",
                        lambda self, coords, batch_size, **kw: self.builder(
                            coords, batch_size, **kw))
    _same(padded, _fit(world, train_events_dir, tmp_path / "late", "tiny-scnet", *sets))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_benchs_captured_step_does_not_add_up_gradients_on_cuda():
    """``bench model --cuda-graph``'s capture: each replay's gradients are that step's
    own (the capture used to add them to the warm-up's, so replay k gave k + 1 times
    the gradient)."""
    from lartpc.bench.graphed import _captured, steps

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 5).cuda()
    x, y = torch.randn(7, 16, device="cuda"), torch.randint(0, 5, (7,), device="cuda")
    opt = torch.optim.Adam(model.parameters(), lr=0.0, capturable=True)  # lr 0: fixed
    step, eager = steps(lambda: torch.nn.functional.cross_entropy(model(x), y), opt)
    params = list(model.parameters())
    graph, _ = _captured(step, eager, 3, params)
    grads = [p.grad for p in params]  # what the captured backward writes
    want = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), params)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for got, g in zip(grads, want, strict=True):
            torch.testing.assert_close(got, g)


def test_a_failed_capture_lets_every_graph_go(train_events_dir, monkeypatch):
    """A capture that fails (on a later buffer, after others were captured) leaves the
    segment stepping eagerly without holding any graph: each graph keeps a step's
    activations in its own memory pool, which the eager steps then need. The capture
    is stood in (a CPU has no graphs); its failure is torch's own error type."""
    store = EventStore(train_events_dir)
    model, step, _ = _jishnet_step(store)
    captures = []

    def capture():
        captures.append(step.key)
        if len(captures) == 3:
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(step, "capture", True)
    monkeypatch.setattr(step, "_capture", capture)
    for batch in _device_dense(store, 16):  # buffers 0, 1, 2, 0
        out = step(batch)
        assert out is not None or step.stats["fallback"]
    assert len(captures) == 3 and step.stats["fallback"].startswith("RuntimeError")
    assert step.graph is None and step.key is None and step._graphs == {}
