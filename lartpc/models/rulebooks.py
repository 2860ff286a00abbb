"""SCNet's spconv rulebooks built ahead of the forward, from a batch's coordinates alone.

A rulebook is what spconv calls indice pairs: for each kernel offset, which active input
site feeds which output site, and (for a pooling) the output sites themselves. spconv
builds them inside each layer's forward. With ``data.rulebooks = loader`` the sparse
loader's prefetch thread builds them with :func:`prebuild` for batch k+1 while batch k
trains and hands them over with the batch (issue 36: host time off the step).

spconv reuses pairs only for submanifold convolutions that find their ``indice_key``
in the tensor's ``indice_dict``; its max-pools always build theirs. So SCNet starts its
sparse tensor with the submanifold rulebooks in ``indice_dict`` and runs each pool
through spconv's functional max-pool on the prebuilt pairs (:func:`max_pool`). Every
level's submanifold rulebook is built on the previous pool's output sites, so one pass
over the layers in order builds them all.

The build calls the very spconv functions the modules call, with the same arguments
(spconv 2.3: ``SparseConvolution._conv_forward`` in ``spconv/pytorch/conv.py``,
``SparseMaxPool.forward`` in ``pool.py``): ``ops.get_indice_pairs`` for the native
algorithm (CPU builds), ``ops.get_indice_pairs_implicit_gemm`` for the implicit-GEMM
ones (CUDA). ``tests/test_rulebooks.py`` checks the pairs equal those built in the
forward, layer by layer, and that forward, gradients and a training do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layer:
    """One layer that builds a rulebook, as its spconv module holds it: a submanifold
    convolution (``subm``, its rulebook stored under ``key``) or a max-pool."""

    subm: bool
    key: str | None
    ksize: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    out_padding: tuple[int, ...]
    algo: object  #: spconv's ConvAlgo

    @classmethod
    def of(cls, module) -> Layer:
        """The layer of a ``SubMConv*d`` or ``SparseMaxPool*d`` module."""
        from spconv.pytorch.conv import SparseConvolution
        from spconv.pytorch.pool import SparseMaxPool

        if isinstance(module, SparseConvolution):
            if not module.subm or module.transposed or module.inverse:
                raise TypeError(f"{module}: only submanifold convolutions reuse rulebooks")
            return cls(True, module.indice_key, *_tuples(module), tuple(module.output_padding),
                       module.algo)
        if isinstance(module, SparseMaxPool) and not module.subm:
            return cls(False, None, *_tuples(module), (0,) * module.ndim, module.algo)
        raise TypeError(f"{module}: not a submanifold convolution or a max-pool")


def _tuples(m) -> tuple:
    return tuple(m.kernel_size), tuple(m.stride), tuple(m.padding), tuple(m.dilation)


@dataclass
class Rulebooks:
    """Every rulebook of one batch: the submanifold ones by ``indice_key`` (spconv's
    ``IndiceData`` or ``ImplicitGemmIndiceData``, as its modules store them) and the
    pools' in order (``out_indices`` are the pooled sites). ``pools`` stops at a pool
    that leaves no site (the model stops there too)."""

    indices: torch.Tensor  #: the coordinates they were built for (int32 (P, 3))
    batch_size: int
    spatial_shape: list[int]
    training: bool  #: built for a training forward (implicit GEMM keeps backward pairs)
    subm: dict
    pools: list

    def fits(self, indices: torch.Tensor, batch_size: int, spatial_shape, training: bool) -> bool:
        """Built for this very coordinate tensor (identity: a changed batch, such as a
        mirrored or split one, holds a new tensor), batch size, shape and mode."""
        return (indices is self.indices and batch_size == self.batch_size
                and list(spatial_shape) == self.spatial_shape and training == self.training)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor held (to mark them used on another CUDA stream)."""
        out = [self.indices]
        for data in (*self.subm.values(), *self.pools):
            for v in vars(data).values():
                vs = v if isinstance(v, list | tuple) else [v]
                out += [t for t in vs if isinstance(t, torch.Tensor)]
        return out


def prebuild(coords: torch.Tensor, batch_size: int, spatial_shape, layers: tuple[Layer, ...],
             *, training: bool) -> Rulebooks | None:
    """The rulebooks ``layers`` (in forward order) build for int32 ``coords`` (P, 3) =
    (batch index, row, col) in an image of ``spatial_shape``; None for no sites (spconv
    cannot build a rulebook for none, and the model needs none). Runs on ``coords``'
    device, on the current CUDA stream there."""
    if coords.shape[0] == 0:
        return None
    indices, shape = coords, [int(s) for s in spatial_shape]
    rb = Rulebooks(coords, int(batch_size), list(shape), bool(training), {}, [])
    for layer in layers:
        data = _pairs(layer, indices, rb.batch_size, shape, training)
        if layer.subm:
            rb.subm[layer.key] = data
            continue
        rb.pools.append(data)
        indices, shape = data.out_indices, data.out_spatial_shape
        if indices.shape[0] == 0:
            break
    return rb


def _pairs(layer: Layer, indices: torch.Tensor, batch_size: int, shape: list[int],
           training: bool):
    """One layer's rulebook, as the layer's spconv forward builds and stores it."""
    from spconv.core import ConvAlgo
    from spconv.pytorch import ops
    from spconv.pytorch.core import ImplicitGemmIndiceData, IndiceData

    ksize, stride, padding, dilation = (list(v) for v in (layer.ksize, layer.stride,
                                                           layer.padding, layer.dilation))
    out_padding = list(layer.out_padding)
    out_shape = shape if layer.subm else ops.get_conv_output_size(shape, ksize, stride,
                                                                  padding, dilation)
    common = dict(spatial_shape=shape, out_spatial_shape=out_shape, is_subm=layer.subm,
                  algo=layer.algo, ksize=ksize, stride=stride, padding=padding,
                  dilation=dilation)
    if layer.algo == ConvAlgo.Native:
        outids, pairs, counts = ops.get_indice_pairs(
            indices, batch_size, shape, layer.algo, ksize, stride, padding, dilation,
            out_padding, layer.subm, False)
        return IndiceData(outids, indices, pairs, counts, **common)
    res = ops.get_indice_pairs_implicit_gemm(
        indices, batch_size, shape, layer.algo, ksize=ksize, stride=stride, padding=padding,
        dilation=dilation, out_padding=out_padding, subm=layer.subm, transpose=False,
        is_train=(not layer.subm) or training)
    return ImplicitGemmIndiceData(
        res[0], indices, res[2], res[3], pair_mask_fwd_splits=res[4],
        pair_mask_bwd_splits=res[5], mask_argsort_fwd_splits=res[6],
        mask_argsort_bwd_splits=res[7], masks=res[8], **common)


def max_pool(x, data):
    """spconv's max-pool of sparse tensor ``x`` on a prebuilt pool rulebook ``data``: the
    same functional call ``SparseMaxPool.forward`` makes after building its pairs."""
    from spconv.core import ConvAlgo
    from spconv.pytorch import functional as Fsp

    n_out = data.out_indices.shape[0]
    if data.algo == ConvAlgo.Native:
        dev = x.features.device
        out = Fsp.indice_maxpool(x.features, data.indice_pairs.to(dev),
                                 data.indice_pair_num.to(dev), n_out)
    else:
        out = Fsp.indice_maxpool_implicit_gemm(x.features, data.pair_fwd, data.pair_bwd, n_out)
    y = x.replace_feature(out)
    y.indices, y.spatial_shape = data.out_indices, data.out_spatial_shape
    y.indice_dict = dict(x.indice_dict)
    return y
