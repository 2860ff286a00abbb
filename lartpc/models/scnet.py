"""SCNet: the study's sparse CNN (spconv submanifold convolutions and sparse max-pools).

Four submanifold convolutions 1 -> 10 -> 64 -> 128 -> 256 (kernel 5, no bias), ELU on the
active features after each, sparse max-pools 5, 5, 4, 4 (stride = size), then
``.dense()`` and the same head as JishNet: 1,703,999 parameters at 3600 x 3600.

A submanifold convolution only produces outputs at active input sites and only reads
active neighbours, so unlike JishNet's zero-padded convolutions it never grows the
image (the "subtly different padding" the paper mentions): 3600 -> 720 -> 144 -> 36 -> 9.
A sparse max-pool makes an output site wherever its window holds an active site, with
value ``max(0, max over the active inputs)``: spconv, like SparseConvNet (the original's
library), starts each output at zero. ``tests/test_scnet_reference.py`` checks both
layers against dense references.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from lartpc import NUM_CLASSES
from lartpc.errors import ConfigError
from lartpc.models import ALGOS as ALGO_OPTIONS
from lartpc.models import SPARSE, sparse_torch
from lartpc.models.head import Head
from lartpc.models.rulebooks import Layer, Rulebooks, max_pool, prebuild
from lartpc.models.sparse_compat import import_spconv

CHANNELS = (10, 64, 128, 256)
KERNEL = 5
POOLS = (5, 5, 4, 4)
#: spconv's algorithms by name: model.algo's values but ``auto`` (spconv's own choice)
ALGOS = tuple(a for a in ALGO_OPTIONS if a != "auto")


def spconv_output_size(size: int, kernel: int, stride: int, padding: int = 0,
                       dilation: int = 1) -> int:
    """Output size of a strided sparse conv/pool, by spconv's own formula
    (``spconv.pytorch.ops.get_conv_output_size``): floor division, like PyTorch."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def trunk_shape(image_size: tuple[int, int]) -> tuple[int, int]:
    """Spatial size of SCNet's last pooled map for ``image_size`` (H, W)."""
    sizes = list(image_size)
    for pool in POOLS:
        sizes = [spconv_output_size(s, pool, pool) for s in sizes]
    if min(sizes) < 1:
        raise ConfigError(f"image_size={tuple(image_size)}: too small for SCNet "
                          f"(its four poolings leave {tuple(sizes)})")
    return sizes[0], sizes[1]


def _conv_algo(name: str | None):
    """spconv ``ConvAlgo`` for an option value; None keeps spconv's own default
    (implicit GEMM on CUDA builds, native gather-GEMM-scatter on CPU builds)."""
    if name is None:
        return None
    from spconv.core import ConvAlgo
    from spconv.cppconstants import CPU_ONLY_BUILD

    # paired with ALGOS in lartpc.models.ALGOS's order (strict: a name added there fails here)
    table = dict(zip(ALGOS, (ConvAlgo.Native, ConvAlgo.MaskImplicitGemm,
                             ConvAlgo.MaskSplitImplicitGemm), strict=True))
    if name not in table:
        raise ConfigError(f"SCNet option algo={name!r}: expected one of {', '.join(ALGOS)}")
    if CPU_ONLY_BUILD and name != "native":
        raise ConfigError(f"SCNet option algo={name!r} needs a CUDA build of spconv "
                          "(this one is CPU-only: use algo='native')")
    return table[name]


class TableConv(nn.Module):
    """The parameters of one submanifold convolution of the torch layers
    (``model.sparse=torch``; the convolution itself is :func:`sparse_torch.subm_conv` on
    the batch's tables): a weight in spconv's layout (C', k, k, C), no bias, drawn as
    spconv's ``SubMConv2d`` draws it (torch's ``kaiming_uniform_`` with a = sqrt(5) on the
    fan-in C k k, the arithmetic spconv copies). The same seed gives the same network with either
    layers, and the state dicts are interchangeable, without importing spconv."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int):
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel
        self.weight = nn.Parameter(torch.empty(out_channels, kernel, kernel, in_channels))
        # torch's fan-in of a (C', k, k, C) tensor is k * k * C, spconv's too
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"


class TablePool(nn.Module):
    """A sparse max-pool of the torch layers: its size only (no parameters); the pooling
    runs on the batch's tables (:func:`sparse_torch.max_pool`)."""

    def __init__(self, size: int):
        super().__init__()
        self.kernel_size = size

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.kernel_size}"


class SCNet(nn.Module):
    """Sparse CNN of the study; returns logits (B, 5).

    Parameters
    ----------
    image_size : (H, W) of the images the sparse coordinates live in.
    algo : spconv algorithm, one of ``native``, ``implicit_gemm``,
        ``split_implicit_gemm``, or None for spconv's default.
    half : run the sparse trunk in float16 under CUDA autocast (CUDA only); the head
        stays float32.
    head : the classifier head's pooling, ``flatten`` (the study) or ``max``
        (:class:`~lartpc.models.head.Head`).
    sparse : ``spconv`` (the library) or ``torch``
        (:mod:`~lartpc.models.sparse_torch`: the same layers in torch operations, without
        spconv installed). The weights have spconv's layout and initialisation either
        way (:class:`TableConv`), so the same seed gives the same network and
        checkpoints load into both.
    """

    input_kind = "sparse"

    @classmethod
    def options(cls, cfg, amp: str, device_type: str) -> dict:
        """Constructor options from a :class:`~lartpc.config.ModelConfig` and the mixed
        precision asked for; a JishNet option, or a precision spconv cannot run on
        ``device_type``, is a :class:`ConfigError`."""
        if cfg.channels_last:
            raise ConfigError("model.channels_last is a JishNet option (model.name=scnet)")
        if cfg.stem != "auto":
            raise ConfigError(f"model.stem={cfg.stem} is a JishNet option (model.name=scnet)")
        if cfg.stage2 != "auto":
            raise ConfigError(f"model.stage2={cfg.stage2} is a JishNet option "
                              "(model.name=scnet)")
        for key in ("stem_kernel", "stage2_kernel"):
            if getattr(cfg, key):
                raise ConfigError(f"model.{key}={getattr(cfg, key)} is a JishNet option "
                                  "(model.name=scnet)")
        if cfg.stem_skip_empty:
            raise ConfigError("model.stem_skip_empty is a JishNet option (model.name=scnet)")
        if amp == "bf16" and cfg.sparse == "torch":
            raise ConfigError("train.amp=bf16 with model.name=scnet: SCNet's trunk runs "
                              "float16 (train.amp=fp16, CUDA) or float32 (train.amp=none), "
                              "also with model.sparse=torch")
        if amp == "bf16":
            raise ConfigError("train.amp=bf16 with model.name=scnet: spconv has no bfloat16 "
                              "kernels; use train.amp=fp16 (CUDA) or none")
        if amp == "fp16" and device_type != "cuda":
            raise ConfigError("train.amp=fp16 with model.name=scnet needs CUDA (spconv's CPU "
                              "kernels are float32 only); use train.amp=none on CPU")
        if cfg.sparse == "torch" and cfg.algo != "auto":
            raise ConfigError(f"model.algo={cfg.algo} chooses spconv's algorithm; "
                              "model.sparse=torch runs no spconv kernels (leave algo=auto)")
        return {"algo": None if cfg.algo == "auto" else cfg.algo, "half": amp == "fp16",
                "head": cfg.head, "sparse": cfg.sparse}

    def __init__(self, image_size: tuple[int, int], *, algo: str | None = None,
                 half: bool = False, head: str = "flatten", num_classes: int = NUM_CLASSES,
                 sparse: str = "spconv"):
        super().__init__()
        if sparse not in SPARSE:
            raise ConfigError(f"SCNet option sparse={sparse!r}: expected one of "
                              f"{', '.join(SPARSE)}")
        self.sparse = sparse
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.out_hw = trunk_shape(self.image_size)
        self.algo, self.half = algo, half
        convs, pools, cin = [], [], 1
        if sparse == "torch":  # no spconv needed
            for cout, pool in zip(CHANNELS, POOLS, strict=True):
                convs.append(TableConv(cin, cout, KERNEL))
                pools.append(TablePool(pool))
                cin = cout
        else:
            spconv, conv_algo = import_spconv(), _conv_algo(algo)
            for level, (cout, pool) in enumerate(zip(CHANNELS, POOLS, strict=True)):
                # one indice_key per resolution: layers sharing it reuse one rulebook
                convs.append(spconv.SubMConv2d(cin, cout, KERNEL, bias=False,
                                               indice_key=f"subm{level}", algo=conv_algo))
                pools.append(spconv.SparseMaxPool2d(pool, stride=pool, algo=conv_algo))
                cin = cout
        self.convs, self.pools = nn.ModuleList(convs), nn.ModuleList(pools)
        self.head = Head(cin, self.out_hw, head, num_classes=num_classes)

    def forward(self, batch) -> torch.Tensor:
        """Logits (B, 5) for a :class:`~lartpc.data.batch.Batch` with ``coords`` and
        ``features`` filled."""
        if batch.coords is None or batch.features is None:
            raise ConfigError("SCNet needs sparse batches (batch.coords/features are None); "
                              "use a sparse loader for this model")
        if tuple(batch.shape) != self.image_size:
            raise ConfigError(f"SCNet built for {self.image_size} images, batch has shape "
                              f"{tuple(batch.shape)}")
        return self.forward_sparse(batch.coords, batch.features, batch.data_size,
                                   batch.rulebooks)

    def forward_sparse(self, coords: torch.Tensor, features: torch.Tensor,
                       batch_size: int, rulebooks: Rulebooks | None = None) -> torch.Tensor:
        """Logits (B, 5) from int (P, 3) coords (batch, row, col) and features (P, 1)."""
        if coords.dim() != 2 or coords.shape[1] != 3 or features.shape != (coords.shape[0], 1):
            raise ConfigError(f"SCNet expects coords (P, 3) and features (P, 1), got "
                              f"{tuple(coords.shape)} and {tuple(features.shape)}")
        return self.head(self.trunk(coords, features, batch_size, rulebooks))

    def rulebook_layers(self) -> tuple[Layer, ...]:
        """The layers that build spconv rulebooks, in forward order."""
        return tuple(Layer.of(m) for pair in zip(self.convs, self.pools, strict=True)
                     for m in pair)

    def rulebook_builder(self, *, training: bool, cache: bool = False):
        """``f(coords, batch_size)``: this network's rulebooks for a batch
        (:func:`~lartpc.models.rulebooks.prebuild`), for forwards in training mode or
        not; what the sparse loader calls with ``data.rulebooks = loader``. ``cache``
        (the torch layers only, ``data.table_cache``): tables made once per event and
        joined per batch (:class:`~lartpc.models.table_cache.CachedTables`)."""
        if self.sparse == "torch":
            build = partial(sparse_torch.build_maps, spatial_shape=self.image_size,
                            kernel=KERNEL, pools=POOLS, training=training)
            if cache:
                from lartpc.models.table_cache import CachedTables

                return CachedTables(build)
            return build
        return partial(prebuild, spatial_shape=list(self.image_size),
                       layers=self.rulebook_layers(), training=training)

    def trunk(self, coords: torch.Tensor, features: torch.Tensor,
              batch_size: int, rulebooks: Rulebooks | None = None) -> torch.Tensor:
        """The sparse layers, returned as a dense map (B, 256, h, w). ``rulebooks``
        built ahead for these very ``coords`` are used instead of building them here;
        any others (another tensor, mode or shape) are ignored."""
        if coords.shape[0] == 0:  # spconv cannot build a rulebook for no sites
            return self._no_sites(batch_size, features)
        if self.half and not features.is_cuda:
            raise ConfigError("SCNet option half=True needs CUDA tensors (spconv's CPU "
                              "kernels are float32 only)")
        if self.sparse == "torch":
            return self._trunk_torch(coords, features, batch_size, rulebooks)
        spconv = import_spconv()
        coords = coords.to(torch.int32)
        rb = rulebooks if rulebooks is not None and rulebooks.fits(
            coords, batch_size, self.image_size, self.training) else None
        x = spconv.SparseConvTensor(features, coords, list(self.image_size), batch_size,
                                    indice_dict=None if rb is None else dict(rb.subm))
        # overrides any outer CUDA autocast on purpose: float16 with half, else float32
        # (disabled), never an outer bfloat16, which spconv has no kernels for
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.half):
            for level, (conv, pool) in enumerate(zip(self.convs, self.pools, strict=True)):
                x = conv(x)  # finds its rulebook in x.indice_dict when prebuilt
                x = x.replace_feature(F.elu(x.features))
                x = pool(x) if rb is None else max_pool(x, rb.pools[level])
                if x.features.shape[0] == 0:
                    return self._no_sites(batch_size, features)
        return x.dense().float()

    def _trunk_torch(self, coords, features, batch_size, maps):
        """The trunk in torch operations on the batch's index tables (``maps``: built
        ahead for these ``coords``, or here)."""
        if maps is None or not isinstance(maps, sparse_torch.SiteMaps) or not maps.fits(
                coords, batch_size, self.image_size, self.training):
            maps = self.rulebook_builder(training=self.training)(coords, batch_size)
        return self.trunk_tables(features, maps, batch_size)

    def forward_tables(self, features: torch.Tensor, maps: sparse_torch.SiteMaps,
                       batch_size: int) -> torch.Tensor:
        """Logits (B, 5) from features (P, 1) in the coordinates' order and the torch
        layers' tables of this batch (padded or not): what a captured CUDA graph
        replays (:mod:`lartpc.train.graphed`)."""
        return self.head(self.trunk_tables(features, maps, batch_size))

    def trunk_tables(self, features: torch.Tensor, maps: sparse_torch.SiteMaps,
                     batch_size: int) -> torch.Tensor:
        """The torch layers' trunk on ``maps`` (a dense map, as :meth:`trunk`)."""
        rows = features if len(maps.order) == len(features) else torch.cat(  # padded maps
            [features, features.new_zeros(1, features.shape[1])])
        x = torch.index_select(rows, 0, maps.order)
        # as in trunk: overrides an outer CUDA autocast (float16 with half, else float32),
        # so that both layers' trunks run the same precisions
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.half):
            for conv, level in zip(self.convs, maps.levels, strict=False):
                x = F.elu(sparse_torch.subm_conv(x, level.neighbours, conv.weight,
                                                 level.mirrored))
                x = sparse_torch.max_pool(x, level.slots, level.n_out)
            if len(maps.levels) < len(self.convs) or x.shape[0] == 0:
                return self._no_sites(batch_size, features)
        return sparse_torch.to_dense(x, maps.dense_index, batch_size, maps.out_shape).float()

    def _no_sites(self, batch_size: int, features: torch.Tensor) -> torch.Tensor:
        """The trunk's output for a minibatch with no sites: none in the input, or pooling
        dropped them all (every event sat in the rows/columns an unpadded pooling leaves
        out: tiny events in small images). Zeros, tied to every parameter, so that every
        one still gets a (zero) gradient and the ranks' gradient lists stay alike for the
        averaging."""
        tie = sum(w.reshape(-1)[0] for w in self.parameters()) * 0.0
        return features.new_zeros(batch_size, CHANNELS[-1], *self.out_hw) + tie
