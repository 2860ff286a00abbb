"""``model.stem_kernel`` and ``model.stage2_kernel``: the fused kernels' launch settings
parsed and refused with the option's name, and carried from the config to the kernel
launch without changing what the model computes (under Triton's CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
from triton_cpu import DEVICE, event_images  # first: sets TRITON_INTERPRET on CPU

from lartpc.config import ModelConfig, load_config
from lartpc.errors import ConfigError
from lartpc.models.kernel_settings import (
    Stage2Kernel,
    StemKernel,
    parse_stage2_kernel,
    parse_stem_kernel,
)


@pytest.mark.parametrize("text,kernel", [
    ("", None), ("128:4", StemKernel(128, 4)), ("64:4:d", StemKernel(64, 4, "dot")),
    ("256:8:dot", StemKernel(256, 8, "dot")), ("64:8:b", StemKernel(64, 8, "band")),
    ("32:4:patch", StemKernel(32, 4, "patch")),
])
def test_stem_kernel_parses(text, kernel):
    assert parse_stem_kernel(text) == kernel
    if kernel:  # its canonical spelling parses back to it
        assert parse_stem_kernel(str(kernel)) == kernel


@pytest.mark.parametrize("text,kernel", [
    ("", None), ("64:8:32", Stage2Kernel(64, 8, 32, "hybrid")),
    ("32:4:64:t", Stage2Kernel(32, 4, 64, "triton")),
    ("64:8:32:triton", Stage2Kernel(64, 8, 32, "triton")),
    ("64:8:64:i", Stage2Kernel(64, 8, 64, "igrad")),
    ("64:8:64:igrad", Stage2Kernel(64, 8, 64, "igrad")),
    ("64:8:64:i:v", Stage2Kernel(64, 8, 64, "igrad", True)),
    ("64:8:64:m", Stage2Kernel(64, 8, 64, "map")),
    ("64:8:32:map:vec", Stage2Kernel(64, 8, 32, "map", True)),
    ("64:8:32:hybrid:vec", Stage2Kernel(64, 8, 32, "hybrid", True)),
])
def test_stage2_kernel_parses(text, kernel):
    assert parse_stage2_kernel(text) == kernel
    if kernel:
        assert parse_stage2_kernel(str(kernel)) == kernel


@pytest.mark.parametrize("key,text,message", [
    ("stem_kernel", "fast", "expected BLOCK:WARPS with an optional :dot or :band or :patch"),
    ("stem_kernel", "96:4", "BLOCK = '96' must be a power of two in 16..8192"),
    ("stem_kernel", "8:4", "BLOCK = '8' must be a power of two"),
    ("stem_kernel", "128:3", "WARPS = '3' must be one of 1, 2, 4, 8, 16"),
    ("stem_kernel", "128:4:x", "expected BLOCK:WARPS with an optional :dot or :band or :patch"),
    ("stage2_kernel", "64:8", "expected BLOCK:WARPS:BLOCK_K"),
    ("stage2_kernel", "64:8:32:", "expected BLOCK:WARPS:BLOCK_K"),
    ("stage2_kernel", "64:8:8", "BLOCK_K = '8' must be a power of two in 16..8192"),
    ("stage2_kernel", "64:32:32", "WARPS = '32' must be one of"),
    ("stage2_kernel", "64:8:32:cudnn", "optional :hybrid or :igrad or :map or :triton"),
    ("stage2_kernel", "64:8:32:igrad:fast", "and then an optional :vec"),
    ("stage2_kernel", "64:8:32:t:vec", ":vec (the forward's channels padded) goes with"),
])
def test_a_bad_setting_names_the_key(key, text, message):
    with pytest.raises(ConfigError) as bad:
        load_config("tiny-jishnet", [f"model.{key}={text}"])
    assert f"model.{key}={text!r}: " in str(bad.value) and message in str(bad.value)


def test_settings_belong_to_a_fused_jishnet_stage():
    from lartpc.models import model_class

    jish, sc = model_class("jishnet"), model_class("scnet")
    with pytest.raises(ConfigError, match="model.stem_kernel=128:4 sets a Triton kernel's "
                                          "launch; model.stem=library runs none"):
        jish.options(ModelConfig(stem="library", stem_kernel="128:4"), "none", "cpu")
    with pytest.raises(ConfigError, match="model.stage2=library runs none"):
        jish.options(ModelConfig(stage2="library", stage2_kernel="64:8:32"), "none", "cpu")
    with pytest.raises(ConfigError, match="model.stage2_kernel=64:8:32 is a JishNet option"):
        sc.options(ModelConfig(name="scnet", stage2_kernel="64:8:32"), "none", "cpu")
    # auto resolving to the library on a CPU keeps the setting (a GPU config run here)
    options = jish.options(ModelConfig(stem="auto", stem_kernel="128:4"), "none", "cpu")
    assert options["stem"] == "library" and options["stem_kernel"] == "128:4"


class _Launched(Exception):
    """Raised by the spy once a launch is seen: the kernel itself need not run."""


def test_the_model_passes_its_settings_to_the_launch(monkeypatch):
    """JishNet's stages hand the kernels the launch set in its options (seen at the
    autograd functions, before any kernel runs), and their defaults without them; the
    stem its ``stem_skip_empty`` too (its last argument)."""
    import lartpc.models.fused_stage2 as fs2
    import lartpc.models.fused_stem as fs
    from lartpc.models import build

    launches = []

    def spy(*args):
        # the launch (the last argument; the stem's is followed by its skip_empty)
        launches.append(args[-2:] if isinstance(args[-2], StemKernel) else args[-1])
        raise _Launched

    for cls in (fs._FusedStem, fs2._FusedStage):
        monkeypatch.setattr(cls, "apply", spy)
    for kernels in ({}, {"stem_kernel": "1024:2:dot", "stage2_kernel": "128:4:128:t",
                         "stem_skip_empty": True}):
        model = build("jishnet", image_size=(400, 400), stem="fused", stage2="fused",
                      **kernels)
        for k, shape in ((0, (1, 1, 400, 400)), (1, (1, 10, 80, 80))):
            with pytest.raises(_Launched):
                model.stage(k, torch.ones(shape))
    assert launches == [(StemKernel(fs.BLOCK, fs.NUM_WARPS, fs.SUMS), False),
                        Stage2Kernel(fs2.BLOCK, fs2.NUM_WARPS, fs2.BLOCK_K, fs2.BACKWARD),
                        (StemKernel(1024, 2, "dot"), True), Stage2Kernel(128, 4, 128, "triton")]


def _forward_backward(fn, x, conv, **kernel):
    """Output and the input, weight and bias gradients of ``fn`` (a fused stage) for one
    fixed upstream gradient."""
    w = conv.weight.detach().clone().requires_grad_(True)
    b = conv.bias.detach().clone().requires_grad_(True)
    x = x.detach().clone().requires_grad_(x.shape[1] > 1)  # the stem's input gets none
    y = fn(x, w, b, 5, 2, **kernel)
    (y * torch.linspace(-1, 1, y.numel(), device=DEVICE).reshape(y.shape)).sum().backward()
    return y.detach(), x.grad, w.grad, b.grad


@pytest.mark.parametrize("stage,one,other", [
    (1, StemKernel(64, 4), StemKernel(32, 2)),
    (2, Stage2Kernel(64, 8, 256, "hybrid"), Stage2Kernel(32, 4, 64, "triton")),
])
def test_another_launch_computes_the_same(stage, one, other):
    """Two launches give the same output and gradients to float32 rounding (only the
    order of partial sums differs), on a crop of a generated event (64 pooled outputs:
    one program against two; the interpreter's cost grows with the block)."""
    from lartpc.models.fused_stage2 import fused_stage
    from lartpc.models.fused_stem import fused_stem

    torch.manual_seed(0)
    image = event_images(1, 18, seed=6)  # 200 x 200
    conv1 = torch.nn.Conv2d(1, 10, 5, padding=2).to(DEVICE)
    if stage == 1:
        fn, x, conv = fused_stem, image[..., 80:120, 80:120], conv1
    else:  # the second stage's kind of input: the first stage's ten maps
        fn, x = fused_stage, torch.nn.functional.max_pool2d(conv1(image), 5).detach()
        conv = torch.nn.Conv2d(10, 16, 5, padding=2).to(DEVICE)
    first = _forward_backward(fn, x, conv, kernel=one)
    second = _forward_backward(fn, x, conv, kernel=other)
    assert first[0].shape[2:] == (8, 8) and first[0].abs().max() > 0
    for a, b in zip(first, second, strict=True):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
