"""The fused stem on a GPU: does it compute the published layers' function, and how fast.

    python -m lartpc.jobs.local.stem_check --out stem-check            # on the GPU host
    TRITON_INTERPRET=1 python -m lartpc.jobs.local.stem_check --out /tmp/sc --size 300 \\
        --device cpu --batch-per-rank 1 --configs 4096:4                       # smoke run on CPU
    python -m lartpc.jobs.local.stem_check --out stage2-check --stage 2     # the second stage

On ``--batch`` events generated at ``--size`` (real events, as every bench), for float32
and bfloat16 input and for float32 under bf16 autocast, with each way of summing the
taps that a timed configuration uses (``fused_stem.SUMS``): the fused stem's output and
weight/bias gradients against the published layers computed in float64 (relative norms
of the difference, the largest absolute output difference, the share of windows whose
arg-max ELU moves in the reference); then, for each ``BLOCK:WARPS[:SUMS]``
configuration, the stem alone (forward, forward+backward) and the whole JishNet training
step (bf16 autocast, channels_last, ELU after pool) with the library and with the fused
stem: medians of wall-clock times, the device synchronised around each. (The second
stage with 10 and 16 input channels, timed here until it was answered: 5.95 and 5.47 ms
on the H200, 2026-11-28.) Writes ``stem-check.json`` into ``--out`` and
prints a table.

``--stage 2`` checks the fused second stage (:mod:`lartpc.models.fused_stage2`) instead,
on its real input (the events through the library stem, float32): output and input,
weight and bias gradients against the published layers in float64 (operands rounded as
the kernel rounds them: to bf16 for bf16 input or under autocast), with each of its
backwards (``hybrid``, ``igrad``, ``map``, ``triton``), then, for each
``BLOCK:WARPS:BLOCK_K[:i|:m|:t[:v]]`` configuration, the second stage alone (forward,
forward+backward with its input's gradient) and the whole training step, both with the
fused stem (its launch: ``--stem-kernel``), with the library's second stage and with
the fused one. Writes ``stage2-check.json``.

Configurations are spelled as the options ``model.stem_kernel`` and
``model.stage2_kernel`` (:mod:`lartpc.models.kernel_settings`; ``d``, ``b``, ``p``,
``h``, ``i``, ``m`` and ``t`` short for ``dot``, ``band``, ``patch``, ``hoist``,
``igrad``, ``map`` and ``triton``) and passed to the model as
such; each row records its ``kernel``. ``jobs/local/fastest_kernels.py`` picks the
fastest accurate one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lartpc.bench.stages import median_ms
from lartpc.cliparse import add_batch_per_rank

#: the stem's launches timed by default: the default (64:4:dot, the fastest on an H200
#: on 2026-11-28) and its neighbours, and band and patch at the launches that compile for
#: sm_90 without spilling registers (tests/test_fused_stem.py)
STEM_CONFIGS = "64:4:d,64:8:d,64:4:h,64:8:h,128:4:h,64:4:b,64:8:p"
#: the second stage's: the two fastest hybrid launches on an H200 (2026-11-28; 64:8:64
#: the default), the igrad backward at the default and a smaller one, and igrad with
#: the forward's channels padded (``vec``) at the two, and the map backward (both
#: gradients by Triton) with ``vec`` at the same two (the triton backward, 2.7x slower
#: there, is still checked for accuracy, no longer timed by default)
STAGE2_CONFIGS = ("64:8:64,64:8:32,64:8:64:i,32:4:64:i,64:8:64:i:v,64:8:32:i:v,"
                  "64:8:64:m:v,64:8:32:m:v")


def _events(size: int, batch: int, seed: int):
    import numpy as np
    import torch

    from lartpc.geometry import Geometry
    from lartpc.sim import simulate_event

    geometry = Geometry(downsample=3600 // size)
    events = [simulate_event(i, seed, geometry) for i in range(batch)]
    dense = np.stack([e.dense(geometry.shape) for e in events])[:, None]
    labels = torch.tensor([e.label for e in events], dtype=torch.int64)
    return torch.from_numpy(dense), labels


def _precisions():
    import torch

    #: (input dtype, bf16 autocast) of every accuracy row: float32, float32 under bf16
    #: autocast (training's case), bf16
    return ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False))


def _precision(dtype, autocast: bool) -> dict:
    """An accuracy row's precision fields."""
    return {"dtype": str(dtype).replace("torch.", ""), "autocast_bf16": autocast}


def _stage2_rounding(dtype, autocast: bool):
    """What the fused second stage rounds its products' operands to: bf16 under autocast,
    the input's type otherwise (the float64 reference rounds them alike)."""
    import torch

    return torch.bfloat16 if autocast else dtype


def relative_error(a, r) -> float:
    """|a - r| / |r| (Frobenius norms; ``r`` the float64 reference)."""
    return float((a.detach().double() - r.detach()).norm() / r.detach().norm())


def _reference(xin, conv, pool: int, g, rounding=None) -> dict:
    """The published layers (conv + bias, ELU, max-pool) in float64 on ``xin``, operands
    first rounded to ``rounding`` where the kernel rounds them (None: as they are), and
    their backward of the output gradient ``g``: output, arg-max and the gradients of the
    input, weights and bias."""
    import torch.nn.functional as F

    def operand(t):
        t = t.detach()
        return (t if rounding is None else t.to(rounding)).double().requires_grad_(True)

    x64, w64 = operand(xin), operand(conv.weight)
    b64 = conv.bias.detach().double().requires_grad_(True)
    conv64 = F.conv2d(x64, w64, b64, padding=conv.padding[0])
    out, where = F.max_pool2d(F.elu(conv64), pool, return_indices=True)
    (out * g.double()).sum().backward()
    _, where_pre_elu = F.max_pool2d(conv64.detach(), pool, return_indices=True)
    return {"out": out.detach(), "x_grad": x64.grad, "w_grad": w64.grad, "b_grad": b64.grad,
            # windows where ELU's saturation or rounding moves torch's arg-max
            "argmax_differs_fraction": float((where != where_pre_elu).double().mean())}


def _errors(y, xin, w, b, ref: dict) -> dict:
    """Relative errors of a computed output and gradients against ``_reference``."""
    errors = {"output_rel": relative_error(y, ref["out"]),
              "output_max_abs": float((y.detach().double() - ref["out"]).abs().max())}
    if xin.grad is not None:
        errors["input_grad_rel"] = relative_error(xin.grad, ref["x_grad"])
    errors.update(weight_grad_rel=relative_error(w.grad, ref["w_grad"]),
                  bias_grad_rel=relative_error(b.grad, ref["b_grad"]),
                  argmax_differs_fraction=ref["argmax_differs_fraction"])
    return errors


def _run(layer, x, conv, dtype, autocast: bool, input_grad: bool, weights_dtype=None):
    """``layer(xin, w, b)`` on ``x`` cast to ``dtype`` (weights cast to
    ``weights_dtype`` when given), optionally under bf16 autocast, and its backward of a
    random output gradient: (output, xin, w, b, that gradient)."""
    import torch

    xin = x.to(dtype).detach().requires_grad_(input_grad)
    w, b = (p.detach().clone().to(weights_dtype or p.dtype).requires_grad_(True)
            for p in (conv.weight, conv.bias))
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        y = layer(xin, w, b)
    g = torch.randn(y.shape, device=y.device, dtype=torch.float32)
    (y.float() * g).sum().backward()
    return y, xin, w, b, g


def accuracy(x, conv, pool: int, dtype, autocast: bool = False, kernel=None) -> dict:
    """Fused stem (launched as ``kernel``, a StemKernel; None: its default) against the
    published layers in float64, input cast to ``dtype``, optionally under bf16 autocast
    (output in bf16, as in training)."""
    from lartpc.models.fused_stem import default_kernel, fused_stem

    kernel = kernel or default_kernel()
    y, xin, w, b, g = _run(
        lambda xin, w, b: fused_stem(xin, w, b, pool, conv.padding[0], kernel=kernel),
        x, conv, dtype, autocast, input_grad=False)
    return {**_precision(dtype, autocast),
            "block": kernel.block, "num_warps": kernel.num_warps, "sums": kernel.sums,
            "kernel": str(kernel), **_errors(y, xin, w, b, _reference(xin, conv, pool, g))}


def library_accuracy(x, conv, pool: int, dtype, autocast: bool = False,
                     stage: int = 1) -> dict:
    """The published layers themselves (F.conv2d, ELU, max-pool; the study's training
    path) in ``dtype`` (weights too: a model in that type) or under bf16 autocast, against
    the same float64 reference as the fused rows of ``stage``: how far the library is
    from the exact function at the precision it trains in. ``fastest_kernels`` accepts a
    fused way that is no further (``way``: ``library`` marks these rows)."""
    import torch.nn.functional as F

    def layers(xin, w, b):
        return F.max_pool2d(F.elu(F.conv2d(xin, w, b, padding=conv.padding[0])), pool)

    y, xin, w, b, g = _run(layers, x, conv, dtype, autocast, input_grad=stage == 2,
                           weights_dtype=dtype)
    rounding = _stage2_rounding(dtype, autocast) if stage == 2 else None
    return {"way": "library", **_precision(dtype, autocast),
            **_errors(y, xin, w, b, _reference(xin, conv, pool, g, rounding))}


def training_step(model, xc, labels, loss_fn):
    """One training step's forward and backward under bf16 autocast, to be timed."""
    import torch

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(xc.device.type, dtype=torch.bfloat16):
            loss = loss_fn(model.forward_tensor(xc), labels)
        loss.backward()

    return step


def stage_timers(model, k: int, xin):
    """Stage ``k`` of ``model`` on ``xin`` under bf16 autocast, to be timed: its forward
    alone, and forward + backward of a fixed random gradient (into ``xin`` too when it
    requires one)."""
    import torch

    def autocast():
        return torch.autocast(xin.device.type, dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad(), autocast():
            return model.stage(k, xin)

    grad = torch.randn_like(fwd())

    def fb():
        model.zero_grad(set_to_none=True)
        xin.grad = None
        with autocast():
            out = model.stage(k, xin)
        out.backward(grad)

    return fwd, fb


def timings(x, labels, size: int, configs: list, repeats: int, device) -> list[dict]:
    """The stem alone and the whole step with the library stem, then with the fused one
    launched as each of ``configs`` (StemKernels)."""
    import torch

    from lartpc.models import build
    from lartpc.models.losses import build_loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loss_fn = build_loss("ce")
    rows = []
    for kernel in [None, *configs]:
        stem = "library" if kernel is None else "fused"
        torch.manual_seed(0)
        model = build("jishnet", image_size=(size, size), channels_last=True,
                      elu_after_pool=True, stem=stem,
                      stem_kernel=str(kernel) if kernel else "").to(device)
        xc = x.contiguous(memory_format=torch.channels_last)
        stem_fwd, stem_fb = stage_timers(model, 0, xc)
        step = training_step(model, xc, labels, loss_fn)
        step_ms = median_ms(step, repeats, sync)
        rows.append({"stem": stem, "kernel": str(kernel) if kernel else None,
                     "block": kernel and kernel.block, "num_warps": kernel and kernel.num_warps,
                     "sums": kernel and kernel.sums,
                     "stem_forward_ms": median_ms(stem_fwd, repeats, sync),
                     "stem_forward_backward_ms": median_ms(stem_fb, repeats, sync),
                     "step_ms": step_ms,
                     "images_per_s": round(x.shape[0] / step_ms * 1e3, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def stage2_accuracy(x, conv, pool: int, dtype, autocast: bool = False, kernel=None) -> dict:
    """Fused second stage (launched as ``kernel``, a Stage2Kernel; None: its default)
    against the published layers in float64, on input ``x`` (B, 10, H, W) cast to
    ``dtype``, optionally under bf16 autocast."""
    import lartpc.models.fused_stage2 as fs2

    kernel = kernel or fs2.default_kernel()
    y, xin, w, b, g = _run(
        lambda xin, w, b: fs2.fused_stage(xin, w, b, pool, conv.padding[0], kernel=kernel),
        x, conv, dtype, autocast, input_grad=True)
    rounding = _stage2_rounding(dtype, autocast)
    return {**_precision(dtype, autocast),
            "block": kernel.block, "num_warps": kernel.num_warps, "block_k": kernel.block_k,
            "backward": kernel.backward, "vec": kernel.vec, "kernel": str(kernel),
            **_errors(y, xin, w, b, _reference(xin, conv, pool, g, rounding))}


def stage2_timings(x, labels, size: int, configs: list, repeats: int, device,
                   stem_kernel: str = "") -> list[dict]:
    """The second stage alone and the whole step (bf16 autocast, channels_last, ELU after
    pool, fused stem launched as ``stem_kernel``), with the library's second stage and
    the fused one launched as each of ``configs`` (Stage2Kernels)."""
    import torch

    from lartpc.models import build
    from lartpc.models.losses import build_loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loss_fn = build_loss("ce")
    rows = []
    for kernel in [None, *configs]:
        stage2 = "library" if kernel is None else "fused"
        torch.manual_seed(0)
        model = build("jishnet", image_size=(size, size), channels_last=True,
                      elu_after_pool=True, stem="fused", stage2=stage2,
                      stem_kernel=stem_kernel,
                      stage2_kernel=str(kernel) if kernel else "").to(device)
        xc = x.contiguous(memory_format=torch.channels_last)

        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            x2 = model.stage(0, xc).detach().requires_grad_(True)  # the stage's input
        fwd, fb = stage_timers(model, 1, x2)
        step = training_step(model, xc, labels, loss_fn)
        step_ms = median_ms(step, repeats, sync)
        rows.append({"stem": "fused", "stem_kernel": stem_kernel or None, "stage2": stage2,
                     "kernel": str(kernel) if kernel else None,
                     "block": kernel and kernel.block,
                     "num_warps": kernel and kernel.num_warps,
                     "block_k": kernel and kernel.block_k,
                     "backward": kernel and kernel.backward, "vec": kernel and kernel.vec,
                     "stage2_forward_ms": median_ms(fwd, repeats, sync),
                     "stage2_forward_backward_ms": median_ms(fb, repeats, sync),
                     "step_ms": step_ms,
                     "images_per_s": round(x.shape[0] / step_ms * 1e3, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def parse_configs(text: str, stage: int) -> list:
    """``--configs``: comma-separated StemKernels (stage 1) or Stage2Kernels (stage 2),
    as :mod:`lartpc.models.kernel_settings` spells them; a ConfigError names the one at
    fault."""
    from lartpc.models.kernel_settings import parse_stage2_kernel, parse_stem_kernel

    parse = parse_stem_kernel if stage == 1 else parse_stage2_kernel
    return [parse(c, "--configs") for c in text.split(",")]


def stage2_main(args, x, labels, device) -> int:
    """``--stage 2``: accuracy and timings of the fused second stage."""
    import torch

    import lartpc.models.fused_stage2 as fs2
    from lartpc.models import build
    from lartpc.models.kernel_settings import BACKWARDS

    configs = args.parsed_configs
    torch.manual_seed(1)
    with torch.no_grad():  # the second stage's real input: the events through the stem
        x2 = build("jishnet", image_size=x.shape[2:]).to(device).stage(0, x)
    conv = torch.nn.Conv2d(x2.shape[1], 64, 5, padding=2).to(device)
    result = {"stage": 2, "size": args.size, "batch_per_rank": args.batch_per_rank,
              "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "accuracy": []}
    import dataclasses
    from functools import partial

    # every backward (and with the forward's channels padded where a timed launch pads
    # them), then the published layers' own rows
    kinds = [(b, False) for b in BACKWARDS] + sorted(
        {(k.backward, True) for k in configs if k.vec}, key=lambda bv: BACKWARDS.index(bv[0]))
    ways = [partial(stage2_accuracy,
                    kernel=dataclasses.replace(fs2.default_kernel(), backward=b, vec=vec))
            for b, vec in kinds] + [partial(library_accuracy, stage=2)]
    for way in ways:
        for dt, autocast in _precisions():
            result["accuracy"].append(way(x2, conv, 5, dt, autocast))
            print(json.dumps(result["accuracy"][-1]), file=sys.stderr, flush=True)
    result["timings"] = stage2_timings(x, labels, args.size, configs, args.repeats, device,
                                       args.stem_kernel)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stage2-check.json").write_text(json.dumps(result, indent=2))
    print("| stage 2 | block | warps | block_k | backward | stage 2 fwd ms | "
          "stage 2 fwd+bwd ms | step ms | images/s |")
    for r in result["timings"]:
        print(f"| {r['stage2']} | {r['block']} | {r['num_warps']} | {r['block_k']} | "
              f"{r['backward']} | "
              f"{r['stage2_forward_ms']} | {r['stage2_forward_backward_ms']} | "
              f"{r['step_ms']} | {r['images_per_s']} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", type=int, default=3600)
    add_batch_per_rank(ap)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--stage", type=int, default=1, choices=(1, 2),
                    help="1: the fused stem (default); 2: the fused second stage")
    ap.add_argument("--configs", default=None,
                    help="stage 1: BLOCK:WARPS[:d|:b|:p|:h] of the fused stem to time (how the "
                         "taps are summed: dot, band, patch, hoist; default "
                         f"{STEM_CONFIGS}); stage 2: "
                         "BLOCK:WARPS:BLOCK_K[:i|:m|:t[:v]] (the igrad, map or triton backward, "
                         "the forward's channels padded; "
                         f"default {STAGE2_CONFIGS})")
    ap.add_argument("--stem-kernel", default="", metavar="BLOCK:WARPS[:SUMS]",
                    help="stage 2: the fused stem's launch in the timed steps (default: "
                         "its own)")
    args = ap.parse_args(argv)
    if args.configs is None:
        args.configs = STEM_CONFIGS if args.stage == 1 else STAGE2_CONFIGS
    from lartpc.errors import ConfigError

    try:  # parsed before any event is made
        args.parsed_configs = parse_configs(args.configs, args.stage)
        if args.stem_kernel:
            parse_configs(args.stem_kernel, 1)
    except ConfigError as e:
        ap.error(str(e))
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    x, labels = _events(args.size, args.batch_per_rank, seed=0)
    x, labels = x.to(device), labels.to(device)
    if args.stage == 2:
        return stage2_main(args, x, labels, device)
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(1, 10, 5, padding=2).to(device)
    result = {"size": args.size, "batch_per_rank": args.batch_per_rank,
              "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__,
              "accuracy": []}
    import dataclasses
    from functools import partial

    from lartpc.models.fused_stem import default_kernel
    from lartpc.models.kernel_settings import STEM_SUMS

    # every way of summing the taps that a timed launch uses, then the published
    # layers' own rows
    ways = [partial(accuracy, kernel=dataclasses.replace(default_kernel(), sums=sums))
            for sums in STEM_SUMS if any(k.sums == sums for k in args.parsed_configs)]
    ways.append(library_accuracy)
    for way in ways:
        for dt, autocast in _precisions():
            result["accuracy"].append(way(x, conv, 5, dt, autocast))
            print(json.dumps(result["accuracy"][-1]), file=sys.stderr, flush=True)
    result["timings"] = timings(x, labels, args.size, args.parsed_configs, args.repeats,
                                device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stem-check.json").write_text(json.dumps(result, indent=2))
    print("| stem | block | warps | sums | stem fwd ms | stem fwd+bwd ms | step ms | images/s |")
    for r in result["timings"]:
        print(f"| {r['stem']} | {r['block']} | {r['num_warps']} | {r['sums']} | "
              f"{r['stem_forward_ms']} | "
              f"{r['stem_forward_backward_ms']} | {r['step_ms']} | {r['images_per_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
