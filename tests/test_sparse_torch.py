"""SCNet's sparse layers in torch operations (``model.sparse = torch``, issue 36) compute
spconv's function: forward and gradients against spconv on generated events (rows and
columns a pool leaves out included), spconv's tie rule in the pool's backward, the
index tables built in the loader's thread, a training against spconv's, and the
option's refusals."""

from __future__ import annotations

import threading
from functools import partial

import numpy as np
import pytest
import torch
from test_step_overlap import _build, _fit, _same

from lartpc.config import load_config
from lartpc.data.loaders import build_loader
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError
from lartpc.models import build, model_class, sparse_torch
from lartpc.models.scnet import SCNet
from lartpc.models.sparse_compat import import_spconv
from lartpc.train.parts import rulebooks_choice

pytestmark = pytest.mark.sparse

TORCH = "model.sparse=torch"


def _pair(shape, seed=0):
    """The same parameters in an spconv SCNet and a torch one."""
    torch.manual_seed(seed)
    a = SCNet(shape)
    b = SCNet(shape, sparse="torch")
    b.load_state_dict(a.state_dict())
    return a, b


def test_same_seed_gives_spconvs_weights_without_spconvs_modules():
    """The torch layers hold their own parameters (no spconv module), drawn as spconv's:
    the same seed gives the same state dict, bit for bit, with the same keys."""
    torch.manual_seed(11)
    a = SCNet((400, 400))
    torch.manual_seed(11)
    b = SCNet((400, 400), sparse="torch")
    assert not any(type(m).__module__.startswith("spconv") for m in b.modules())
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _batches(data, n=3, model=None):
    store = EventStore(data)
    loader = build_loader(store, "sparse", np.arange(len(store)), 7, seed=1,
                          rulebooks=None if model is None else
                          model.rulebook_builder(training=True))
    it = iter(loader)
    out = [next(it) for _ in range(n)]
    it.close()
    return out


def _forward_backward(model, coords, features, batch_size, labels, maps=None):
    model.zero_grad()
    feats = features.clone().requires_grad_()
    out = model.forward_sparse(coords, feats, batch_size, maps)
    torch.nn.functional.cross_entropy(out, labels).backward()
    return [out.detach(), feats.grad, *(p.grad.clone() for p in model.parameters())]


def _close(got, want, rtol=1e-5):
    for g, w in zip(got, want, strict=True):
        scale = w.abs().max()
        assert scale > 0
        assert (g - w).abs().max() <= rtol * scale, ((g - w).abs().max(), scale)


def test_forward_and_gradients_equal_spconvs(train_events_dir):
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    a, b = _pair(shape)
    for batch in _batches(train_events_dir):
        args = (batch.coords, batch.features, batch.data_size, batch.labels)
        _close(_forward_backward(b, *args), _forward_backward(a, *args))


def test_sites_in_any_order_give_spconvs_result(train_events_dir):
    """The loaders hand sites in key order (the tables then skip a sort); any other
    order is sorted first: the same logits and gradients as spconv's."""
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    a, b = _pair(shape, seed=2)
    batch = _batches(train_events_dir, n=1)[0]
    perm = torch.randperm(len(batch.coords), generator=torch.Generator().manual_seed(0))
    args = (batch.coords[perm], batch.features[perm], batch.data_size, batch.labels)
    maps = b.rulebook_builder(training=True)(args[0], batch.data_size)
    assert not torch.equal(maps.order, torch.arange(len(perm)))  # it did sort
    _close(_forward_backward(b, *args), _forward_backward(a, *args))


def test_sites_a_pool_leaves_out_are_dropped_as_spconvs(train_events_dir):
    """406 x 402: the first pool leaves out row 405 and columns 400-401, the second the
    rows of the first's row 80; the events are moved down and right so that sites fall
    in them."""
    a, b = _pair((406, 402), seed=3)
    batch = _batches(train_events_dir, n=1)[0]
    coords = batch.coords.clone()
    coords[:, 1] += 405 - coords[:, 1].max()
    coords[:, 2] += 401 - coords[:, 2].max()
    assert (coords[:, 1] == 405).any() and (coords[:, 2] >= 400).any()
    args = (coords, batch.features, batch.data_size, batch.labels)
    _close(_forward_backward(b, *args), _forward_backward(a, *args))
    maps = b.rulebook_builder(training=True)(coords, batch.data_size)
    assert (maps.levels[0].slots == maps.levels[0].n_out).any()  # dropped sites
    assert [lv.shape for lv in maps.levels] == [(406, 402), (81, 80), (16, 16), (4, 4)]


def test_pool_ties_and_zeros_follow_spconvs_gradient_rule():
    """spconv's max-pool gives every input equal to its output the output's whole
    gradient: both of two tied maxima, and an exact 0 in a window whose maximum is 0;
    negative inputs of a window starting from zero get none."""
    sp = import_spconv()
    coords = torch.tensor([[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [0, 2, 2], [0, 3, 3]],
                          dtype=torch.int32)
    values = torch.tensor([[2.0], [2.0], [0.0], [-1.0], [0.0], [-3.0]])
    f1, f2 = values.clone().requires_grad_(), values.clone().requires_grad_()
    want = sp.SparseMaxPool2d(2, stride=2)(sp.SparseConvTensor(f1, coords, [4, 4], 1))
    (want.features * torch.tensor([[3.0], [5.0]])).sum().backward()
    maps = sparse_torch.build_maps(coords, 1, (4, 4), 1, (2,))
    got = sparse_torch.max_pool(f2[maps.order], maps.levels[0].slots, maps.levels[0].n_out)
    (got * torch.tensor([[3.0], [5.0]])).sum().backward()
    assert torch.equal(got, want.features)
    assert torch.equal(f1.grad, f2.grad) and f1.grad.ravel().tolist() == [3, 3, 0, 0, 5, 0]


@pytest.mark.parametrize("pass_cells", [None, 1, 2 * 27 * 21])
def test_neighbour_table_against_a_dense_search(monkeypatch, pass_cells):
    """Every offset of every site, against a plain search over a dense index image,
    with sites on the image's borders, in three images of a batch of four (one
    empty), all in one pass over the index image, one image a pass and two a pass."""
    if pass_cells is not None:
        monkeypatch.setitem(sparse_torch.PASS_CELLS, "cpu", pass_cells)
    rng = np.random.default_rng(5)
    h, w = 23, 17
    occupied = rng.random((4, h, w)) < 0.3
    occupied[1] = False
    b, y, x = np.nonzero(occupied)
    coords = torch.from_numpy(np.stack([b, y, x], 1)).int()
    keys, _ = torch.sort(sparse_torch.site_keys(coords, (h, w)))
    table = sparse_torch.neighbour_table(keys, (h, w), 5, images=4)
    assert torch.equal(sparse_torch.neighbour_table(keys, (h, w), 5), table)
    index = -np.ones((4, h, w), int)
    kb, ky, kx = (keys // (h * w)).numpy(), ((keys // w) % h).numpy(), (keys % w).numpy()
    index[kb, ky, kx] = np.arange(len(keys))
    want = np.full((len(keys), 25), -1)
    for i in range(len(keys)):
        for o, (dy, dx) in enumerate((dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)):
            yy, xx = ky[i] + dy, kx[i] + dx
            if 0 <= yy < h and 0 <= xx < w and index[kb[i], yy, xx] >= 0:
                want[i, o] = index[kb[i], yy, xx]
    assert (want >= 0).sum() > len(keys)  # neighbours found, not just the centres
    want[want < 0] = len(keys)  # no neighbour: the zero row appended after the sites
    assert np.array_equal(table.numpy(), want)


def test_tables_built_in_the_loaders_thread_give_the_same_result(train_events_dir):
    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, b = _pair(shape)
    for batch in _batches(train_events_dir, model=b):
        assert isinstance(batch.rulebooks, sparse_torch.SiteMaps)
        assert batch.rulebooks.indices is batch.coords
        args = (batch.coords, batch.features, batch.data_size, batch.labels)
        got = _forward_backward(b, *args, maps=batch.rulebooks)
        assert all(torch.equal(x, y) for x, y in zip(got, _forward_backward(b, *args),
                                                     strict=True))


def test_tables_padded_to_fixed_sizes_give_the_same_result(train_events_dir):
    """Padded to static capacities (what a captured CUDA graph needs): the same logits
    and gradients; tables padded again (capacities that grew while a loader thread
    built them) equal tables padded once, and run eagerly too (a short batch, or steps
    after a failed capture: before, their input order pointed past the input's rows);
    capacities smaller than a level are refused."""
    from test_table_cache import _same_maps

    shape = tuple(EventStore(train_events_dir).geometry.shape)
    _, b = _pair(shape)
    for batch in _batches(train_events_dir, n=2):
        maps = b.rulebook_builder(training=True)(batch.coords, batch.data_size)
        have = sparse_torch.sizes(maps)
        padded = sparse_torch.pad_maps(maps, [n + 37 for n in have])
        assert sparse_torch.sizes(padded) == tuple(n + 37 for n in have)
        again = sparse_torch.pad_maps(sparse_torch.pad_maps(maps, [n + 5 for n in have]),
                                      [n + 37 for n in have])
        _same_maps(again, padded)
        args = (batch.coords, batch.features, batch.data_size, batch.labels)
        unpadded = _forward_backward(b, *args, maps=maps)
        _close(_forward_backward(b, *args, maps=padded), unpadded, rtol=1e-6)
        _close(_forward_backward(b, *args, maps=again), unpadded, rtol=1e-6)
        with pytest.raises(ValueError, match="do not hold"):
            sparse_torch.pad_maps(maps, [have[0] - 1, *have[1:]])


def test_no_sites_give_zero_logits_from_the_head_alone():
    _, b = _pair((400, 400))
    coords = torch.zeros((0, 3), dtype=torch.int32)
    out = b.forward_sparse(coords, torch.zeros((0, 1)), 2)
    assert out.shape == (2, 5)
    # one site in the last row, which the first pool leaves out of a 403-row image
    _, c = _pair((403, 400))
    one = torch.tensor([[0, 402, 7]], dtype=torch.int32)
    out = c.forward_sparse(one, torch.ones((1, 1)), 1)
    out.sum().backward()
    assert out.shape == (1, 5)
    assert all(p.grad is not None for p in c.parameters())


def test_training_with_torch_layers_follows_spconvs(world, train_events_dir, tmp_path,
                                                    monkeypatch):
    """Two epochs: the rank logs' losses and the final parameters agree with spconv's to
    rounding (the sums run in another order); with the tables built in the loader's
    thread (``auto``) the training is bit-identical to the one building them in the
    forward, and the forward built none."""
    threads, real = [], sparse_torch.build_maps

    def spied(*args, **kw):
        threads.append(threading.current_thread())
        return real(*args, **kw)

    monkeypatch.setattr(sparse_torch, "build_maps", spied)
    spconv = _fit(world, train_events_dir, tmp_path / "spconv")
    torch_fwd = _fit(world, train_events_dir, tmp_path / "torch", "tiny-scnet", TORCH,
                     "data.rulebooks=forward")
    assert threads and set(threads) == {threading.main_thread()}
    threads.clear()
    torch_loader = _fit(world, train_events_dir, tmp_path / "loader", "tiny-scnet", TORCH)
    assert len(threads) > 2 * 8 and threading.main_thread() not in threads
    t = _build(world, train_events_dir, tmp_path / "auto", "tiny-scnet", (TORCH,))
    assert t.train_loader._rulebooks is not None  # auto: built in the loader's thread
    t.close()
    _same(torch_fwd, torch_loader)
    threads.clear()  # three loader threads, each building whole batches: the same run
    _same(torch_fwd, _fit(world, train_events_dir, tmp_path / "threads", "tiny-scnet", TORCH,
                          "data.prefetch_threads=3"))
    assert {t.name for t in threads} == {f"sparse-loader-{j}" for j in range(3)}
    (pa, la), (pb, lb) = spconv, torch_fwd
    assert len(la) == len(lb) > 0
    for ra, rb in zip(la, lb, strict=True):
        assert ra["batchno"] == rb["batchno"]
        assert abs(float(ra["local_loss"]) - float(rb["local_loss"])) < 1e-4
    for x, y in zip(pa, pb, strict=True):
        assert (x - y).abs().max() <= 1e-3 * x.abs().max()


@pytest.mark.parametrize("sets,mode,want", [
    ([TORCH], "sparse", "loader"),
    ([TORCH, "data.augment=mirror"], "sparse", "forward"),  # coordinates change after it
    ([TORCH, "data.rulebooks=forward"], "sparse", "forward"),
    ([], "sparse", "forward"),  # spconv's builders hold the GIL: no gain in a thread
    (["data.rulebooks=loader"], "sparse", "loader"),
])
def test_auto_builds_in_the_loader_for_the_torch_layers_only(sets, mode, want):
    assert rulebooks_choice(load_config("tiny-scnet", sets), mode) == want
    assert rulebooks_choice(load_config("tiny-jishnet"), "blosc") == "forward"


def test_the_option_refuses_what_it_cannot_serve():
    for name, sets, match in [
            ("tiny-jishnet", [TORCH], "model.sparse=torch is an SCNet option"),
            ("tiny-scnet", [TORCH, "model.algo=native"], "model.sparse=torch runs no spconv"),
    ]:
        cfg = load_config(name, sets)
        cls = type(build(cfg.model.name, image_size=(400, 400)))
        with pytest.raises(ConfigError, match=match):
            cls.options(cfg.model, "none", "cpu")
    with pytest.raises(ConfigError, match="model.sparse"):
        load_config("tiny-scnet", ["model.sparse=cuda"])
    with pytest.raises(ConfigError, match="sparse='cuda'"):
        SCNet((400, 400), sparse="cuda")


def test_bf16_is_refused_naming_the_precisions_the_trunk_runs():
    """SCNet under train.amp=bf16: with spconv, spconv's missing kernels; with the torch
    layers, the precisions its trunk runs (its autocast overrides an outer one)."""
    cls = model_class("scnet")
    with pytest.raises(ConfigError, match="spconv has no bfloat16 kernels"):
        cls.options(load_config("tiny-scnet").model, "bf16", "cuda")
    with pytest.raises(ConfigError, match=r"train.amp=bf16 with model.name=scnet: SCNet's "
                                          r"trunk runs float16 \(train.amp=fp16, CUDA\) or "
                                          r"float32") as refused:
        cls.options(load_config("tiny-scnet", [TORCH]).model, "bf16", "cuda")
    assert "spconv" not in str(refused.value)


def test_a_misspelt_way_of_building_the_tables_is_named(train_events_dir, monkeypatch):
    """A ``sparse_torch.TABLES`` (or ``tables=``) that is none of the ways is one
    ValueError naming it, not an attempt at Triton's kernels."""
    batch = _batches(train_events_dir, n=1)[0]
    build_maps = partial(sparse_torch.build_maps, batch.coords, batch.data_size,
                         tuple(batch.shape), 5, (5, 5, 4, 4))
    ways = ", ".join(sparse_torch.TABLE_WAYS)
    assert ways == "auto, torch, numba, triton, graph"
    monkeypatch.setattr(sparse_torch, "TABLES", "Numba")
    for call in (build_maps, partial(build_maps, rows=(10**6,) * 5),
                 sparse_torch.warm_cpu_tables):
        with pytest.raises(ValueError, match=f"tables='Numba' .*expected one of {ways}"):
            call()
    monkeypatch.setattr(sparse_torch, "TABLES", "auto")
    with pytest.raises(ValueError, match="tables='cuda'"):
        build_maps(tables="cuda")
    assert build_maps(tables="torch").fits(batch.coords, batch.data_size,
                                           tuple(batch.shape), True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_step_on_prebuilt_tables_never_synchronises(train_events_dir):
    """With the tables built ahead (the loader's thread), the training step's forward
    and backward (the input features need no gradient, as in training) queue their
    kernels without waiting for the device once; outputs and gradients equal spconv's
    to rounding."""
    store = EventStore(train_events_dir)
    torch.manual_seed(0)
    a = build("scnet", image_size=store.geometry.shape).cuda()
    b = build("scnet", image_size=store.geometry.shape, sparse="torch").cuda()
    b.load_state_dict(a.state_dict())
    loader = build_loader(store, "sparse", np.arange(len(store)), 7, device="cuda", seed=1,
                          rulebooks=b.rulebook_builder(training=True))
    # All made before the check: the debug mode is the process's, and the loader's own
    # threads read back while they build (off the step's path, which is what is tested)
    batches = list(loader)
    torch.cuda.synchronize()
    for batch in batches:
        args = (batch.coords, batch.features, batch.data_size, batch.labels)
        b.zero_grad()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = b.forward_sparse(*args[:3], batch.rulebooks)
            torch.nn.functional.cross_entropy(out, batch.labels).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got = [out.detach(), *(p.grad.clone() for p in b.parameters())]
        want = _forward_backward(a, *args)
        _close(got, [want[0], *want[2:]], rtol=1e-4)  # want[1]: the features' gradient


def test_bench_model_cuda_graph_refusals(capsys):
    from lartpc.cli import main

    for argv in (["--model", "scnet", "--sparse", "torch"],  # on the CPU
                 ["--model", "scnet", "--device", "cuda"],  # spconv's layers
                 ["--model", "jishnet"]):  # on the CPU
        assert main(["bench", "model", "--size", "400", "--cuda-graph", *argv]) == 2
        assert "--cuda-graph" in capsys.readouterr().err
