"""The fused second stage (a Triton forward kernel for JishNet's conv 10->64 + ELU + pool;
its backward through torch's convolution gradients, ``hybrid``, the same with the input's
gradient by a Triton kernel, ``igrad``, with both of the map's gradients by Triton, ``map``,
or as two Triton kernels without the map, ``triton``) against the published layers, on
CPU under Triton's interpreter; and ``model.stage2``'s choices and refusals.

As in tests/test_fused_stem.py, this module sets ``TRITON_INTERPRET=1`` when no GPU is
present, before it imports the kernel module; Triton is in the ``test`` extra, so CI
runs these; they fail, not skip, without it.

The interpreter's bf16 ``tl.dot`` is wrong (Triton 3.9), so there the kernel forms the
half-precision products in float32 from the rounded operands (``NATIVE_HALF_DOT``):
the bf16 cases below check that path and the rounding, not the GPU's native bf16 matrix
product, which ``jobs/local/stem_check.py --stage 2`` checks on a GPU.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F
from train_helpers import HEAVY_TIMEOUT_S
from triton_cpu import (  # first: sets TRITON_INTERPRET on CPU
    DEVICE,
    assert_trained_alike,
    compile_for_sm90,
    event_images,
    train_both_ways,
)

from lartpc.errors import ConfigError
from lartpc.models import build
from lartpc.models.jishnet import stage2_choice


def _stem_output(n: int, downsample: int, seed: int = 7) -> torch.Tensor:
    """The second stage's real input: ``n`` events through the published first stage
    (random weights); where an event is empty it is ELU(bias), constant per channel."""
    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(1, 10, 5, padding=2).to(DEVICE)
    with torch.no_grad():
        return F.max_pool2d(F.elu(conv(event_images(n, downsample, seed))), 5)


def _compare(x, dtype=torch.float32, autocast=False, channels_last=False, seed=0):
    """Output and input/weight/bias gradients of the fused stage and of the published
    layers in float64 (operands rounded to bf16 as the kernel rounds them for bf16 input
    or under bf16 autocast) for one random upstream gradient: relative errors, and how
    many of the reference's pooling windows hold a tied maximum."""
    from lartpc.models.fused_stage2 import fused_stage

    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(10, 64, 5, padding=2).to(DEVICE)
    xin = x.to(dtype)
    if channels_last:
        xin = xin.contiguous(memory_format=torch.channels_last)
    xin = xin.detach().requires_grad_(True)
    w = conv.weight.detach().clone().requires_grad_(True)
    b = conv.bias.detach().clone().requires_grad_(True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        y = fused_stage(xin, w, b, 5, 2, channels_last=channels_last)
    assert y.dtype == (torch.bfloat16 if autocast else dtype)
    assert y.is_contiguous(memory_format=torch.channels_last) == channels_last
    g = torch.randn(y.shape, device=DEVICE)
    (y.float() * g).sum().backward()
    rounding = torch.bfloat16 if autocast else dtype
    x64 = xin.detach().to(rounding).double().requires_grad_(True)
    w64 = conv.weight.detach().to(rounding).double().requires_grad_(True)
    b64 = conv.bias.detach().double().requires_grad_(True)
    conv64 = F.conv2d(x64, w64, b64, padding=2)
    ref = F.max_pool2d(F.elu(conv64), 5)
    (ref * g.double()).sum().backward()
    assert y.shape == ref.shape and xin.grad.dtype == xin.dtype
    # windows whose maximum is reached more than once (the tie rule decides them)
    windows = F.unfold(conv64.detach()[..., :ref.shape[2] * 5, :ref.shape[3] * 5], 5,
                       stride=5)
    ties = int(((windows == windows.amax(1, keepdim=True)).sum(1) > 1).sum())

    def rel(a, r):
        return float((a.detach().double() - r.detach()).norm() / r.detach().norm())

    return (rel(y, ref), rel(xin.grad, x64.grad), rel(w.grad, w64.grad), rel(b.grad, b64.grad),
            ties)


#: each backward, and those that go with it with the forward's channels padded (``vec``)
BACKWARDS = pytest.mark.parametrize("backward", ["hybrid", "igrad", "map", "triton",
                                                 "hybrid:vec", "igrad:vec", "map:vec"])


@pytest.fixture
def backward_kind(request, monkeypatch):
    """``fused_stage2.BACKWARD`` (and ``VEC``) set to the test's ``backward`` parameter."""
    import lartpc.models.fused_stage2 as fs2

    backward, _, vec = request.getfixturevalue("backward").partition(":")
    monkeypatch.setattr(fs2, "BACKWARD", backward)
    monkeypatch.setattr(fs2, "VEC", vec == "vec")


@BACKWARDS
def test_same_function_as_published_layers_float32(backward, backward_kind):
    """Forward and input, weight, bias gradients equal the published layers to float32
    rounding, with either backward: the real second-stage input of 3 events (60 x 60,
    whose empty regions give exactly tied windows, decided by the first-position rule)
    in channels-last order, and an odd-sized 73 x 71 random input (the pool drops a
    remainder, whose pixels get gradient through the windows they do reach) with an
    all-zero region (ties again)."""
    x = _stem_output(3, 12)
    odd = torch.randn(1, 10, 73, 71, device=DEVICE)
    odd[..., 20:50, 15:45] = 0
    for image, cl in ((x, True), (odd, False)):
        out, gx, gw, gb, ties = _compare(image, channels_last=cl)
        assert ties > 10, ties  # the tie rule is exercised
        assert out < 1e-6 and gx < 1e-5 and gw < 1e-5 and gb < 1e-5, \
            (image.shape, out, gx, gw, gb)


@BACKWARDS
def test_gpu_block_sizes(monkeypatch, backward, backward_kind):
    """With the GPU's default blocks (64 outputs, the 250 taps in slices of 32, not the
    interpreter's one slice; the triton backward's weight gradient summing 3 blocks per
    program in slices of 16 taps, its input gradient 128 pixels each, as igrad's; the map
    backward's weight gradient in blocks of 64 map pixels, two groups of 16 taps, 5
    programs of 10 blocks, the last with 8): many programs, partial sums, a padded last
    slice, a last program with fewer blocks."""
    import lartpc.models.fused_stage2 as fs2

    monkeypatch.setattr(fs2, "BLOCK", 64)
    monkeypatch.setattr(fs2, "BLOCK_K", 32)
    monkeypatch.setattr(fs2, "WGRAD_BLOCKS", 3)
    monkeypatch.setattr(fs2, "WGRAD_BLOCK_K_FLOAT", 16)
    monkeypatch.setattr(fs2, "IGRAD_BLOCK", 128)
    monkeypatch.setattr(fs2, "MAP_IGRAD_BLOCK", 128)
    monkeypatch.setattr(fs2, "MAP_WGRAD_BLOCK", 64)
    monkeypatch.setattr(fs2, "MAP_WGRAD_TAPS", 16)
    monkeypatch.setattr(fs2, "MAP_WGRAD_PROGRAMS", 5)
    x = torch.randn(2, 10, 41, 37, device=DEVICE)
    x[0, :, :25, :25] = 0
    out, gx, gw, gb, ties = _compare(x)
    assert ties > 0 and out < 1e-6 and gx < 1e-5 and gw < 1e-5 and gb < 1e-5, \
        (out, gx, gw, gb, ties)


@BACKWARDS
@pytest.mark.parametrize("dtype,autocast", [(torch.bfloat16, False), (torch.float16, False),
                                            (torch.float32, True)])
def test_half_precision(dtype, autocast, backward, backward_kind):
    """bf16 or fp16 input, and float32 input under bf16 autocast (the training case):
    products of rounded operands summed in float32, output in the half type; the error
    is the output's and gradients' rounding."""
    x = torch.randn(1, 10, 40, 45, device=DEVICE)
    out, gx, gw, gb, _ = _compare(x, dtype, autocast)
    assert out < 8e-3 and gx < 8e-3 and gw < 8e-3 and gb < 8e-3, (out, gx, gw, gb)


def test_nan_wins_its_window():
    """A NaN input pixel makes the windows whose convolutions reach it NaN, and only
    those; the rest equals the published layers."""
    from lartpc.models.fused_stage2 import fused_stage

    x = torch.randn(1, 10, 30, 30, device=DEVICE)
    x[0, 3, 12, 12] = float("nan")  # reaches conv rows/cols 10..14: pooled (2, 2)
    conv = torch.nn.Conv2d(10, 8, 5, padding=2).to(DEVICE)
    with torch.no_grad():
        y = fused_stage(x, conv.weight, conv.bias, 5, 2)
        ref = F.max_pool2d(F.elu(conv(x)), 5)
    expect = torch.zeros_like(y, dtype=torch.bool)
    expect[..., 2, 2] = True
    assert torch.equal(torch.isnan(y), expect)
    torch.testing.assert_close(y[~expect], ref[~expect])


@BACKWARDS
def test_training_steps_end_equal(backward, backward_kind):
    """Two Adam steps of JishNet (300 x 300, one event: the interpreter is slow) with the
    stem and the second stage fused (either backward) and with the published layers, from
    the same initial weights: every gradient of the first step agrees to 1e-5 (relative
    norm), and the parameters end equal, the stem's to 1e-6, the rest to 5e-5 (as in the
    fused stem's test: Adam's first steps move a weight by about lr times the sign of its
    gradient, so float32 rounding of a near-zero gradient becomes a step; seen: one of the
    second stage's 16,000 weights 1.1e-6 apart)."""
    x = event_images(1, 12, seed=11)
    grads, params = train_both_ways(x, torch.tensor([3], device=DEVICE), ("stem", "stage2"),
                                    elu_after_pool=True)
    assert_trained_alike(grads, params, x, moved="convs.1.weight")


def test_stage2_choice_and_record():
    from lartpc.config import CHOICES, ModelConfig
    from lartpc.models import STAGE2S, model_class

    assert CHOICES["model.stage2"] == STAGE2S
    assert stage2_choice("library", "cuda") == "library"
    assert stage2_choice("auto", "cpu") == "library"
    assert stage2_choice("fused", "cpu") == "fused"  # under the interpreter (set above)
    with pytest.raises(ConfigError, match="model.stage2='bogus'"):
        stage2_choice("bogus", "cpu")
    # the resolved choice is a constructor option: what run.json's model_options records
    opts = model_class("jishnet").options(ModelConfig(stage2="fused"), "none", "cpu")
    assert opts["stage2"] == "fused" and opts["stem"] == "library"
    with pytest.raises(ConfigError, match="stage2='auto'"):
        build("jishnet", image_size=300, stage2="auto")  # resolve auto first


def test_fused_on_cpu_without_interpreter_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="model.stage2=fused runs on CUDA.*TRITON_INTERPRET"):
        stage2_choice("fused", "cpu")


def test_bench_model_stage2_refused_for_scnet(capsys):
    from lartpc.cli import main

    assert main(["bench", "model", "--model", "scnet", "--stage2", "fused"]) == 2
    assert "--stage2" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(HEAVY_TIMEOUT_S)  # 340 s in the suite beside a busy loop, 98 s alone
def test_stem_check_stage2_runs_on_cpu(tmp_path, capsys):
    """``stem_check --stage 2`` (the GPU check of this stage) runs end to end on CPU
    under the interpreter, every backward, and its float32 accuracy rows are float32
    rounding."""
    from lartpc.jobs.local.stem_check import main

    assert main(["--out", str(tmp_path), "--size", "300", "--device", "cpu",
                 "--batch-per-rank", "1", "--repeats", "1", "--stage", "2",
                 "--configs", "256:4:256,256:4:256:i,256:4:256:t,256:4:256:i:v,256:4:256:m:v"
                 ]) == 0
    res = json.loads((tmp_path / "stage2-check.json").read_text())
    assert [(r["stage2"], r["backward"]) for r in res["timings"]] == \
        [("library", None), ("fused", "hybrid"), ("fused", "igrad"), ("fused", "triton"),
         ("fused", "igrad"), ("fused", "map")]
    assert [r["vec"] for r in res["timings"]] == [None, False, False, False, True, True]
    assert all(r["step_ms"] > 0 and r["stage2_forward_backward_ms"] > 0
               for r in res["timings"])
    fp32 = [r for r in res["accuracy"] if r["dtype"] == "float32" and not r["autocast_bf16"]]
    assert [(r.get("backward", r.get("way")), r.get("vec")) for r in fp32] == \
        [("hybrid", False), ("igrad", False), ("map", False), ("triton", False),
         ("igrad", True), ("map", True), ("library", None)]
    assert max(r[k] for r in fp32 for k in ("output_rel", "input_grad_rel", "weight_grad_rel",
                                            "bias_grad_rel")) < 1e-5
    # the published layers' own rows, one per precision, against the same reference
    library = [r for r in res["accuracy"] if r.get("way") == "library"]
    assert [(r["dtype"], r["autocast_bf16"]) for r in library] == \
        [("float32", False), ("float32", True), ("bfloat16", False)]
    assert all(0 < r["output_rel"] < 2e-2 and r["input_grad_rel"] > 0 for r in library)
    out = capsys.readouterr().out
    assert all(f"| fused | 256 | 4 | 256 | {b} |" in out for b in ("hybrid", "igrad", "triton"))
    # the pick of the fastest accurate launch reads this file
    from lartpc.jobs.local.fastest_kernels import pick

    choice = pick(res, 2)
    assert choice["accuracy"]["hybrid"]["within_tolerance"]
    assert choice["accuracy"]["igrad:vec"]["within_tolerance"]
    assert choice["accuracy"]["map:vec"]["within_tolerance"]
    assert choice["step_ms"] == min(r["step_ms"] for r in res["timings"])
    with pytest.raises(SystemExit) as bad:  # before any event is made
        main(["--out", str(tmp_path), "--stage", "2", "--configs", "64:8:32,64:8:32:x"])
    assert bad.value.code == 2 and "--configs='64:8:32:x': expected BLOCK:WARPS:BLOCK_K" in \
        capsys.readouterr().err


#: compiles the kernels for an H100/H200 (sm_90) without a GPU, as the GPU launch would
#: at the module's defaults (the build comes from triton_cpu.compile_for_sm90)
_COMPILE_FOR_SM90 = """
    import lartpc.models.fused_stage2 as fs2

    for dt in ("bf16", "fp32"):
        _, kp, block_k = fs2.forward_taps(10, 5, fs2.BLOCK_K, False, dt != "fp32")
        build(fs2._stage_forward,
              {"x_ptr": "*" + dt, "toff_ptr": "*i32", "w_ptr": "*" + dt, "b_ptr": "*fp32",
               "y_ptr": "*" + dt, "arg_ptr": "*u8"},
              dict(C=64, CP=64, POOL=5, BLOCK=fs2.BLOCK, KP=kp, BLOCK_K=block_k,
                   LOWP=dt != "fp32", NATIVE_HALF_DOT=True), dt, warps=fs2.NUM_WARPS)
        # vec: runs of 16 channels, 400 taps in whole slices
        run, kp, block_k = fs2.forward_taps(10, 5, fs2.BLOCK_K, True, dt != "fp32")
        build(fs2._stage_forward,
              {"x_ptr": "*" + dt, "toff_ptr": "*i32", "w_ptr": "*" + dt, "b_ptr": "*fp32",
               "y_ptr": "*" + dt, "arg_ptr": "*u8"},
              dict(C=64, CP=64, POOL=5, BLOCK=fs2.BLOCK, KP=kp, BLOCK_K=block_k,
                   LOWP=dt != "fp32", NATIVE_HALF_DOT=True, RUN=run, K=5),
              dt, "vec", warps=fs2.NUM_WARPS,
              aligned=("x_ptr", "w_ptr", "sx_b", "sx_h", "sx_w"))
        build(fs2._stage_scatter,
              {"g_ptr": "*" + dt, "y_ptr": "*" + dt, "arg_ptr": "*u8", "d_ptr": "*" + dt,
               "part_ptr": "*fp32"},
              dict(C=64, CP=64, POOL=5, BLOCK=fs2.BLOCK), dt, warps=fs2.NUM_WARPS)
        # the triton backward's two kernels
        build(fs2._stage_wgrad,
              {"x_ptr": "*" + dt, "toff_ptr": "*i32", "dm_ptr": "*fp32", "arg_ptr": "*u8",
               "part_ptr": "*fp32"},
              dict(CP=64, KP=256, POOL=5, BLOCK=fs2.BLOCK, BLOCKS=fs2.WGRAD_BLOCKS,
                   BLOCK_K=fs2.WGRAD_BLOCK_K_FLOAT if dt == "fp32" else fs2.WGRAD_BLOCK_K_HALF,
                   LOWP=dt != "fp32", NATIVE_HALF_DOT=True), dt, warps=fs2.BACKWARD_WARPS)
        build(fs2._stage_igrad,
              {"dm_ptr": "*fp32", "arg_ptr": "*u8", "w_ptr": "*" + dt, "gx_ptr": "*" + dt},
              dict(CIN=10, CIP=16, CP=64, K=5, PAD=2, POOL=5, BLOCK=fs2.IGRAD_BLOCK,
                   LOWP=dt != "fp32", NATIVE_HALF_DOT=True), dt, warps=fs2.BACKWARD_WARPS)
        # the igrad backward's input gradient from the map (channels-last, bf16 or float32)
        # (its pointers and the map's strides aligned, as a launch finds them)
        build(fs2._map_igrad, {"d_ptr": "*" + dt, "w_ptr": "*" + dt, "gx_ptr": "*" + dt},
              dict(C=64, CP=64, CIN=10, CIP=16, K=5, PAD=2, BLOCK=fs2.MAP_IGRAD_BLOCK,
                   LOWP=dt != "fp32", NATIVE_HALF_DOT=True), dt, warps=fs2.MAP_IGRAD_WARPS,
              aligned=("d_ptr", "w_ptr", "gx_ptr", "sd_b", "sd_h", "sd_w"))
        # the map backward's weight gradient, on the copy padded (vec) and not
        for run in (16, 10):
            build(fs2._map_wgrad, {"d_ptr": "*" + dt, "x_ptr": "*" + dt, "part_ptr": "*fp32"},
                  dict(C=64, CP=64, RUN=run, CIP=16, K=5, TAPS=fs2.MAP_WGRAD_TAPS,
                       BLOCK=fs2.MAP_WGRAD_BLOCK, LOWP=dt != "fp32", NATIVE_HALF_DOT=True),
                  dt, run, warps=fs2.MAP_WGRAD_WARPS,
                  aligned=("d_ptr", "x_ptr", "part_ptr", "sd_b", "sd_h", "sd_w", "sx_b",
                           "sx_h", "sx_w"))
"""


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_spills():
    """The interpreter runs no GPU compiler: here Triton compiles the forward (bf16 on
    the matrix units, and float32; both also ``vec``), the hybrid backward's scatter,
    the igrad backward's input gradient, the map backward's weight gradient (the copy
    padded and not) and the triton backward's weight- and input-gradient kernels for
    sm_90, as a launch on an H100/H200
    would at JishNet's sizes and the module's block sizes, and none spills registers to
    local memory (Triton's bundled ptxas; skipped where Triton has none)."""
    lines = compile_for_sm90(_COMPILE_FOR_SM90)
    assert len(lines) == 16, lines
    assert all("STACK:0" in line for line in lines), lines


_MAP_IGRAD_SASS = """
    import re

    import lartpc.models.fused_stage2 as fs2

    cubin = sm90_cubin(fs2._map_igrad, {"d_ptr": "*bf16", "w_ptr": "*bf16", "gx_ptr": "*bf16"},
                       dict(C=64, CP=64, CIN=10, CIP=16, K=5, PAD=2, BLOCK=fs2.MAP_IGRAD_BLOCK,
                            LOWP=True, NATIVE_HALF_DOT=True), fs2.MAP_IGRAD_WARPS,
                       ("d_ptr", "w_ptr", "gx_ptr", "sd_b", "sd_h", "sd_w"))
    ops = r"\\b(LDGSTS[.\\w]*|HGMMA[.\\w]*|LDG[.\\w]*)"
    print(*sorted(set(re.findall(ops, cuobjdump(cubin, "-sass")))))
    cubin = sm90_cubin(fs2._map_wgrad, {"d_ptr": "*bf16", "x_ptr": "*bf16", "part_ptr": "*fp32"},
                       dict(C=64, CP=64, RUN=16, CIP=16, K=5, TAPS=fs2.MAP_WGRAD_TAPS,
                            BLOCK=fs2.MAP_WGRAD_BLOCK, LOWP=True, NATIVE_HALF_DOT=True),
                       fs2.MAP_WGRAD_WARPS, ("d_ptr", "x_ptr", "part_ptr", "sd_b", "sd_h",
                                             "sd_w", "sx_b", "sx_h", "sx_w"))
    print(*sorted(set(re.findall(ops, cuobjdump(cubin, "-sass")))))
"""


@pytest.mark.slow
def test_map_kernels_copy_16_bytes_at_a_time_and_multiply_on_the_matrix_units_on_sm90():
    """What BENCHMARKS says of the map kernels' sm_90 code (bf16, the module's launches):
    igrad's input gradient reads the map's rows by 16-byte asynchronous copies that
    allocate in L1 (not the ``BYPASS`` kind Triton uses by default); the map backward's
    weight gradient reads the input's padded runs (``vec``) the same way; both multiply
    with warpgroup matrix instructions."""
    igrad, wgrad = (line.split() for line in compile_for_sm90(_MAP_IGRAD_SASS)[-2:])
    assert "LDGSTS.E.128" in igrad and not any("BYPASS" in op for op in igrad), igrad
    assert "LDGSTS.E.128" in wgrad and not any(op.startswith("LDG.") for op in wgrad), wgrad
    assert all(any(op.startswith("HGMMA") for op in ops) for ops in (igrad, wgrad))


_STAGE2_GATHERS = """
    import re
    from collections import Counter

    from lartpc.jobs.local.sass_loops import stage2_sass

    for text in ("64:8:64", "64:8:64:igrad:vec"):
        sass = stage2_sass(text)
        print(text, *sorted(Counter(re.findall(r"\\b(LDGSTS[.\\w]*|LDG[.\\w]*)", sass)).items()))
"""


@pytest.mark.slow
def test_vec_gathers_the_taps_in_16_byte_copies_on_sm90():
    """``vec`` (the second stage's input copy padded to 16 channels) turns the forward's
    gathers of single bf16 values (``LDG.E.U16``, one a tap and channel) into 16-byte
    asynchronous copies through L1 (``LDGSTS.E.128``), in sm_90 code compiled here."""
    plain, vec = (dict(re.findall(r"\('([\w.]+)', (\d+)\)", line))
                  for line in compile_for_sm90(_STAGE2_GATHERS)[-2:])
    assert int(plain.get("LDG.E.U16", 0)) >= 64, plain
    assert "LDG.E.U16" not in vec and int(vec.get("LDGSTS.E.128", 0)) > 0, vec


_DEFAULT_LAUNCHES = """
    import lartpc.models.fused_stage2 as fs2
    from lartpc.jobs.local.stem_check import STAGE2_CONFIGS, parse_configs

    for k in parse_configs(STAGE2_CONFIGS, 2):
        run, kp, block_k = fs2.forward_taps(10, 5, k.block_k, k.vec, lowp=True)
        build(fs2._stage_forward,
              {"x_ptr": "*bf16", "toff_ptr": "*i32", "w_ptr": "*bf16", "b_ptr": "*fp32",
               "y_ptr": "*bf16", "arg_ptr": "*u8"},
              dict(C=64, CP=64, POOL=5, BLOCK=k.block, KP=kp, BLOCK_K=block_k, LOWP=True,
                   NATIVE_HALF_DOT=True, RUN=run if k.vec else 0, K=5), str(k),
              warps=k.num_warps)
"""


@pytest.mark.slow
def test_the_launches_stem_check_times_compile_for_sm90_without_spills():
    """Every launch ``stem_check --stage 2`` times by default (``STAGE2_CONFIGS``, parsed
    as the GPU run parses them) compiles its bf16 forward for sm_90 without spilling."""
    from lartpc.jobs.local.stem_check import STAGE2_CONFIGS

    lines = compile_for_sm90(_DEFAULT_LAUNCHES)
    assert len(lines) == len(STAGE2_CONFIGS.split(",")), lines
    assert all("STACK:0" in line for line in lines), lines
