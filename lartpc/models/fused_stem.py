"""JishNet's first stage (conv 1->C, k x k + bias + ELU + max-pool) as one Triton kernel.

The published layers write the C x H x W convolution map (259 MB per 3600 x 3600 image
in bf16) and read it back twice (ELU, pool); on an H200 that stage took 44.6 of a 52 ms
training step (docs/results, BENCHMARKS). Here each program computes a block of pooled
outputs for all channels at once: for every pooling-window position the k x k taps are
accumulated in float32 from the input (any of float32 / bfloat16 / float16), the
window's maximum and its position are kept, and only ``ELU(max)`` (C x H/p x W/p) and the
position (one byte) are written. The backward needs the input only at each window's
arg-max pixel, so the weight and bias gradients are one gather per tap (each an offset
from the arg-max's first tap, unchecked in blocks whose windows lie inside the image); partial sums
per program are written out and summed by torch, so the result does not depend on
scheduling (no atomics). The input gets no gradient (it is the event image).

Same function as ``max_pool2d(elu(conv2d(x)))``: ELU is increasing, so the pool's
arg-max is the convolution's. Ties go to the first window position in row-major order,
as in torch's max-pool; the two differ only where rounding differs (this kernel sums
the taps in its own order, in float32; autocast's conv sums bf16 products), or where
ELU saturates (for x < about -17 in float32 ``elu(x) == -1`` exactly, so torch's pool
takes the first of such a window while this kernel takes the true maximum; the
gradient there is ``exp(x) < 1e-7`` either way). A NaN wins its window and stays NaN
(torch's CUDA max-pool does the same; its CPU kernel was seen to drop it).

With ``skip_empty`` (``model.stem_skip_empty``, off by default) a program whose pooled
outputs have no charge under any of their windows (:func:`occupancy`, one max-pool of
the input's non-zero mask) writes ``ELU(bias)`` and the first position without
computing, and its backward adds only the bias term: the same numbers bit for bit, but
a first layer that exploits the images' emptiness, so not the study's dense baseline.

Imports Triton at import time: import this module only where the fused stem was asked
for (:mod:`lartpc.models.jishnet` does). On CPU tensors it runs under Triton's
interpreter (``TRITON_INTERPRET=1`` set before this module is imported), which the
tests use.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lartpc.models.kernel_settings import STEM_SUMS, StemKernel

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
#: pooled outputs per program (of the flattened image, row, column order) and warps per
#: program, the fastest of those timed on an H200 (BENCHMARKS.md, 2026-11-28: 64 x 4 with
#: SUMS=dot); the interpreter, slow per operation, is quicker with large blocks. A run may set
#: its own (``model.stem_kernel``, :mod:`lartpc.models.kernel_settings`).
BLOCK = 4096 if _INTERPRETED else 64
NUM_WARPS = 4
#: how a window's taps are summed (``kernel_settings.STEM_SUMS``): ``taps`` one by one;
#: on a GPU's matrix units, ``dot`` gathers each window position's k x k taps and
#: multiplies them by the (taps, channels) weights (the stem 4.7 against 5.4 ms on the
#: H200, its weight gradient under bf16 autocast 2.8e-2 from float64 against the
#: published layers' own 6.3e-2; BENCHMARKS.md); ``band`` gathers the k input rows under
#: each row of window positions once (k x (k + pool - 1) pixels) and multiplies them by
#: one shifted weight table per column position; ``patch`` gathers the whole
#: (k + pool - 1)^2 patch under a pooling window once and multiplies it by one table per
#: window position. Per pooled output at k = pool = 5 they load 625, 225 and 81 input
#: pixels for 25 x 32, 25 x 64 and 25 x 128 taps' products. ``hoist`` is ``dot`` with
#: each tap's address and mask computed once per block instead of once per window
#: position, and no bounds checks in blocks whose windows lie inside the image (about
#: ten integer operations an input pixel fewer; written after the second lease of
#: 2026-11-28, not yet timed on a GPU). ``taps`` under the interpreter, whose tests
#: check the others explicitly
SUMS = "taps" if _INTERPRETED else "dot"
_SUMS_CODE = {name: code for code, name in enumerate(STEM_SUMS)}  # the kernel's SUMS


def default_kernel() -> StemKernel:
    """The launch ``model.stem_kernel=""`` means: this module's settings as they are now."""
    return StemKernel(BLOCK, NUM_WARPS, SUMS)


def tile_taps(k: int, pool: int, sums: str) -> int:
    """Taps in a gathered tile (the kernel's ``KP``): a window position's k x k for
    ``dot`` (and the per-tap weights' row), the k x (k + pool - 1) band or the whole
    (k + pool - 1)^2 patch, as a power of two of at least the matrix units' 16."""
    s = k + pool - 1
    return max(16, triton.next_power_of_2({"band": k * s, "patch": s * s}.get(sums, k * k)))


_TAPS: dict = {}


def tap_table(w2: torch.Tensor, k: int, pool: int, sums: str, kp: int, cp: int) -> torch.Tensor:
    """The weights as ``band`` and ``patch`` multiply them: (entries, kp, cp) float32.

    Tap ``t`` of a gathered tile is input row ``t // s``, column ``t % s`` (s = k +
    pool - 1) from the tile's corner; entry ``e`` is window position ``(dy, dx)`` =
    ``divmod(e, pool)`` for ``patch`` (the tile's corner is the pooling window's) and
    column ``dx = e`` for ``band`` (its corner is row ``dy`` of the window: every row
    uses the same table). Its value is ``w2[c, (ty - dy) * k + (tx - dx)]`` where that
    tap lies in the k x k kernel, else 0; padding taps and channels are 0.
    """
    s = k + pool - 1
    key = (k, pool, sums, str(w2.device))
    if key not in _TAPS:
        shifts = pool if sums == "patch" else 1
        dy = torch.arange(shifts).repeat_interleave(pool)
        dx = torch.arange(pool).repeat(shifts)
        t = torch.arange((s if sums == "patch" else k) * s)
        ky, kx = (t // s)[None, :] - dy[:, None], (t % s)[None, :] - dx[:, None]
        inside = (ky >= 0) & (ky < k) & (kx >= 0) & (kx < k)
        _TAPS[key] = (torch.where(inside, ky * k + kx, 0).to(w2.device),
                      inside[..., None].to(w2.device))
    tap, inside = _TAPS[key]
    c = w2.shape[0]
    table = torch.zeros((tap.shape[0], kp, cp), dtype=torch.float32, device=w2.device)
    table[:, :tap.shape[1], :c] = torch.where(inside, w2.t()[tap], 0.0)
    return table


@triton.jit
def elu(v):
    # expm1 is not in Triton's core language: exp(v) - 1 loses relative precision
    # near 0, so a cubic Taylor step there (its error < v^4 / 24 < 5e-10)
    small = v * (1.0 + v * (0.5 + v * (1.0 / 6.0)))
    neg = tl.where(v > -0.01, small, tl.exp(tl.minimum(v, 0.0)) - 1.0)
    return tl.where((v > 0) | (v != v), v, neg)  # NaN stays NaN


@triton.jit
def pooled_block(N, HO, WO, C: tl.constexpr, CP: tl.constexpr, BLOCK: tl.constexpr):
    """This program's BLOCK consecutive pooled outputs of the flattened (image, row,
    column) order: in-range mask, image, row, column; the channels and their mask."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.arange(0, CP)
    return p < N, (p // (HO * WO)).to(tl.int64), (p // WO) % HO, p % WO, c, c < C


@triton.jit
def _window(x_img, w_ptr, bias, top, left, pm, c, cm, H, W, CP: tl.constexpr,
            K: tl.constexpr, BLOCK: tl.constexpr):
    """The convolution (+ bias) at one window position: (BLOCK, CP) in float32."""
    acc = tl.zeros((BLOCK, CP), tl.float32)
    for ky in tl.static_range(K):
        r = top + ky
        row_ok = pm & (r >= 0) & (r < H)
        for kx in tl.static_range(K):
            s = left + kx
            xv = tl.load(x_img + r * W + s, mask=row_ok & (s >= 0) & (s < W),
                         other=0.0).to(tl.float32)
            wv = tl.load(w_ptr + c * (K * K) + (ky * K + kx), mask=cm, other=0.0)
            acc += xv[:, None] * wv[None, :]
    return acc + bias[None, :]


@triton.jit
def take_max(v, d, best, arg):
    """Keep the running maximum and its window position (the first of ties; NaN wins)."""
    take = (v > best) | (v != v)
    return tl.where(take, v, best), tl.where(take, d, arg)


@triton.jit
def store_pooled(y_ptr, arg_ptr, best, arg, pm, cm, b, i, j, c, C, HO, WO,
                 sy_b, sy_c, sy_h, sy_w):
    """Write the pooled outputs, ELU of each window's maximum, and their window
    positions (uint8, (N, C, HO, WO) contiguous)."""
    m2 = pm[:, None] & cm[None, :]
    y_off = (b * sy_b + i * sy_h + j * sy_w)[:, None] + c[None, :] * sy_c
    tl.store(y_ptr + y_off, elu(best).to(y_ptr.dtype.element_ty), mask=m2)
    a_off = (b * C * HO * WO + i * WO + j)[:, None] + c[None, :] * (HO * WO)
    tl.store(arg_ptr + a_off, arg.to(tl.uint8), mask=m2)


@triton.jit
def pooled_gradient(g_ptr, y_ptr, arg_ptr, pm, cm, b, i, j, c, C, HO, WO,
                    sg_b, sg_c, sg_h, sg_w, sy_b, sy_c, sy_h, sy_w):
    """What a backward needs of each pooled output: the mask, the gradient at its
    window's arg-max before ELU (float32) and that arg-max's window position (int32)."""
    m2 = pm[:, None] & cm[None, :]
    g = tl.load(g_ptr + (b * sg_b + i * sg_h + j * sg_w)[:, None] + c[None, :] * sg_c,
                mask=m2, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + (b * sy_b + i * sy_h + j * sy_w)[:, None] + c[None, :] * sy_c,
                mask=m2, other=0.0).to(tl.float32)
    # ELU's derivative from its output, as torch's in-place ELU computes it
    dm = tl.where(y > 0, g, g * (y + 1.0))
    a = tl.load(arg_ptr + (b * C * HO * WO + i * WO + j)[:, None] + c[None, :] * (HO * WO),
                mask=m2, other=0).to(tl.int32)
    return m2, dm, a


@triton.jit
def _gather(x_img, top, left, pm, t, NT, S, H, W):
    """The input under each of BLOCK positions as a (BLOCK, len(t)) float32 tile: tap
    ``t`` is row ``t // S``, column ``t % S`` from (top, left); taps past ``NT`` and
    pixels outside the image are 0."""
    r = top[:, None] + (t // S)[None, :]
    s = left[:, None] + (t % S)[None, :]
    m = pm[:, None] & (t < NT)[None, :] & (r >= 0) & (r < H) & (s >= 0) & (s < W)
    return tl.load(x_img[:, None] + r * W + s, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _table(w_ptr, e, t, c, KP: tl.constexpr, CP: tl.constexpr):
    """Entry ``e`` of a band's or patch's weight table (:func:`tap_table`): (KP, CP)."""
    return tl.load(w_ptr + e * (KP * CP) + t[:, None] * CP + c[None, :])


@triton.jit
def _matmul(a, w, LOWP: tl.constexpr):
    """(BLOCK, KP) @ (KP, CP) on the matrix units: TF32 where the output or input is
    half precision (as autocast's convolution, which rounds to bf16), float32 else."""
    if LOWP:
        return tl.dot(a, w, input_precision="tf32")
    return tl.dot(a, w, input_precision="ieee")


@triton.jit
def _inside(pm, top, left, H, W, REACH: tl.constexpr):
    """Whether every pixel of every window of the block lies in the image: the windows'
    corners (``top``, ``left``, for the block's outputs in ``pm``) and up to ``REACH``
    pixels past them."""
    return (tl.min(tl.where(pm, top, 0)) >= 0) & (tl.min(tl.where(pm, left, 0)) >= 0) \
        & (tl.max(tl.where(pm, top, 0)) + REACH < H) & (tl.max(tl.where(pm, left, 0)) + REACH < W)


@triton.jit
def _busy(occ_ptr, pm, BLOCK: tl.constexpr):
    """Whether any of this program's pooled outputs has charge under its windows
    (``occ_ptr``: :func:`occupancy`, flattened as the outputs)."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    return tl.max((tl.load(occ_ptr + p, mask=pm, other=0.0) != 0).to(tl.int32)) > 0


@triton.jit
def _stem_forward(x_ptr, w_ptr, b_ptr, y_ptr, arg_ptr, occ_ptr, N, H, W, HO, WO,
                  sy_b, sy_c, sy_h, sy_w,
                  C: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr,
                  POOL: tl.constexpr, BLOCK: tl.constexpr, SUMS: tl.constexpr,
                  KP: tl.constexpr, LOWP: tl.constexpr, SKIP: tl.constexpr):
    pm, b, i, j, c, cm = pooled_block(N, HO, WO, C, CP, BLOCK)
    bias = tl.load(b_ptr + c, mask=cm, other=0.0)
    # without SKIP a constant: the branch below is then decided when compiling
    busy = _busy(occ_ptr, pm, BLOCK) if SKIP else True
    if busy:
        best, arg = _pooled_windows(x_ptr, w_ptr, bias, pm, b, i, j, c, cm, H, W, CP, K, PAD,
                                    POOL, BLOCK, SUMS, KP, LOWP)
    else:
        # no charge under any window: each position's convolution is the bias exactly,
        # as the sums find it, and the first position wins the tie
        best = tl.zeros((BLOCK, CP), tl.float32) + bias[None, :]
        arg = tl.zeros((BLOCK, CP), tl.int32)
    store_pooled(y_ptr, arg_ptr, best, arg, pm, cm, b, i, j, c, C, HO, WO,
                 sy_b, sy_c, sy_h, sy_w)


@triton.jit
def _pooled_windows(x_ptr, w_ptr, bias, pm, b, i, j, c, cm, H, W, CP: tl.constexpr,
                    K: tl.constexpr, PAD: tl.constexpr, POOL: tl.constexpr,
                    BLOCK: tl.constexpr, SUMS: tl.constexpr, KP: tl.constexpr,
                    LOWP: tl.constexpr):
    """Every window position's convolution (+ bias) of the block's pooled outputs, as
    ``SUMS`` sums the taps: the maximum and its position, (BLOCK, CP) each."""
    x_img = x_ptr + b * H * W
    top = i * POOL - PAD
    left = j * POOL - PAD
    best = tl.full((BLOCK, CP), float("-inf"), tl.float32)
    arg = tl.zeros((BLOCK, CP), tl.int32)
    t = tl.arange(0, KP)  # the taps of a gathered tile (unused by the per-tap sums)
    # window positions in row-major order, torch's tie order
    if SUMS == 1:  # dot
        # the 25 taps of all BLOCK positions gathered as a (BLOCK, KP) tile and
        # multiplied by the (KP, CP) weights; with a half-precision output or input
        # (autocast) on the matrix units in TF32, which holds bf16/fp16 input exactly
        # and rounds the weights to 10 bits (autocast's convolution rounds both to bf16)
        tm = t < K * K
        wt = tl.load(w_ptr + c[None, :] * (K * K) + t[:, None], mask=tm[:, None] & cm[None, :],
                     other=0.0)
        for d in range(POOL * POOL):
            a = _gather(x_img, top + d // POOL, left + d % POOL, pm, t, K * K, K, H, W)
            v = _matmul(a, wt, LOWP) + bias[None, :]
            best, arg = take_max(v, d, best, arg)
    elif SUMS == 4:  # hoist: dot's tiles, each tap's address and mask made once
        tm = t < K * K
        wt = tl.load(w_ptr + c[None, :] * (K * K) + t[:, None], mask=tm[:, None] & cm[None, :],
                     other=0.0)
        r0 = top[:, None] + (t // K)[None, :]  # the first window position's rows, columns
        s0 = left[:, None] + (t % K)[None, :]
        at = x_img[:, None] + r0 * W + s0
        m0 = pm[:, None] & tm[None, :]
        # inside: a position's tile is one load at a fixed offset with the same mask
        # (most blocks); the blocks on the image's edges check each pixel as dot does
        if _inside(pm, top, left, H, W, POOL + K - 2):
            for d in range(POOL * POOL):
                a = tl.load(at + ((d // POOL) * W + d % POOL), mask=m0,
                            other=0.0).to(tl.float32)
                v = _matmul(a, wt, LOWP) + bias[None, :]
                best, arg = take_max(v, d, best, arg)
        else:
            for d in range(POOL * POOL):
                r = r0 + d // POOL
                q = s0 + d % POOL
                m = m0 & (r >= 0) & (r < H) & (q >= 0) & (q < W)
                a = tl.load(at + ((d // POOL) * W + d % POOL), mask=m,
                            other=0.0).to(tl.float32)
                v = _matmul(a, wt, LOWP) + bias[None, :]
                best, arg = take_max(v, d, best, arg)
    elif SUMS == 2:  # band: the K input rows under each window row, gathered once
        for dy in range(POOL):
            a = _gather(x_img, top + dy, left, pm, t, K * (K + POOL - 1), K + POOL - 1, H, W)
            for dx in range(POOL):
                v = _matmul(a, _table(w_ptr, dx, t, c, KP, CP), LOWP) + bias[None, :]
                best, arg = take_max(v, dy * POOL + dx, best, arg)
    elif SUMS == 3:  # patch: the whole input patch under the pooling window, gathered once
        a = _gather(x_img, top, left, pm, t, (K + POOL - 1) * (K + POOL - 1), K + POOL - 1,
                    H, W)
        for d in range(POOL * POOL):
            v = _matmul(a, _table(w_ptr, d, t, c, KP, CP), LOWP) + bias[None, :]
            best, arg = take_max(v, d, best, arg)
    else:  # taps, one by one
        for d in range(POOL * POOL):
            v = _window(x_img, w_ptr, bias, top + d // POOL, left + d % POOL, pm, c, cm, H, W,
                        CP, K, BLOCK)
            best, arg = take_max(v, d, best, arg)
    return best, arg


@triton.jit
def _stem_backward(x_ptr, g_ptr, y_ptr, arg_ptr, occ_ptr, part_ptr, N, H, W, HO, WO,
                   sg_b, sg_c, sg_h, sg_w, sy_b, sy_c, sy_h, sy_w,
                   C: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr,
                   POOL: tl.constexpr, BLOCK: tl.constexpr, SKIP: tl.constexpr):
    pm, b, i, j, c, cm = pooled_block(N, HO, WO, C, CP, BLOCK)
    m2, dm, a = pooled_gradient(g_ptr, y_ptr, arg_ptr, pm, cm, b, i, j, c, C, HO, WO,
                                sg_b, sg_c, sg_h, sg_w, sy_b, sy_c, sy_h, sy_w)
    out = part_ptr + tl.program_id(0).to(tl.int64) * ((K * K + 1) * CP)
    tl.store(out + (K * K) * CP + c, tl.sum(dm, axis=0))
    busy = _busy(occ_ptr, pm, BLOCK) if SKIP else True  # as the forward's
    if busy:
        _tap_partials(x_ptr, out, m2, dm, a, pm, b, i, j, c, H, W, CP, K, PAD, POOL)
    else:  # no charge under any window: every tap's product is 0
        for t in tl.static_range(K * K):
            tl.store(out + t * CP + c, tl.zeros((CP,), tl.float32))


@triton.jit
def _tap_partials(x_ptr, out, m2, dm, a, pm, b, i, j, c, H, W, CP: tl.constexpr,
                  K: tl.constexpr, PAD: tl.constexpr, POOL: tl.constexpr):
    """The block's weight-gradient partial sums, tap by tap, into ``out``: the input at
    each arg-max's tap times the gradient there (``dm``)."""
    r0 = (i * POOL - PAD)[:, None] + a // POOL
    s0 = (j * POOL - PAD)[:, None] + a % POOL
    at = x_ptr + (b * H * W)[:, None] + r0 * W + s0  # each arg-max's first tap
    # as the forward's hoist: a tap is one offset from the arg-max's first, and blocks
    # whose windows lie inside the image need no bounds checks
    if _inside(pm, i * POOL - PAD, j * POOL - PAD, H, W, POOL + K - 2):
        for ky in tl.static_range(K):
            for kx in tl.static_range(K):
                xv = tl.load(at + (ky * W + kx), mask=m2, other=0.0).to(tl.float32)
                tl.store(out + (ky * K + kx) * CP + c, tl.sum(xv * dm, axis=0))
    else:
        for ky in tl.static_range(K):
            r = r0 + ky
            row_ok = (r >= 0) & (r < H)
            for kx in tl.static_range(K):
                s = s0 + kx
                xv = tl.load(at + (ky * W + kx), mask=m2 & row_ok & (s >= 0) & (s < W),
                             other=0.0).to(tl.float32)
                tl.store(out + (ky * K + kx) * CP + c, tl.sum(xv * dm, axis=0))


def occupancy(x3: torch.Tensor, k: int, pool: int, padding: int) -> torch.Tensor:
    """(B, H', W') in ``x3``'s dtype: 1 where some input pixel under a pooled output's
    windows (its (pool + k - 1)^2 receptive field) is not 0 (NaN counts), else 0."""
    span = pool + k - 1
    nz = x3.ne(0).to(x3.dtype)[:, None]
    if 2 * padding > span:  # max_pool2d pads no more than half its window
        nz, padding = F.pad(nz, (padding,) * 4), 0
    return F.max_pool2d(nz, span, pool, padding)[:, 0].contiguous()


def blocks_with_charge(x: torch.Tensor, weight: torch.Tensor, pool: int, padding: int,
                       kernel: StemKernel | None = None) -> float:
    """The share of the kernels' programs (blocks of ``kernel.block`` pooled outputs)
    that have charge under their windows: what ``skip_empty`` computes of ``x``
    (B, 1, H, W)."""
    b, h, w, c, k, ho, wo = _geometry(x, weight, pool, padding)
    block = (kernel or default_kernel()).block
    occ = occupancy(x.reshape(b, h, w), k, pool, padding).flatten().ne(0).float()
    return float(F.pad(occ, (0, -occ.numel() % block)).view(-1, block).amax(1).mean())


def _geometry(x: torch.Tensor, weight: torch.Tensor, pool: int, padding: int):
    b, cin, h, w = x.shape
    c, wcin, k, k2 = weight.shape
    if cin != 1 or wcin != 1 or k != k2:
        raise ValueError(f"fused stem: one input channel and a square kernel expected, got "
                         f"input {tuple(x.shape)}, weight {tuple(weight.shape)}")
    ho, wo = (h + 2 * padding - k + 1) // pool, (w + 2 * padding - k + 1) // pool
    if ho < 1 or wo < 1:
        raise ValueError(f"fused stem: input {h}x{w} too small for kernel {k}, pool {pool}")
    return b, h, w, c, k, ho, wo


class _FusedStem(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, pool: int, padding: int, out_dtype, channels_last,
                kernel: StemKernel, skip_empty: bool):
        block, warps, sums = kernel.block, kernel.num_warps, kernel.sums
        b, h, w, c, k, ho, wo = _geometry(x, weight, pool, padding)
        x3 = x.reshape(b, h, w).contiguous()
        w2 = weight.detach().reshape(c, k * k).float().contiguous()
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        y = torch.empty((b, c, ho, wo), dtype=out_dtype, device=x.device, memory_format=fmt)
        arg = torch.empty((b, c, ho, wo), dtype=torch.uint8, device=x.device)
        cp = triton.next_power_of_2(c)
        n = b * ho * wo
        grid = (triton.cdiv(n, block),)
        kp = tile_taps(k, pool, sums)
        if sums in ("band", "patch"):
            w2 = tap_table(w2, k, pool, sums, kp, cp)
        # the skip's occupancy; without the skip the kernels never read it (the input
        # stands in: a valid pointer of the same type)
        occ = occupancy(x3, k, pool, padding) if skip_empty else x3
        _stem_forward[grid](x3, w2, bias.detach().float().contiguous(), y, arg, occ, n, h, w,
                            ho, wo, *y.stride(), C=c, CP=cp, K=k, PAD=padding, POOL=pool,
                            BLOCK=block, SUMS=_SUMS_CODE[sums], KP=kp,
                            LOWP=x3.dtype != torch.float32 or out_dtype != torch.float32,
                            SKIP=skip_empty, num_warps=warps)
        ctx.save_for_backward(x3, y, arg, occ)
        ctx.geom = (pool, padding, c, k, cp, block, warps, grid, weight.dtype, bias.dtype,
                    skip_empty)
        return y

    @staticmethod
    def backward(ctx, gy):
        x3, y, arg, occ = ctx.saved_tensors
        pool, padding, c, k, cp, block, warps, grid, wdtype, bdtype, skip_empty = ctx.geom
        b, h, w = x3.shape
        ho, wo = y.shape[2:]
        part = torch.empty((grid[0], k * k + 1, cp), dtype=torch.float32, device=x3.device)
        _stem_backward[grid](x3, gy, y, arg, occ, part, b * ho * wo, h, w, ho, wo,
                             *gy.stride(), *y.stride(), C=c, CP=cp, K=k, PAD=padding,
                             POOL=pool, BLOCK=block, SKIP=skip_empty, num_warps=warps)
        total = part.sum(0)
        gw = total[: k * k, :c].t().reshape(c, 1, k, k).to(wdtype)
        return None, gw, total[k * k, :c].to(bdtype), None, None, None, None, None, None


@torch.compiler.disable
def fused_stem(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pool: int,
               padding: int, *, channels_last: bool = False,
               kernel: StemKernel | None = None, skip_empty: bool = False) -> torch.Tensor:
    """``elu(max_pool2d(conv2d(x, weight, bias, padding=padding), pool))`` in one kernel.

    Parameters
    ----------
    x : (B, 1, H, W) float32, bfloat16 or float16; gets no gradient (refused if it asks).
    weight, bias : the convolution's (C, 1, k, k) and (C,); read in float32.
    pool : max-pool size and stride (floor mode); padding : the convolution's.
    channels_last : write the output in NHWC memory order.
    kernel : the launch (``model.stem_kernel``); None: :func:`default_kernel`.
    skip_empty : blocks of pooled outputs with no charge under any of their windows
        (:func:`occupancy`) are not computed: their outputs are ``ELU(bias)``, arg-max
        the first position, their weight-gradient terms 0. The same numbers, bit for
        bit (where the upstream gradient is finite: 0 x inf is NaN in the sums skipped),
        but the dense network then exploits the image's emptiness in its first layer
        (``model.stem_skip_empty``; not the study's dense baseline).

    Returns
    -------
    (B, C, H', W') in autocast's dtype when autocast is on for ``x``'s device, else in
    ``x``'s dtype; accumulation is float32 either way.
    """
    if x.requires_grad:
        raise ValueError("fused stem: the input gets no gradient (it is the event image); "
                         "use model.stem=library where one is needed")
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    return _FusedStem.apply(x, weight, bias, pool, padding, out_dtype, channels_last,
                            kernel or default_kernel(), skip_empty)
