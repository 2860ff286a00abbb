"""JishNet: the study's dense CNN (torch Conv2d / MaxPool2d), on any image size.

Its first stage (conv 1->10, 5x5, ELU, max-pool 5) can run as one Triton kernel
(``model.stem = fused``, :mod:`lartpc.models.fused_stem`): the same function and the same
parameters, computed without writing the full-resolution map. Its second stage (conv
10->64, 5x5, ELU, max-pool 5) likewise (``model.stage2 = fused``,
:mod:`lartpc.models.fused_stage2`: the forward as one kernel, the backward through torch's
convolution gradients or as two more kernels). ``stem_choice`` and ``stage2_choice``
resolve ``auto``: fused on CUDA when Triton imports, the published layers otherwise.

At 3600 x 3600 the spatial sizes run 3600 -> 720 -> 144 -> 145 -> 36 -> 37 -> 9 and the
network has 1,335,817 parameters (tests/test_models.py checks the count).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from lartpc import NUM_CLASSES
from lartpc.errors import ConfigError
from lartpc.geometry import pooled_size
from lartpc.models.head import Head
from lartpc.models.kernel_settings import parse_stage2_kernel, parse_stem_kernel

#: (out_channels, conv kernel, conv padding, pool size) per stage; input has 1 channel.
STAGES: tuple[tuple[int, int, int, int], ...] = ((10, 5, 2, 5), (64, 5, 2, 5),
                                                 (128, 4, 2, 4), (256, 4, 2, 4))


def trunk_shape(image_size: tuple[int, int]) -> tuple[int, int]:
    """Spatial size of JishNet's last pooled map (PyTorch floor mode).

    Raises
    ------
    ConfigError
        If the image is too small to survive the four poolings.
    """
    sizes = list(image_size)
    for _, k, p, pool in STAGES:
        sizes = [pooled_size(pooled_size(s, k, padding=p, stride=1), pool) for s in sizes]
    if min(sizes) < 1:
        raise ConfigError(f"image_size={tuple(image_size)}: too small for JishNet "
                          f"(its four poolings leave {tuple(sizes)})")
    return sizes[0], sizes[1]


def _triton_missing() -> str | None:
    """Why Triton cannot be imported, or None when it can."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def _fused_choice(key: str, value: str, allowed: tuple[str, ...], device_type: str) -> str:
    """``fused`` or ``library`` for the option ``key`` (``model.stem``, ``model.stage2``)
    set to ``value`` on ``device_type``.

    Raises
    ------
    ConfigError
        For a value not in ``allowed``, or ``fused`` where it cannot run: no Triton, or a
        CPU without Triton's interpreter (``TRITON_INTERPRET=1``, for tests).
    """
    if value not in allowed:
        raise ConfigError(f"{key}={value!r}: choose one of {', '.join(allowed)}")
    if value == "library" or (value == "auto" and device_type != "cuda"):
        return "library"  # without importing Triton (a second of start-up on a CPU)
    missing = _triton_missing()
    if value == "auto":
        return "fused" if missing is None else "library"
    if missing is not None:
        raise ConfigError(f"{key}=fused needs Triton ({missing}); install the GPU extra "
                          f"(pip install 'lartpc[gpu]') or use {key}=library")
    if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(f"{key}=fused runs on CUDA (train.device is {device_type}); "
                          "on CPU only under Triton's interpreter (TRITON_INTERPRET=1, slow)")
    return value


def stem_choice(stem: str, device_type: str) -> str:
    """``fused`` or ``library`` for ``model.stem`` on ``device_type`` (see
    :func:`_fused_choice` for what is refused)."""
    from lartpc.models import STEMS

    return _fused_choice("model.stem", stem, STEMS, device_type)


def stage2_choice(stage2: str, device_type: str) -> str:
    """``fused`` or ``library`` for ``model.stage2`` on ``device_type`` (as
    :func:`stem_choice`)."""
    from lartpc.models import STAGE2S

    return _fused_choice("model.stage2", stage2, STAGE2S, device_type)


class JishNet(nn.Module):
    """Dense CNN of the study; returns logits (B, 5).

    Parameters
    ----------
    image_size : (H, W) of the input images.
    channels_last : keep activations in NHWC memory format (a GPU speed option).
    elu_after_pool : apply ELU after max-pooling instead of before. ELU is strictly
        increasing, so ``pool(elu(x)) == elu(pool(x))`` and the gradient goes to the
        same arg-max; the activation then touches 1/k^2 of the pixels. Off here, so
        that the class's own graph is the published one, layer for layer; training
        turns it on (``model.elu_after_pool = true``, the config's default), the same
        function (bit-identical in float32).
    head : the classifier head's pooling, ``flatten`` (the study) or ``max``
        (:class:`~lartpc.models.head.Head`).
    stem : ``library`` (the published layers) or ``fused`` (the first stage as one Triton
        kernel, :mod:`lartpc.models.fused_stem`; same function, same parameters).
    stage2 : ``library`` or ``fused`` (the second stage's forward as one Triton kernel,
        :mod:`lartpc.models.fused_stage2`; same function, same parameters).
    stem_kernel, stage2_kernel : the fused kernels' launch settings
        (:mod:`lartpc.models.kernel_settings`; ``""``: the kernel's default); unused by
        a library stage.
    stem_skip_empty : the fused stem leaves out blocks with no charge under their
        windows (:func:`lartpc.models.fused_stem.fused_stem`'s ``skip_empty``: the same
        numbers; no longer a dense first layer). Needs ``stem="fused"``.
    """

    input_kind = "dense"

    @classmethod
    def options(cls, cfg, amp: str, device_type: str) -> dict:
        """Constructor options from a :class:`~lartpc.config.ModelConfig`; an SCNet
        option set there is a :class:`ConfigError`. (``amp`` is an autocast around the
        whole model, not an option of its own.)"""
        if cfg.algo != "auto":
            raise ConfigError(f"model.algo={cfg.algo!r} is an SCNet option (model.name=jishnet)")
        if cfg.sparse != "spconv":
            raise ConfigError(f"model.sparse={cfg.sparse} is an SCNet option (model.name=jishnet)")
        kernels = {}
        for stage, key in (("stem", "stem_kernel"), ("stage2", "stage2_kernel")):
            value = getattr(cfg, key)
            if value and getattr(cfg, stage) == "library":
                raise ConfigError(f"model.{key}={value} sets a Triton kernel's launch; "
                                  f"model.{stage}=library runs none (use fused or auto)")
            kernels[key] = value
        stem = stem_choice(cfg.stem, device_type)
        if cfg.stem_skip_empty and stem != "fused":
            raise ConfigError(f"model.stem_skip_empty=true leaves out the fused stem's empty "
                              f"blocks; model.stem={cfg.stem} runs the published layers "
                              f"here (on {device_type}), which compute every pixel (use "
                              "model.stem=fused, or auto on CUDA with Triton)")
        return {"channels_last": cfg.channels_last, "elu_after_pool": cfg.elu_after_pool,
                "head": cfg.head, "stem": stem, "stage2": stage2_choice(cfg.stage2, device_type),
                "stem_skip_empty": cfg.stem_skip_empty, **kernels}

    def __init__(self, image_size: tuple[int, int], *, channels_last: bool = False,
                 elu_after_pool: bool = False, head: str = "flatten", stem: str = "library",
                 stage2: str = "library", stem_kernel: str = "", stage2_kernel: str = "",
                 stem_skip_empty: bool = False, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.out_hw = trunk_shape(self.image_size)
        self.channels_last = channels_last
        self.elu_after_pool = elu_after_pool
        if stem not in ("fused", "library"):
            raise ConfigError(f"JishNet stem={stem!r}: fused or library (resolve auto with "
                              "stem_choice)")
        if stage2 not in ("fused", "library"):
            raise ConfigError(f"JishNet stage2={stage2!r}: fused or library (resolve auto "
                              "with stage2_choice)")
        if stem_skip_empty and stem != "fused":
            raise ConfigError(f"JishNet stem_skip_empty=True needs stem='fused' (got {stem!r})")
        self.stem, self.stage2, self.stem_skip_empty = stem, stage2, stem_skip_empty
        self.stem_kernel = parse_stem_kernel(stem_kernel)
        self.stage2_kernel = parse_stage2_kernel(stage2_kernel)
        if stem == "fused":
            from lartpc.models.fused_stem import fused_stem
            self._fused_stem = fused_stem
        if stage2 == "fused":
            from lartpc.models.fused_stage2 import fused_stage
            self._fused_stage2 = fused_stage
        convs, cin = [], 1
        for cout, k, p, _ in STAGES:
            convs.append(nn.Conv2d(cin, cout, k, padding=p))
            cin = cout
        self.convs = nn.ModuleList(convs)
        self.pools = [pool for *_, pool in STAGES]
        self.head = Head(cin, self.out_hw, head, num_classes=num_classes)
        if channels_last:
            self.to(memory_format=torch.channels_last)

    def forward(self, batch) -> torch.Tensor:
        """Logits (B, 5) for a :class:`~lartpc.data.batch.Batch` with ``dense`` filled."""
        if batch.dense is None:
            raise ConfigError("JishNet needs dense batches (batch.dense is None); "
                              "use a dense loader for this model")
        return self.forward_tensor(batch.dense)

    def forward_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, 5) for a float tensor (B, 1, H, W)."""
        if x.dim() != 4 or x.shape[1] != 1 or tuple(x.shape[2:]) != self.image_size:
            raise ConfigError(f"JishNet built for (B, 1, {self.image_size[0]}, "
                              f"{self.image_size[1]}) input, got {tuple(x.shape)}")
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        for k in range(len(self.convs)):
            x = self.stage(k, x)
        return self.head(x)

    def stage(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Stage ``k`` (conv, ELU, max-pool) on its input ``x``."""
        conv, pool = self.convs[k], self.pools[k]
        if k == 0 and self.stem == "fused":
            return self._fused_stem(x, conv.weight, conv.bias, pool, conv.padding[0],
                                    channels_last=self.channels_last, kernel=self.stem_kernel,
                                    skip_empty=self.stem_skip_empty)
        if k == 1 and self.stage2 == "fused":
            return self._fused_stage2(x, conv.weight, conv.bias, pool, conv.padding[0],
                                      channels_last=self.channels_last,
                                      kernel=self.stage2_kernel)
        x = conv(x)
        if self.elu_after_pool:
            return F.elu(F.max_pool2d(x, pool), inplace=True)
        # in place: conv's backward needs its input, not its output, so the
        # 10 x H x W pre-activation need not be kept (518 MB per image at 3600)
        return F.max_pool2d(F.elu(x, inplace=True), pool)
