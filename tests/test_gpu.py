"""CUDA paths against their CPU results: loaders, SCNet, fp16 loss scaling, bf16 and
channels_last JishNet, torch.compile. The ``gpu`` tests skip without a CUDA device; the
CPU half of each comparison (the helpers) also runs in plain tests here."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lartpc.data import EventStore
from lartpc.data.batch import Batch
from lartpc.data.loaders import build_loader
from lartpc.models import build
from lartpc.models.losses import build_loss

CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False)"


@pytest.fixture(scope="module")
def store(events_dir):
    return EventStore(events_dir)


def loader_batches(store: EventStore, mode: str, device: str, epochs: int = 2) -> list:
    """(event ids, dense images or (coords, features)) of every batch, on the CPU."""
    loader = build_loader(store, mode, np.arange(2, 25), 4, device=device, seed=5)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for b in loader:
            assert b.labels.device.type == torch.device(device).type
            # copies: on the CPU a batch is a view of a slot buffer the loader reuses
            data = (b.dense,) if b.dense is not None else (b.coords, b.features)
            out.append((b.event_ids.copy(), *(t.cpu().numpy().copy()
                                              for t in (b.labels, *data))))
    return out


def _assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b) == 12  # 23 events in batches of 4, two epochs
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


def jishnet_pair(**options) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A float32 JishNet and a copy built with ``options``, holding the same weights."""
    torch.manual_seed(0)
    ref = build("jishnet", image_size=(900, 900))
    other = build("jishnet", image_size=(900, 900), **options)
    other.load_state_dict(ref.state_dict())
    return ref.eval(), other.eval()


def dense_input(store: EventStore, n: int = 3) -> torch.Tensor:
    return torch.stack([torch.from_numpy(e.dense(store.geometry.shape))[None]
                        for e in store.read_many(range(n))])


def test_cpu_half_of_the_comparisons_runs_here(store):
    """The helpers the GPU tests use, on the CPU: same batches from two dense paths, and
    channels_last equal to the default layout."""
    _assert_same_batches(loader_batches(store, "blosc", "cpu"),
                         loader_batches(store, "device-dense", "cpu"))
    ref, cl = jishnet_pair(channels_last=True)
    x = dense_input(store)
    with torch.no_grad():
        torch.testing.assert_close(cl.forward_tensor(x), ref.forward_tensor(x),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("mode", ["blosc", "device-dense", "sparse"])
def test_cuda_loader_gives_the_cpu_batches(store, mode):
    """Pinned-buffer Blosc copies, the on-device scatter and sparse tensors on CUDA hold
    exactly the CPU loader's batches."""
    _assert_same_batches(loader_batches(store, mode, "cpu"), loader_batches(store, mode, "cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_device_dense_pixels_wait_page_locked_for_their_copy(store):
    """The device-dense loader's prefetch thread page-locks a batch's pixel indices and
    charges, so the consumer's copies are queued without waiting for its stream (a copy
    from pageable memory waited for the previous step, counted as data wait)."""
    loader = build_loader(store, "device-dense", np.arange(2, 25), 4, device="cuda", seed=5)
    job = loader._produce(np.arange(4), 0)
    assert job.flat.is_pinned() and job.vals.is_pinned() and not job.done
    assert job.batch.labels.is_pinned()


@pytest.mark.gpu
@pytest.mark.sparse
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_scnet_forward_on_cuda_equals_cpu(store):
    try:
        import spconv  # noqa: F401
    except ImportError:  # on a GPU host its absence is the failure this test is for
        pytest.fail("spconv not installed: run `make install` (jobs/env/install_spconv.sh)")
    torch.manual_seed(0)
    cpu_model = build("scnet", image_size=store.geometry.shape).eval()
    cuda_model = copy.deepcopy(cpu_model).to("cuda")
    batch = next(iter(build_loader(store, "sparse", np.arange(6), 6, shuffle=False)))
    with torch.no_grad():
        a = cpu_model(batch)
        b = cuda_model(batch.to("cuda")).cpu()
    torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_fp16_loss_scaling_step_matches_fp32_gradients(store):
    torch.manual_seed(0)
    ref = build("jishnet", image_size=store.geometry.shape).cuda()
    model = copy.deepcopy(ref)
    x, y = dense_input(store, 4).cuda(), torch.tensor([0, 1, 2, 3], device="cuda")
    loss_fn = build_loss("ce")
    loss_fn(ref.forward_tensor(x), y).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model.forward_tensor(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    g16 = torch.cat([p.grad.flatten() for p in model.parameters()])
    g32 = torch.cat([p.grad.flatten() for p in ref.parameters()])
    assert torch.linalg.norm(g16 - g32) <= 2e-2 * torch.linalg.norm(g32)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 65536.0  # no inf/NaN found: the scale stays
    for p, p0 in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * p.grad)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("channels_last", [False, True])
def test_bf16_and_channels_last_jishnet_close_to_fp32(store, channels_last):
    ref, model = jishnet_pair(channels_last=channels_last)
    ref, model = ref.cuda(), model.cuda()
    x = dense_input(store).cuda()
    with torch.no_grad():
        a = ref.forward_tensor(x)
        torch.testing.assert_close(model.forward_tensor(x), a, rtol=1e-3, atol=1e-4)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            b = model.forward_tensor(x).float()
    # bf16 keeps 8 bits of mantissa: a few per cent of the logits' spread
    assert (b - a).abs().max() <= 0.05 * a.abs().max() + 1e-3


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_compiled_jishnet_equals_eager_on_cuda(store):
    ref, _ = jishnet_pair()
    ref = ref.cuda()
    compiled = torch.compile(copy.deepcopy(ref))  # compiles forward(batch)
    x = dense_input(store).cuda()
    batch = Batch(labels=torch.zeros(len(x), dtype=torch.int64, device="cuda"),
                  shape=store.geometry.shape, dense=x)
    with torch.no_grad():
        torch.testing.assert_close(compiled(batch), ref.forward_tensor(x), rtol=1e-3, atol=1e-4)
