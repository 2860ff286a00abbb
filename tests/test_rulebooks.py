"""SCNet's spconv rulebooks built in the sparse loader's prefetch thread
(``data.rulebooks = loader``, issue 36) change no result: they equal the ones spconv
builds in the forward, layer by layer; the forward then builds none, and its output and
gradients are bit-identical; a training ends with the same parameters and rank log, and
a run stopped and resumed with the option on equals an uninterrupted one without it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from test_eval_cadence import SignalAt
from test_step_overlap import VALUES, _build, _fit, _same, _segment
from train_helpers import rows

from lartpc.config import load_config
from lartpc.data.loaders import build_loader
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError
from lartpc.models import build
from lartpc.train import checkpoint
from lartpc.train.parts import rulebook_builder

pytestmark = pytest.mark.sparse

ON = "data.rulebooks=loader"


@pytest.fixture(scope="module")
def scnet(train_events_dir):
    torch.manual_seed(0)
    return build("scnet", image_size=EventStore(train_events_dir).geometry.shape)


def _batches(data, model, *, training: bool, n: int = 3):
    """The first ``n`` batches of a sparse loader that builds rulebooks in its thread."""
    store = EventStore(data)
    loader = build_loader(store, "sparse", np.arange(len(store)), 7, seed=1,
                          rulebooks=model.rulebook_builder(training=training))
    it = iter(loader)
    out = [next(it) for _ in range(n)]
    it.close()
    return out


class Calls(list):
    def __init__(self):
        super().__init__()
        self.threads = []


@pytest.fixture
def spy(monkeypatch):
    """Every rulebook spconv builds while the fixture is active: (arguments, results);
    ``calls.threads`` the thread of each."""
    from spconv.pytorch import ops

    calls, real = Calls(), ops.get_indice_pairs

    def recorded(*args, **kw):
        out = real(*args, **kw)
        calls.append((args, out))
        calls.threads.append(threading.current_thread())
        return out

    monkeypatch.setattr(ops, "get_indice_pairs", recorded)
    return calls


def test_loader_rulebooks_equal_the_forwards_layer_by_layer(train_events_dir, scnet, spy):
    batches = _batches(train_events_dir, scnet, training=True)
    assert len(spy) >= 3 * 8  # the loader's thread built them with spconv's own function
    for b in batches:
        rb = b.rulebooks
        assert rb is not None and rb.indices is b.coords
        spy.clear()
        scnet.forward_sparse(b.coords, b.features, b.data_size)  # spconv builds its own
        layers = scnet.rulebook_layers()
        built = [rb.subm[layer.key] if layer.subm else rb.pools[i // 2]
                 for i, layer in enumerate(layers)]
        assert len(spy) == len(built) == 8 and len(rb.pools) == 4
        for layer, (args, (outids, pairs, counts)), data in zip(layers, spy, built,
                                                                strict=True):
            assert args[5] == list(layer.stride) and args[9] == layer.subm  # same layer
            assert args[2] == data.spatial_shape and torch.equal(args[0], data.indices)
            assert torch.equal(pairs, data.indice_pairs)
            assert torch.equal(counts, data.indice_pair_num)
            assert torch.equal(outids, data.out_indices)
            assert counts.sum() > 0
        spy.clear()
        scnet.forward_sparse(b.coords, b.features, b.data_size, rb)
        assert spy == []  # the forward built none of its own


@pytest.mark.parametrize("training", [True, False])
def test_forward_and_gradients_with_prebuilt_rulebooks_are_identical(train_events_dir, scnet,
                                                                     training):
    scnet.train(training)
    try:
        for b in _batches(train_events_dir, scnet, training=training):
            got = []
            for rb in (None, b.rulebooks):
                scnet.zero_grad()
                with torch.set_grad_enabled(training):
                    out = scnet.forward_sparse(b.coords, b.features, b.data_size, rb)
                if training:
                    torch.nn.functional.cross_entropy(out, b.labels).backward()
                got.append([out.detach(), *(p.grad.clone() for p in scnet.parameters()
                                            if training)])
            assert all(torch.equal(x, y) for x, y in zip(*got, strict=True))
            assert got[0][0].abs().sum() > 0
    finally:
        scnet.train()


def test_rulebooks_for_other_coordinates_are_not_used(train_events_dir, scnet, spy):
    """A batch changed after the loader (mirrored, split: a new coordinate tensor), or
    run in the other mode, builds its rulebooks in the forward, as before."""
    b = _batches(train_events_dir, scnet, training=True, n=1)[0]
    flipped = b.coords.clone()
    flipped[:, 2] = b.shape[1] - 1 - flipped[:, 2]
    want = scnet.forward_sparse(flipped, b.features, b.data_size)
    spy.clear()
    assert torch.equal(scnet.forward_sparse(flipped, b.features, b.data_size, b.rulebooks),
                       want)
    assert len(spy) == 8
    scnet.eval()
    try:
        spy.clear()
        scnet.forward_sparse(b.coords, b.features, b.data_size, b.rulebooks)
        assert len(spy) == 8
    finally:
        scnet.train()


def test_the_option_refuses_what_it_cannot_serve(scnet):
    cfg = load_config("tiny-scnet", [ON])
    assert rulebook_builder(cfg, scnet, "sparse", train=True) is not None
    assert rulebook_builder(load_config("tiny-scnet"), scnet, "sparse", train=True) is None
    with pytest.raises(ConfigError, match="model.name=scnet and the sparse loader"):
        rulebook_builder(load_config("tiny-jishnet", [ON]), torch.nn.Identity(), "blosc",
                         train=True)
    with pytest.raises(ConfigError, match="model.name=scnet and the sparse loader"):
        rulebook_builder(cfg, scnet, "device-dense", train=True)
    with pytest.raises(ConfigError, match="data.augment=mirror"):
        rulebook_builder(load_config("tiny-scnet", [ON, "data.augment=mirror"]), scnet,
                         "sparse", train=True)
    with pytest.raises(ConfigError, match="data.rulebooks"):
        load_config("tiny-scnet", ["data.rulebooks=model"])


@pytest.fixture(scope="module")
def reference(world, train_events_dir, tmp_path_factory):
    """A two-epoch tiny SCNet training with rulebooks built in the forward."""
    return _fit(world, train_events_dir, tmp_path_factory.mktemp("rb") / "forward")


def test_training_with_loader_rulebooks_ends_with_the_same_parameters(world, train_events_dir,
                                                                      tmp_path, reference, spy):
    _same(reference, _fit(world, train_events_dir, tmp_path / "loader", "tiny-scnet", ON))
    # every rulebook (training and evaluation batches) was built in a loader's thread
    assert len(spy.threads) >= 8 * 2 * 8
    assert threading.main_thread() not in spy.threads


def test_stopped_and_resumed_with_loader_rulebooks_equals_uninterrupted(
        world, train_events_dir, tmp_path, reference):
    out = tmp_path / "run"
    t = _build(world, train_events_dir, out, "tiny-scnet", (ON,))
    at = t.plan.steps_per_epoch + 2  # mid-epoch 1
    t.stops = SignalAt(t, at)
    assert _segment(world, t, out) == "preempted"
    t.close()
    ck = checkpoint.load(out)
    assert ck["global_step"] == at and ck["config"]["data"]["rulebooks"] == "loader"
    t = _build(world, train_events_dir, out, "tiny-scnet", (ON,), resume=ck)
    assert _segment(world, t, out) == "completed"
    params = [p.detach().clone() for p in t.model.parameters()]
    t.close()
    _same(reference, (params, [{k: r[k] for k in VALUES} for r in rows(out / "rank-000.csv")]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algo", ["native", "implicit_gemm"])
def test_cuda_loader_rulebooks_give_the_same_forward_and_gradients(train_events_dir, algo):
    """On CUDA the loader builds them on a stream of its own. A pool's output sites come
    out of a hash table there, in an order that may differ from the forward's own, so
    gradients summed over sites may round differently: compared to a tolerance."""
    torch.manual_seed(0)
    store = EventStore(train_events_dir)
    model = build("scnet", image_size=store.geometry.shape, algo=algo).cuda()
    loader = build_loader(store, "sparse", np.arange(len(store)), 7, device="cuda", seed=1,
                          rulebooks=model.rulebook_builder(training=True))
    on_cpu = build_loader(store, "sparse", np.arange(len(store)), 7, device="cpu", seed=1)
    batches = 0
    for b, c in zip(loader, on_cpu, strict=True):
        batches += 1
        assert b.coords.is_cuda and b.rulebooks.indices is b.coords
        for name in ("labels", "coords", "features"):  # copied on the loader's stream
            assert torch.equal(getattr(b, name).cpu(), getattr(c, name)), name
        got = []
        for rb in (None, b.rulebooks):
            model.zero_grad()
            out = model.forward_sparse(b.coords, b.features, b.data_size, rb)
            torch.nn.functional.cross_entropy(out, b.labels).backward()
            got.append([out.detach(), *(p.grad.clone() for p in model.parameters())])
        for x, y in zip(*got, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    assert batches == -(-len(store) // 7)  # every batch compared, none skipped
