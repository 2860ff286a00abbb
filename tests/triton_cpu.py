"""What the fused-kernel tests share: Triton's CPU interpreter switched on where there
is no GPU (before anything imports Triton, so import this module first) and images of
generated events to run the kernels on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def event_images(n: int, downsample: int, seed: int = 7) -> torch.Tensor:
    """(n, 1, H, W) float32 images of generated events (mostly empty, as real ones)."""
    from lartpc.geometry import Geometry
    from lartpc.sim import simulate_event

    g = Geometry(downsample=downsample)
    dense = np.stack([simulate_event(i, seed, g).dense(g.shape) for i in range(n)])
    return torch.from_numpy(dense)[:, None].to(DEVICE)


#: Adam's learning rate and steps in :func:`train_both_ways`
LR, STEPS = 1e-3, 2


def train_both_ways(x: torch.Tensor, labels: torch.Tensor, fused: tuple[str, ...], **options):
    """Two Adam steps of JishNet (built with ``options``) on ``x`` from the same initial
    weights, once with the published layers and once with the model options named in
    ``fused`` (``stem``, ``stage2``) set to ``fused``: per way, the first step's gradients
    and the final state dict."""
    import torch.nn.functional as F

    from lartpc.models import build

    grads, params = {}, {}
    for way in ("library", "fused"):
        torch.manual_seed(0)
        model = build("jishnet", image_size=x.shape[2:],
                      **{k: way for k in fused}, **options).to(DEVICE)
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        for step in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(model.forward_tensor(x), labels).backward()
            if step == 0:
                grads[way] = {k: p.grad.clone() for k, p in model.named_parameters()}
            opt.step()
        params[way] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return grads, params


#: a first-step gradient below this fraction of its layer's largest (in either way) is
#: within float32 rounding of zero: the two ways' gradients differ by up to 1.8e-6 of a
#: layer's largest (measured on +sim4 events, whose gradients reach ~12; an element of
#: 4.8e-6 against 4.1e-6 in a layer reaching 4.9, 1e-6 of it, then stepped Adam apart
#: by 7.6e-5). 31 % of the elements fall below it, 29 % being exactly zero both ways
NEAR_ZERO = 3e-6


def assert_trained_alike(grads: dict, params: dict, x: torch.Tensor, moved: str) -> None:
    """What :func:`train_both_ways` returned: every first-step gradient agrees to 1e-5
    (relative norm); the parameters end equal (the stem's to 1e-6, the rest to 5e-5)
    wherever both ways' first gradient is at least :data:`NEAR_ZERO` of its layer's
    largest; and the steps moved
    ``moved`` (so the comparison is not of initial weights).

    Where a gradient is within rounding of zero, two correct float32 computations can
    give it opposite signs (seen on an AMD EPYC host: 4.5e-10 against -8.7e-10, one of
    the third stage's 131,072 weights), and Adam's normalised step lr g / (|g| + eps)
    turns that into steps of different size and sign: there the two may differ by no
    more than Adam can move a weight, lr per step each way."""
    from lartpc.models import build

    assert params["library"].keys() == params["fused"].keys()  # same checkpoints
    for k, g in grads["library"].items():
        assert float((grads["fused"][k] - g).norm() / g.norm()) < 1e-5, k
    for k, v in params["library"].items():
        tol = 1e-6 if k.startswith("convs.0.") else 5e-5
        diff = (params["fused"][k] - v).abs()
        if k in grads["library"]:
            a, b = grads["library"][k].abs(), grads["fused"][k].abs()
            near = NEAR_ZERO * float(max(a.max(), b.max()))
            tiny = (a < near) | (b < near)
            assert not tiny.any() or float(diff[tiny].max()) <= 2 * LR * STEPS, k
            diff = diff[~tiny]
        assert diff.numel() == 0 or float(diff.max()) <= tol, (k, float(diff.max()))
    torch.manual_seed(0)
    init = build("jishnet", image_size=x.shape[2:]).state_dict()[moved]
    assert (params["fused"][moved].cpu() - init).abs().max() > 1.5e-3


#: the head of a script that compiles Triton kernels for sm_90 (an H100/H200) without a
#: GPU, as a launch there would: ``build(fn, pointers, consts, *label, warps=4)`` prints
#: the kernel's name, the label and its registers and spilled bytes a thread
_SM90_BUILD = textwrap.dedent("""
    from lartpc.jobs.local.sass_loops import cuobjdump, sm90_cubin

    def build(fn, pointers, consts, *label, warps=4, aligned=()):
        usage = cuobjdump(sm90_cubin(fn, pointers, consts, warps, aligned), "-res-usage")
        print(fn.__name__, *label, [w for w in usage.split() if w.startswith(("REG:", "STACK:"))])
""")


def compile_for_sm90(body: str) -> list[str]:
    """The lines ``body`` prints after :data:`_SM90_BUILD`, run in a fresh interpreter
    without ``TRITON_INTERPRET`` (the interpreter runs no GPU compiler); skips where
    Triton has no bundled ptxas."""
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not os.path.exists(os.path.join(bin_dir, "ptxas")):
        pytest.skip("this Triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _SM90_BUILD + textwrap.dedent(body)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()
