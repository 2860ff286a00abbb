"""SCNet's sparse layers against dense PyTorch references on small random sparse images.

A submanifold convolution equals a zero-padded dense convolution of the scattered image,
read only at the active sites.

A sparse max-pool creates an output site only where a window holds an active input.
Its value is NOT the plain maximum over the active inputs: spconv (like SparseConvNet,
the library of the original SCNet, whose MaxPooling also zero-fills its output before
taking maxima) starts every output at 0, so the value is ``max(0, max over active)``.
The dense reference therefore fills inactive sites with -inf to find the output sites
(a window of only negative ELU outputs is still a site) and clamps the pooled values at
0. Both halves matter: a zero-filled dense max-pool gets the values right except in
fully active all-negative windows and cannot tell empty windows from sites; a
-inf-filled one without the clamp would report negative maxima spconv never produces.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lartpc.models.scnet import SCNet, spconv_output_size
from lartpc.models.sparse_compat import import_spconv

pytestmark = pytest.mark.sparse


def random_sparse(batch: int, shape: tuple[int, int], channels: int, density: float,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 coords (P, 3) and float32 features (P, C), values of both signs."""
    rng = np.random.default_rng(seed)
    coords = []
    for b in range(batch):
        n = max(1, int(density * shape[0] * shape[1]))
        flat = rng.choice(shape[0] * shape[1], n, replace=False)
        coords.append(np.stack([np.full(n, b), flat // shape[1], flat % shape[1]], 1))
    c = torch.from_numpy(np.concatenate(coords).astype(np.int32))
    f = torch.from_numpy(rng.normal(0, 1, (len(c), channels)).astype(np.float32))
    return c, f


def scatter(coords: torch.Tensor, feats: torch.Tensor, batch: int, shape, fill: float = 0.0):
    """Dense (B, C, H, W) with ``feats`` at ``coords`` and ``fill`` elsewhere."""
    out = torch.full((batch, feats.shape[1], *shape), fill, dtype=feats.dtype)
    b, r, c = coords.long().unbind(1)
    out[b, :, r, c] = feats
    return out


def gather(dense: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    b, r, c = coords.long().unbind(1)
    return dense[b, :, r, c]


def dense_weight(conv) -> torch.Tensor:
    """spconv 2.x stores weights as (out, kh, kw, in); torch conv2d wants (out, in, kh, kw)."""
    return conv.weight.permute(0, 3, 1, 2)


@pytest.mark.parametrize("level,shape,density,seed", [
    (0, (23, 31), 0.15, 0), (1, (17, 17), 0.15, 1), (2, (12, 29), 0.15, 2),
    # dense neighbourhoods, many channels, repeated: exposes spconv's racy CPU scatter
    (1, (20, 20), 0.3, 8)])
def test_submanifold_conv_matches_dense_conv_at_active_sites(level, shape, density, seed):
    spconv = import_spconv()
    torch.manual_seed(seed)
    conv = SCNet((3600, 3600)).convs[level]  # the model's own layer and weight layout
    cin = conv.in_channels
    coords, feats = random_sparse(2, shape, cin, density, seed)
    with torch.no_grad():
        ref = F.conv2d(scatter(coords, feats, 2, shape), dense_weight(conv), padding=2)
    for _ in range(3):
        with torch.no_grad():
            y = conv(spconv.SparseConvTensor(feats, coords, list(shape), 2))
        # submanifold: the output sites are exactly the input sites
        assert torch.equal(y.indices, coords)
        got, want = y.features, gather(ref, coords)
        assert got.shape == (len(coords), conv.out_channels)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # and it is not the dense conv everywhere: dense conv spreads to inactive neighbours
    inactive = scatter(coords, torch.ones(len(coords), 1), 2, shape)[:, 0] == 0
    assert ref.abs().sum(1)[inactive].max() > 0


def masked_maxpool(x: torch.Tensor, active: torch.Tensor, k: int):
    """Dense emulation of spconv's sparse max-pool: (values, output-site mask)."""
    pooled = F.max_pool2d(torch.where(active, x, float("-inf")), k, stride=k)
    sites = torch.isfinite(pooled[:, :1])
    return torch.where(sites, pooled.clamp(min=0), torch.zeros(())), sites


@pytest.mark.parametrize("k,shape,seed", [(5, (23, 31), 3), (4, (17, 26), 4),
                                          (5, (25, 25), 5)])
def test_sparse_maxpool_matches_masked_dense_maxpool(k, shape, seed):
    spconv = import_spconv()
    pool = SCNet((3600, 3600)).pools[0 if k == 5 else 2]
    assert tuple(pool.kernel_size) == (k, k) and tuple(pool.stride) == (k, k)
    coords, feats = random_sparse(2, shape, 3, 0.08, seed)
    # window (0, 0) of event 0: fully active, all values negative (-0.5 .. -0.9);
    # window (0, 1): a single active site, negative
    corner = (coords[:, 0] == 0) & (coords[:, 1] < k) & (coords[:, 2] < 2 * k)
    coords, feats = coords[~corner], feats[~corner]
    rr, cc = torch.meshgrid(torch.arange(k), torch.arange(k), indexing="ij")
    full = torch.stack([torch.zeros(k * k, dtype=torch.long), rr.flatten(), cc.flatten()], 1)
    coords = torch.cat([coords, full.int(), torch.tensor([[0, 1, k + 2]], dtype=torch.int32)])
    neg = -0.5 - 0.4 * torch.rand(k * k + 1, 3)
    feats = torch.cat([feats, neg])
    y = pool(spconv.SparseConvTensor(feats, coords, list(shape), 2))
    out_shape = [spconv_output_size(s, k, k) for s in shape]
    assert list(y.spatial_shape) == out_shape == [(s - k) // k + 1 for s in shape]

    active = scatter(coords, torch.ones(len(coords), 1), 2, shape) > 0
    want, sites = masked_maxpool(scatter(coords, feats, 2, shape), active, k)
    got_sites = torch.zeros_like(sites[:, 0])
    got_sites[y.indices[:, 0].long(), y.indices[:, 1].long(), y.indices[:, 2].long()] = True
    assert torch.equal(got_sites, sites[:, 0])
    assert got_sites[0, 0, 0] and got_sites[0, 0, 1]  # all-negative windows are sites
    torch.testing.assert_close(y.dense(), want)
    # the all-negative windows pool to 0, not to their (negative) maximum
    assert y.dense()[0, :, 0, :2].eq(0).all()
    assert neg[:k * k].amax(0).lt(-0.4).all()
    # values elsewhere equal a plain dense max-pool of the zero-filled image
    naive = F.max_pool2d(scatter(coords, feats, 2, shape), k, stride=k)
    assert torch.equal(naive[:, :, :, 2:] * sites[:, :, :, 2:], y.dense()[:, :, :, 2:])


def dense_scnet_trunk(model: SCNet, coords, feats, batch: int) -> torch.Tensor:
    """SCNet's trunk written with dense torch ops and an explicit active-site mask."""
    x = scatter(coords, feats, batch, model.image_size)
    mask = scatter(coords, torch.ones(len(coords), 1), batch, model.image_size) > 0
    for conv, pool in zip(model.convs, model.pools, strict=True):
        x = F.conv2d(x, dense_weight(conv), padding=2) * mask  # submanifold
        x, mask = masked_maxpool(F.elu(x), mask, pool.kernel_size[0])
    return x


def test_scnet_trunk_and_weight_gradients_match_dense_emulation():
    torch.manual_seed(7)
    model = SCNet((410, 433))
    coords, feats = random_sparse(2, model.image_size, 1, 0.01, 7)
    feats = feats.abs() * 50  # charge-like
    sparse_out = model.trunk(coords, feats, 2)
    dense_out = dense_scnet_trunk(model, coords, feats, 2)
    assert sparse_out.shape == dense_out.shape == (2, 256, *model.out_hw)
    torch.testing.assert_close(sparse_out, dense_out, rtol=1e-3, atol=1e-3)
    # gradients through the CPU backward (import_spconv's stream fix) agree too
    probe = torch.randn_like(dense_out)
    g_sparse = torch.autograd.grad((sparse_out * probe).sum(), [c.weight for c in model.convs])
    g_dense = torch.autograd.grad((dense_out * probe).sum(), [c.weight for c in model.convs])
    for gs, gd in zip(g_sparse, g_dense, strict=True):
        assert torch.isfinite(gs).all()
        torch.testing.assert_close(gs, gd, rtol=2e-3, atol=2e-3)


def test_minibatch_whose_sites_all_fall_off_a_pooling_still_trains():
    """450 x 450 (downsample 8): the third pooling (4) leaves out rows 400-449 of the
    image, so a minibatch with sites only there has none left. Logits come from zeros
    and every parameter still gets a gradient (zero in the trunk), so the ranks'
    gradient lists stay alike; before, spconv's backward raised on the empty tensor."""
    torch.manual_seed(0)
    model = SCNet((450, 450))
    rows = torch.tensor([420, 431, 447, 449, 405])
    cols = torch.tensor([3, 200, 448, 17, 90])
    coords = torch.stack([torch.tensor([0, 0, 1, 1, 1]), rows, cols], dim=1)
    feats = torch.rand(5, 1) + 0.5
    logits = model.forward_sparse(coords, feats, 2)
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    logits.sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    assert all(float(g.abs().sum()) == 0.0 for n, g in grads.items() if n.startswith("convs"))
    # no sites at all in the input: the same zeros and (zero) gradients
    model.zero_grad(set_to_none=True)
    model.forward_sparse(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 1), 2).sum() \
        .backward()
    assert all(p.grad is not None for p in model.parameters())
    # one site that survives every pooling: the trunk runs as usual
    ok = torch.tensor([[0, 10, 10], [1, 100, 50]])
    assert torch.isfinite(model.forward_sparse(ok, torch.ones(2, 1), 2)).all()
