"""JishNet's second stage (conv C_in->C_out, k x k + bias + ELU + max-pool) as a Triton
forward kernel with a hybrid or Triton backward.

After the fused stem (:mod:`lartpc.models.fused_stem`) the second stage, conv 10->64 5x5
at 720 x 720 + ELU + pool 5, was the largest part of an H200 training step (6.8 of
~13 ms, BENCHMARKS.md). The published layers write the 64 x 720 x 720 convolution map
and read it back for ELU and pool.

**Forward**: an implicit GEMM. The input is first copied, in the products' precision,
padded by the convolution's padding and channels-last (7 x 10 x 724 x 724 bf16: 73 MB
per step of 7; the triton backward keeps it instead of the input), so no load needs a
mask.
Each program takes BLOCK pooled outputs (of the flattened image, row, column order) and
all output channels. For each of the pool's p x p window positions it gathers the
(BLOCK, C_in k^2) patches (taps ordered (ky, kx, channel): runs of C_in contiguous
values), multiplies them by the (C_in k^2, C_out) weights with ``tl.dot`` in BLOCK_K
slices with float32 accumulation, adds the bias and keeps the running maximum and its
window position. Only ``ELU(max)`` (B x C_out x H/p x W/p) and the position (one byte
per output) are written; the full-resolution map never is. Half-precision output
(autocast, or a bf16/fp16 input) runs the products in that precision on the matrix
units, as autocast's convolution does (which also rounds the bias to bf16; here it is
added in float32); float32 runs them in IEEE float32 (not TF32, which cuDNN uses for
float32 convolutions by default).

``vec`` (``model.stage2_kernel=...:vec``; not with the triton backward): the copy holds
16 channels a pixel (the input's 10, then zeros), the taps ordered (ky, kx, channel of
16), 448 of them (zero weights past the 250 real ones), and each tap's offset computed
from its number instead of read from a table, so the compiler sees each tap's 16 values
as one aligned run and gathers them as two 16-byte copies instead of 16 single values
(sm_90 code: ``jobs/local/sass_loops.py --stage 2``), at 1.75x the matrix work. Same
products, summed in another order. Not yet timed.

**Backward**, four ways (:data:`BACKWARD`; all tested; ``jobs/local/stem_check.py
--stage 2`` times them side by side on a GPU):

- ``hybrid`` (the default): a Triton kernel turns the pooled gradient times ELU'(output)
  into the convolution map's gradient, each window's value at its arg-max and zero
  elsewhere (a 1-in-p^2 sparse map, written once, dense), and sums the bias gradient per
  program (no atomics); then torch's convolution backward gives the input and weight
  gradients from that map in the very call autograd makes for the published
  convolution (the input as it came, the convolution's padding), so on a GPU cuDNN gets
  the library stage's own problem. (Until 2026-11-28 these were two calls on the padded
  copy with zero padding: 7 ms against the library stage's 4.4 on an H200.) Cost: the
  map is written once and read twice (B x C_out x H x W, 464 MB per step of 7 at 720 x
  720 in bf16: about 0.3 ms of an H200's bandwidth) and the library's gradient
  convolutions do dense work, 25 times the nonzero products.
- ``igrad``: the hybrid's map, its input gradient by a Triton kernel instead of the
  library's, the weight gradient still the library's. On the H200 (2026-11-28) cuDNN's
  input gradient took 1.37 ms a step of 7 (plus 0.26 ms padding its 10 input channels)
  in a kernel whose 64-wide tiles compute 64 columns for the 10 wanted; here it is an
  implicit GEMM whose columns are the input channels padded to 16 only: per tap, the
  (pixels x C_out) rows of the map the tap reaches (contiguous runs in channels-last
  order) times the tap's (C_out x C_in) weights, 186 GFLOP of matrix work a step at 3600²
  against the library tiles' ~740. Not yet timed.
- ``map``: the input's gradient as ``igrad``, and the weights' from the same map by
  Triton too, so the stage calls no library convolution (on the H200 cuDNN's weight
  gradient took 1.00 ms a step of 7, plus its share of 0.26 ms of padding kernels).
  For a group of 16 taps and a run of map pixels, each program multiplies the (C_out x
  pixels) map gradients, the transposed channels-last rows of the map, by the (pixels x
  16 taps x 16 channels) input values those taps read in the forward's padded copy
  (kept for the backward instead of the input, 73 MB a step of 7, 117 MB under
  ``vec``), on the matrix units; torch adds the programs' partial sums. 238 GFLOP of
  matrix work a step at 3600² for the 116 wanted (the 10 channels padded to 16, the 25
  taps to 32); dense like the library's, the map being 1-in-25 sparse. Not yet timed.
- ``triton``: the map is never written. The pooled gradients before ELU and the arg-maxes
  are laid out as rows of C_out values (B x H/p x W/p rows, 37 MB in float32 at 3600²);
  the weight gradient is, for each window position d, the (taps x BLOCK) patches (the
  forward's gathers again) times the (BLOCK x C_out) gradients of the windows whose
  arg-max is d, on the matrix units, summed per program over several blocks and then
  across programs by torch (no atomics); the input gradient is input-stationary: each
  pixel, for each of the k x k taps, reads the row of the window its tap reaches, keeps
  the channels whose arg-max is that very position, and multiplies them by the tap's
  (C_out x C_in) weights. Products in the same precision as the hybrid's (the gradients
  rounded to bf16 under autocast, as the hybrid writes its map).

Same function as ``max_pool2d(elu(conv2d(x)))`` and as ``elu(max_pool2d(conv2d(x)))``
(JishNet's ``elu_after_pool`` ordering): ELU is increasing, so the pool's arg-max is the
convolution's. The tie rule is the fused stem's: the first window position in row-major
order wins (strict ``>``), as in torch's max-pool; the two differ only where rounding
differs (this kernel sums the products in its own order, float32; autocast's convolution
rounds its output to bf16 before the pool, which makes more ties) or where ELU saturates
(``elu(x) == -1`` exactly below about -17 in float32; the gradient there is below 1e-7
either way). A NaN wins its window.

Imports Triton at import time: import this module only where the fused stage was asked
for (:mod:`lartpc.models.jishnet` does). On CPU tensors it runs under Triton's
interpreter (``TRITON_INTERPRET=1`` set before this module is imported), which the tests
use.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from lartpc.models.fused_stem import pooled_block, pooled_gradient, store_pooled, take_max
from lartpc.models.kernel_settings import VEC_BACKWARDS, Stage2Kernel

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
#: pooled outputs per program, taps per matrix-product slice and warps per program: the
#: fastest of ``jobs/local/stem_check.py --stage 2``'s sweep on the H200 (2026-11-28,
#: 64:8:64 with the hybrid backward: stage 2 in 4.90 ms a step of 7, 64:8:32 4.96,
#: cuDNN 6.90; BENCHMARKS.md), compiled by Triton for sm_90 without spills (64:64 with 4
#: warps spills ~900 bytes a thread); the interpreter, slow per operation, is quicker
#: with large blocks. A run may set its own, backward included
#: (``model.stage2_kernel``, :mod:`lartpc.models.kernel_settings`).
BLOCK = 256 if _INTERPRET else 64
BLOCK_K = 256 if _INTERPRET else 64
#: at most this many taps a slice in float32 (whose products take more registers: 64
#: spill 168 bytes a thread at 64:8 on sm_90), whatever the launch asks
BLOCK_K_FLOAT = 256 if _INTERPRET else 32
NUM_WARPS = 8
#: half-precision products on the matrix units; off under the interpreter, whose bf16
#: ``tl.dot`` returns garbage (Triton 3.9: errors of 1e10 on a 16 x 16 product), so there
#: the same products are formed in float32 from the rounded operands (exact either way)
NATIVE_HALF_DOT = not _INTERPRET
#: the forward's input copy with its channels padded to runs of 8 (``vec``, module
#: docstring); not with the triton backward
VEC = False
#: the backward, ``hybrid``, ``igrad``, ``map`` or ``triton`` (module docstring); read
#: when the forward runs
BACKWARD = "hybrid"

#: ``triton`` backward: blocks of pooled outputs each weight-gradient program sums (fewer
#: partial sums for torch to add), its taps per program with half-precision and with
#: float32 products, and input pixels per input-gradient program: chosen so that Triton
#: 3.9's sm_90 code keeps them in registers (with 8 warps: the weight gradient 128
#: registers a thread in bf16, 214 in float32, whose IEEE products take more; the input
#: gradient 184 / 136; 64 pixels, 32 float32 taps or 4 warps spilled), not yet timed
BACKWARD_WARPS = 8
WGRAD_BLOCKS = 1 if _INTERPRET else 16
WGRAD_BLOCK_K_HALF = 256 if _INTERPRET else 64
WGRAD_BLOCK_K_FLOAT = 256 if _INTERPRET else 16
IGRAD_BLOCK = 2048 if _INTERPRET else 32
#: ``igrad`` backward: input pixels and warps per program of the input gradient from the
#: map, not yet timed. Triton 3.9's sm_90 code at 128:8: the map's rows by 16-byte
#: asynchronous copies through L1, the bf16 products as 64x16x16 warpgroup matrix
#: instructions, 80 registers a thread (156 in float32, whose IEEE products run on the
#: CUDA cores; 4 warps spilled there)
MAP_IGRAD_BLOCK = 2048 if _INTERPRET else 128
MAP_IGRAD_WARPS = 8
#: ``map`` backward, its weight gradient from the map: map pixels a block, taps a
#: program (JishNet's 25 in two groups of 16 on a GPU, the second's last 7 columns
#: computed and dropped), warps, and at most how many programs share the pixels (each
#: sums its blocks' products into one partial sum of (C_out x taps x 16) values, torch
#: adds those: 264 are two an H100/H200 multiprocessor, 35 MB of float32 at 64 channels);
#: not yet timed. Triton 3.9's sm_90 code at 64 pixels, 16 taps, 8 warps, ``vec``: the
#: input's runs by 16-byte asynchronous copies through L1, the bf16 products as 64x128x16
#: warpgroup matrix instructions, 136 registers a thread (154 unpadded; float32 218 and
#: 241, IEEE products on the CUDA cores); no spill (16 taps at 4 warps or 32 taps
#: spill unpadded and in float32)
MAP_WGRAD_BLOCK = 2048 if _INTERPRET else 64
MAP_WGRAD_TAPS = 32 if _INTERPRET else 16
MAP_WGRAD_WARPS = 8
MAP_WGRAD_PROGRAMS = 4 if _INTERPRET else 264


def _side(n: int) -> int:
    """``n`` padded to a tile side of ``tl.dot``: a power of two, at least 16."""
    return max(16, triton.next_power_of_2(n))


def default_kernel() -> Stage2Kernel:
    """The launch ``model.stage2_kernel=""`` means: this module's settings as they are now."""
    return Stage2Kernel(BLOCK, NUM_WARPS, BLOCK_K, BACKWARD, VEC)


@triton.jit
def _stage_forward(x_ptr, toff_ptr, w_ptr, b_ptr, y_ptr, arg_ptr, N, HO, WO,
                   sx_b, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
                   C: tl.constexpr, CP: tl.constexpr, POOL: tl.constexpr, BLOCK: tl.constexpr,
                   KP: tl.constexpr, BLOCK_K: tl.constexpr, LOWP: tl.constexpr,
                   NATIVE_HALF_DOT: tl.constexpr, RUN: tl.constexpr = 0, K: tl.constexpr = 0):
    """On the input padded in memory, so that no load needs a mask: past-the-end outputs
    read the last one's pixels, padding taps (zero weights) pixel 0 of their window.
    RUN = 0: the taps' offsets from ``toff_ptr``; RUN > 0 (``vec``): the copy holds RUN
    channels a pixel (the input's, then zeros), tap ``t // RUN`` of the K x K window
    (past the last: the last again, zero weights), so each tap's channels are a run the
    compiler sees as contiguous and aligned and loads as vectors."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pm = p < N
    q = tl.minimum(p, N - 1)
    b = (q // (HO * WO)).to(tl.int64)
    i = (q // WO) % HO
    j = q % WO
    c = tl.arange(0, CP)
    cm = c < C
    bias = tl.load(b_ptr + c, mask=cm, other=0.0)
    x_img = x_ptr + b * sx_b
    corner = (i * POOL) * sx_h + (j * POOL) * sx_w  # each window's first pixel, int32
    best = tl.full((BLOCK, CP), float("-inf"), tl.float32)
    arg = tl.zeros((BLOCK, CP), tl.int32)
    for d in range(POOL * POOL):  # window positions in row-major order, torch's tie order
        pos = corner + (d // POOL) * sx_h + (d % POOL) * sx_w
        acc = tl.zeros((BLOCK, CP), tl.float32)
        for k0 in range(0, KP, BLOCK_K):
            t = k0 + tl.arange(0, BLOCK_K)  # tap = (ky * K + kx) * C_in + channel
            if RUN > 0:  # through L1 (".ca"): the runs load as asynchronous copies,
                # which Triton otherwise sends past it, and the positions' patches overlap
                tap = tl.minimum(t // RUN, K * K - 1)
                toff = (tap // K) * sx_h + (tap % K) * sx_w + t % RUN
                a = tl.load(x_img[:, None] + (pos[:, None] + toff[None, :]),
                            cache_modifier=".ca")
            else:
                a = tl.load(x_img[:, None] + (pos[:, None] + tl.load(toff_ptr + t)[None, :]))
            wt = tl.load(w_ptr + t[:, None] * CP + c[None, :])  # packed, zero-padded
            if LOWP and NATIVE_HALF_DOT:
                acc += tl.dot(a.to(wt.dtype), wt)
            elif LOWP:  # the same products (exact in float32) of the rounded input
                acc += tl.dot(a.to(wt.dtype).to(tl.float32), wt.to(tl.float32),
                              input_precision="ieee")
            else:
                acc += tl.dot(a.to(tl.float32), wt, input_precision="ieee")
        best, arg = take_max(acc + bias[None, :], d, best, arg)
    store_pooled(y_ptr, arg_ptr, best, arg, pm, cm, b, i, j, c, C, HO, WO,
                 sy_b, sy_c, sy_h, sy_w)


@triton.jit
def _stage_scatter(g_ptr, y_ptr, arg_ptr, d_ptr, part_ptr, N, HO, WO,
                   sg_b, sg_c, sg_h, sg_w, sy_b, sy_c, sy_h, sy_w, sd_b, sd_c, sd_h, sd_w,
                   C: tl.constexpr, CP: tl.constexpr, POOL: tl.constexpr,
                   BLOCK: tl.constexpr):
    """The convolution map's gradient over each window (pooled gradient times ELU' at
    the arg-max, zero at the other positions) and per-program bias-gradient sums."""
    pm, b, i, j, c, cm = pooled_block(N, HO, WO, C, CP, BLOCK)
    m2, dm, a = pooled_gradient(g_ptr, y_ptr, arg_ptr, pm, cm, b, i, j, c, C, HO, WO,
                                sg_b, sg_c, sg_h, sg_w, sy_b, sy_c, sy_h, sy_w)
    tl.store(part_ptr + tl.program_id(0).to(tl.int64) * CP + c, tl.sum(dm, axis=0))
    base = d_ptr + (b * sd_b + (i * POOL) * sd_h + (j * POOL) * sd_w)[:, None] \
        + c[None, :] * sd_c
    for d in range(POOL * POOL):
        tl.store(base + (d // POOL) * sd_h + (d % POOL) * sd_w,
                 tl.where(a == d, dm, 0.0).to(d_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _half_dot(a, b, acc, LOWP: tl.constexpr, NATIVE_HALF_DOT: tl.constexpr):
    """acc + a @ b with float32 accumulation: half-precision operands (``b`` rounded to
    ``a``'s type) on the matrix units, or their exact products formed in float32 where
    the native half product cannot run (the interpreter); IEEE float32 otherwise."""
    if LOWP and NATIVE_HALF_DOT:
        return tl.dot(a, b.to(a.dtype), acc)
    elif LOWP:
        return tl.dot(a.to(tl.float32), b.to(a.dtype).to(tl.float32), acc,
                      input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _stage_wgrad(x_ptr, toff_ptr, dm_ptr, arg_ptr, part_ptr, N, HO, WO, sx_b, sx_h, sx_w,
                 CP: tl.constexpr, KP: tl.constexpr, POOL: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCKS: tl.constexpr, LOWP: tl.constexpr,
                 NATIVE_HALF_DOT: tl.constexpr):
    """One slice of BLOCK_K taps of the weight gradient, summed over this program's
    BLOCKS blocks of pooled outputs: for each window position, (taps x outputs) patches
    times the (outputs x channels) gradients of the windows whose arg-max is there."""
    t = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    toff = tl.load(toff_ptr + t)
    c = tl.arange(0, CP)
    acc = tl.zeros((BLOCK_K, CP), tl.float32)
    for blk in range(BLOCKS):
        p = (tl.program_id(0) * BLOCKS + blk) * BLOCK + tl.arange(0, BLOCK)
        pm = p < N
        q = tl.minimum(p, N - 1)
        b = (q // (HO * WO)).to(tl.int64)
        rows = q.to(tl.int64)[:, None] * CP + c[None, :]
        g = tl.load(dm_ptr + rows, mask=pm[:, None], other=0.0)  # past the end: no gradient
        a = tl.load(arg_ptr + rows).to(tl.int32)
        x_img = x_ptr + b * sx_b
        corner = (((q // WO) % HO) * POOL) * sx_h + ((q % WO) * POOL) * sx_w
        for d in range(POOL * POOL):
            pos = corner + (d // POOL) * sx_h + (d % POOL) * sx_w
            patch = tl.load(x_img[:, None] + (pos[:, None] + toff[None, :]))
            acc = _half_dot(tl.trans(patch), tl.where(a == d, g, 0.0), acc, LOWP,
                            NATIVE_HALF_DOT)
    out = part_ptr + tl.program_id(0).to(tl.int64) * (KP * CP)
    tl.store(out + t[:, None] * CP + c[None, :], acc)


@triton.jit
def _stage_igrad(dm_ptr, arg_ptr, w_ptr, gx_ptr, M, H, W, HO, WO, sg_b, sg_c, sg_h, sg_w,
                 CIN: tl.constexpr, CIP: tl.constexpr, CP: tl.constexpr, K: tl.constexpr,
                 PAD: tl.constexpr, POOL: tl.constexpr, BLOCK: tl.constexpr,
                 LOWP: tl.constexpr, NATIVE_HALF_DOT: tl.constexpr):
    """The input gradient of BLOCK pixels: for each tap, the convolution output it feeds,
    that output's window row of gradients kept where the window's arg-max is that very
    output, times the tap's (channels x input channels) weights."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pm = p < M
    q = tl.minimum(p, M - 1)
    b = q // (H * W)
    y = (q // W) % H
    x = q % W
    c = tl.arange(0, CP)
    ci = tl.arange(0, CIP)
    acc = tl.zeros((BLOCK, CIP), tl.float32)
    for ky in range(K):
        oy = y + PAD - ky  # the convolution output this tap feeds
        row_ok = pm & (oy >= 0) & (oy < HO * POOL)  # rows past the last window: none
        oy = tl.maximum(oy, 0)
        for kx in range(K):
            ox = x + PAD - kx
            ok = row_ok & (ox >= 0) & (ox < WO * POOL)
            ox = tl.maximum(ox, 0)
            win = ((b * HO + oy // POOL) * WO + ox // POOL).to(tl.int64)
            rows = win[:, None] * CP + c[None, :]
            g = tl.load(dm_ptr + rows, mask=ok[:, None], other=0.0)
            a = tl.load(arg_ptr + rows, mask=ok[:, None], other=0).to(tl.int32)
            d = (oy % POOL) * POOL + ox % POOL
            wt = tl.load(w_ptr + ((ky * K + kx) * CP + c)[:, None] * CIP + ci[None, :])
            acc = _half_dot(tl.where(a == d[:, None], g, 0.0).to(wt.dtype), wt, acc, LOWP,
                            NATIVE_HALF_DOT)
    off = (b.to(tl.int64) * sg_b + y * sg_h + x * sg_w)[:, None] + ci[None, :] * sg_c
    tl.store(gx_ptr + off, acc.to(gx_ptr.dtype.element_ty),
             mask=pm[:, None] & (ci < CIN)[None, :])


@triton.jit
def _map_igrad(d_ptr, w_ptr, gx_ptr, M, H, W, HC, WC, sd_b, sd_h, sd_w,
               sg_b, sg_c, sg_h, sg_w, C: tl.constexpr, CP: tl.constexpr, CIN: tl.constexpr,
               CIP: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr, BLOCK: tl.constexpr,
               LOWP: tl.constexpr, NATIVE_HALF_DOT: tl.constexpr):
    """``igrad`` backward: the input gradient of BLOCK pixels from the convolution map's
    gradient (``_stage_scatter``'s, dense, channels-last: channel stride 1) as an
    implicit GEMM with C_in padded only to 16 columns: for each tap, the (BLOCK x C_out)
    rows of the map the tap reaches (one contiguous run a pixel) times the tap's
    (C_out x C_in) weights."""
    # (pixels past the end load nothing and store nothing: every access is masked)
    pm, b, y, x, c, cm = pooled_block(M, H, W, C, CP, BLOCK)
    ci = tl.arange(0, CIP)
    img = d_ptr + b * sd_b
    acc = tl.zeros((BLOCK, CIP), tl.float32)
    for ky in range(K):
        oy = y + PAD - ky  # the map's row this tap reaches
        row_ok = pm & (oy >= 0) & (oy < HC)
        for kx in range(K):
            ox = x + PAD - kx
            ok = row_ok & (ox >= 0) & (ox < WC)
            if C == CP:  # no padding channel: a mask uniform along each run
                m = ok[:, None]
            else:
                m = ok[:, None] & cm[None, :]
            # through L1 (".ca"; Triton's asynchronous copies bypass it otherwise): the
            # five taps of a row read runs of the map shifted by one pixel
            g = tl.load(img[:, None] + (oy * sd_h + ox * sd_w)[:, None] + c[None, :],
                        mask=m, other=0.0, cache_modifier=".ca")
            wt = tl.load(w_ptr + ((ky * K + kx) * CP + c)[:, None] * CIP + ci[None, :])
            acc = _half_dot(g, wt, acc, LOWP, NATIVE_HALF_DOT)
    off = (b * sg_b + y * sg_h + x * sg_w)[:, None] + ci[None, :] * sg_c
    tl.store(gx_ptr + off, acc.to(gx_ptr.dtype.element_ty),
             mask=pm[:, None] & (ci < CIN)[None, :])


@triton.jit
def _map_wgrad(d_ptr, x_ptr, part_ptr, M, HC, WC, BLOCKS, sd_b, sd_h, sd_w,
               sx_b, sx_h, sx_w, C: tl.constexpr, CP: tl.constexpr, RUN: tl.constexpr,
               CIP: tl.constexpr, K: tl.constexpr, TAPS: tl.constexpr, BLOCK: tl.constexpr,
               LOWP: tl.constexpr, NATIVE_HALF_DOT: tl.constexpr):
    """``map`` backward: one program's partial sums of the weight gradient, for the TAPS
    taps of group ``program_id(1)`` over BLOCKS blocks of BLOCK pixels of the map: per
    block, the (C_out x BLOCK) map gradients (the transposed rows of the channels-last
    map) times the (BLOCK x TAPS * CIP) input values those pixels' taps read in the
    forward's padded copy, RUN channels a tap (runs of 16 under ``vec``: no mask)."""
    c = tl.arange(0, CP)
    n = tl.arange(0, TAPS * CIP)  # column = tap of the group * CIP + input channel
    # taps past the last read the last again; the caller drops their columns
    tap = tl.minimum(tl.program_id(1) * TAPS + n // CIP, K * K - 1)
    ci = n % CIP
    toff = (tap // K) * sx_h + (tap % K) * sx_w + ci  # in the padded copy (channel stride 1)
    acc = tl.zeros((CP, TAPS * CIP), tl.float32)
    for blk in range(BLOCKS):
        p = (tl.program_id(0) * BLOCKS + blk) * BLOCK + tl.arange(0, BLOCK)
        pm = p < M  # past the end: no gradient (and in-bounds addresses of the last pixel)
        q = tl.minimum(p, M - 1)
        b = (q // (HC * WC)).to(tl.int64)
        oy = (q // WC) % HC
        ox = q % WC
        if C == CP:
            m = pm[:, None]
        else:
            m = pm[:, None] & (c < C)[None, :]
        g = tl.load(d_ptr + (b * sd_b + oy * sd_h + ox * sd_w)[:, None] + c[None, :],
                    mask=m, other=0.0)
        # the map's pixel (oy, ox) reads the copy's (oy + ky, ox + kx): no row mask
        src = x_ptr + (b * sx_b + oy * sx_h + ox * sx_w)[:, None] + toff[None, :]
        if RUN == CIP:  # through L1: neighbouring pixels' taps overlap
            xa = tl.load(src, cache_modifier=".ca")
        else:
            xa = tl.load(src, mask=(ci < RUN)[None, :], other=0.0)
        acc = _half_dot(tl.trans(g), xa, acc, LOWP, NATIVE_HALF_DOT)
    prog = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    out = part_ptr + prog.to(tl.int64) * (CP * TAPS * CIP)
    tl.store(out + c[:, None] * (TAPS * CIP) + n[None, :], acc)


def _pooled_rows(gy: torch.Tensor, y: torch.Tensor, arg: torch.Tensor, cp: int):
    """The gradient before ELU at each window's arg-max (float32, as the kernels'
    ``pooled_gradient``) and the arg-maxes, as (B * H' * W', cp) rows, channels zero-padded."""
    b, c, ho, wo = y.shape
    g, yf = gy.float(), y.float()
    dm = torch.where(yf > 0, g, g * (yf + 1.0))  # ELU's derivative from its output
    dm_rows = torch.zeros((b, ho, wo, cp), dtype=torch.float32, device=y.device)
    dm_rows[..., :c] = dm.permute(0, 2, 3, 1)
    arg_rows = torch.zeros((b, ho, wo, cp), dtype=torch.uint8, device=y.device)
    arg_rows[..., :c] = arg.permute(0, 2, 3, 1)
    return dm_rows.view(-1, cp), arg_rows.view(-1, cp)


def forward_taps(cin: int, k: int, block_k: int, vec: bool, lowp: bool
                 ) -> tuple[int, int, int]:
    """How the forward lays out a window's taps: channels a pixel in the input's copy
    (``vec``: ``cin`` padded to a multiple of 8), taps in all (padded with zero
    weights: to a power of two, or under ``vec`` to whole slices, 448 rather than 512
    at 10 channels and 64 a slice) and taps a slice (at most :data:`BLOCK_K_FLOAT` in
    float32, ``lowp`` False)."""
    run = -(-cin // 8) * 8 if vec else cin
    kp = _side(run * k * k)
    block_k = min(block_k, kp) if lowp else min(block_k, kp, BLOCK_K_FLOAT)
    if vec:
        kp = -(-run * k * k // block_k) * block_k
    return run, kp, block_k


def _geometry(x: torch.Tensor, weight: torch.Tensor, pool: int, padding: int):
    b, cin, h, w = x.shape
    c, wcin, k, k2 = weight.shape
    if cin != wcin or k != k2 or pool * pool > 256:
        raise ValueError(f"fused stage: input {tuple(x.shape)} and weight "
                         f"{tuple(weight.shape)} need equal channels, a square kernel and a "
                         f"pool of at most 16 (pool {pool})")
    hc, wc = h + 2 * padding - k + 1, w + 2 * padding - k + 1  # the convolution's map
    if hc // pool < 1 or wc // pool < 1:
        raise ValueError(f"fused stage: input {h}x{w} too small for kernel {k}, pool {pool}")
    return b, cin, h, w, c, k, hc, wc


@functools.lru_cache(maxsize=16)
def _tap_offsets(device: torch.device, k: int, cin: int, kp: int, sx_c: int, sx_h: int,
                 sx_w: int) -> torch.Tensor:
    """(kp,) int32 offsets in a padded image of the taps, ordered (ky, kx, input channel);
    padding taps 0. Cached per device and layout: no host-to-device copy per step."""
    ky, kx, ci = torch.meshgrid(torch.arange(k), torch.arange(k), torch.arange(cin),
                                indexing="ij")
    toff = torch.zeros(kp, dtype=torch.int32)
    toff[: cin * k * k] = (ky * sx_h + kx * sx_w + ci * sx_c).flatten()
    return toff.to(device)


class _FusedStage(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, pool: int, padding: int, out_dtype, channels_last,
                kernel: Stage2Kernel):
        block, warps, block_k, backward = (kernel.block, kernel.num_warps, kernel.block_k,
                                           kernel.backward)
        if kernel.vec and backward not in VEC_BACKWARDS:  # (the options refuse it too)
            raise ValueError("fused stage: vec (the input copy padded) does not go with "
                             "the triton backward, which reads that copy unpadded")
        b, cin, h, w, c, k, hc, wc = _geometry(x, weight, pool, padding)
        ho, wo = hc // pool, wc // pool
        # the products' precision: the output's when it is half (autocast's convolution
        # casts input and weight to it), else float32
        lowp = out_dtype in (torch.bfloat16, torch.float16)
        cdtype = out_dtype if lowp else torch.float32
        # the input in the products' precision, padded in memory (channels-last: a
        # window's taps are then runs of C_in contiguous values; ``vec``: of ``run``, the
        # channels padded with zeros to a multiple of 8); backward's input too
        run, kp, block_k = forward_taps(cin, k, block_k, kernel.vec, lowp)
        xp = torch.empty((b, run, h + 2 * padding, w + 2 * padding), dtype=cdtype,
                         device=x.device, memory_format=torch.channels_last).zero_()
        xp[:, :cin, padding: padding + h, padding: padding + w] = x.detach()
        sx_b, sx_c, sx_h, sx_w = xp.stride()
        cp = _side(c)
        if kernel.vec:
            toff = torch.empty(1, dtype=torch.int32, device=x.device)  # not read
        else:
            toff = _tap_offsets(x.device, k, cin, kp, sx_c, sx_h, sx_w)
        # the weights as (taps, channels), taps in the same order, zero-padded
        wt = torch.zeros((kp, cp), dtype=cdtype, device=x.device)
        wt[: run * k * k].view(k, k, run, cp)[:, :, :cin, :c] = \
            weight.detach().permute(2, 3, 1, 0)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        y = torch.empty((b, c, ho, wo), dtype=out_dtype, device=x.device, memory_format=fmt)
        arg = torch.empty((b, c, ho, wo), dtype=torch.uint8, device=x.device)
        n = b * ho * wo
        grid = (triton.cdiv(n, block),)
        _stage_forward[grid](xp, toff, wt, bias.detach().float().contiguous(), y,
                             arg, n, ho, wo, sx_b, sx_h, sx_w, *y.stride(), C=c, CP=cp,
                             POOL=pool, BLOCK=block, KP=kp, BLOCK_K=block_k, LOWP=lowp,
                             NATIVE_HALF_DOT=NATIVE_HALF_DOT, RUN=run if kernel.vec else 0,
                             K=k, num_warps=warps)
        # the triton backward gathers from the padded copy; the hybrid's gradients are
        # the library's own convolution backward on the input as it came (its shapes,
        # its cuDNN algorithms), so the copy is freed here
        # (the map backward's weight gradient reads the copy too)
        ctx.save_for_backward(xp if backward in ("triton", "map") else x, weight, y, arg)
        ctx.geom = (pool, hc, wc, cp, block, warps, grid, fmt, (b, cin, h, w), x.dtype,
                    bias.dtype, cdtype, padding)
        ctx.triton = (toff, kp, lowp) if backward == "triton" else None
        ctx.backward = backward
        return y

    @staticmethod
    def backward(ctx, gy):
        if ctx.triton is not None:
            return _triton_backward(ctx, gy)
        x, weight, y, arg = ctx.saved_tensors  # x: the padded copy for the map backward
        pool, hc, wc, cp, block, warps, grid, fmt, shape, xdtype, bdtype, cdtype, padding = \
            ctx.geom
        b, c, ho, wo = y.shape
        by_triton = ctx.backward in ("igrad", "map")  # the input's gradient from the map
        # (those kernels read the map's rows: channels-last whatever the output's order)
        fmt = torch.channels_last if by_triton else fmt
        dconv = torch.empty((b, c, hc, wc), dtype=cdtype, device=x.device, memory_format=fmt)
        if hc != ho * pool or wc != wo * pool:
            dconv.zero_()  # rows and columns past the last full window get no gradient
        part = torch.empty((grid[0], cp), dtype=torch.float32, device=x.device)
        _stage_scatter[grid](gy, y, arg, dconv, part, b * ho * wo, ho, wo, *gy.stride(),
                             *y.stride(), *dconv.stride(), C=c, CP=cp, POOL=pool,
                             BLOCK=block, num_warps=warps)
        gx = gw = None
        want_x, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if want_x and by_triton:
            gx, want_x = _map_input_grad(dconv, weight, shape, xdtype, padding, cdtype), False
        if want_w and ctx.backward == "map":
            gw, want_w = _map_weight_grad(dconv, x, weight), False
        if want_x or want_w:  # the call autograd makes for the published convolution
            gx2, gw, _ = torch.ops.aten.convolution_backward(
                dconv, x.detach().to(cdtype), weight.detach().to(cdtype), None, [1, 1],
                [padding, padding], [1, 1], False, [0, 0], 1, [want_x, want_w, False])
            gx = gx if gx2 is None else gx2.to(xdtype)
        gw = None if gw is None else gw.to(weight.dtype)
        gb = part.sum(0)[:c].to(bdtype) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None


def _tap_weights(weight: torch.Tensor, cp: int, cip: int, dtype) -> torch.Tensor:
    """The weights as (tap, C_out, C_in) matrices, zero-padded to (cp, cip): what the
    input-gradient kernels multiply each tap's gradient rows by."""
    c, cin, k, _ = weight.shape
    wt = torch.zeros((k * k, cp, cip), dtype=dtype, device=weight.device)
    wt[:, :c, :cin] = weight.detach().permute(2, 3, 0, 1).reshape(k * k, c, cin)
    return wt


def _map_input_grad(dconv: torch.Tensor, weight: torch.Tensor, shape: tuple, dtype,
                    padding: int, cdtype) -> torch.Tensor:
    """``igrad`` and ``map`` backwards: the input's gradient (``shape`` (B, C_in, H, W) and
    ``dtype``, channels-last) from the convolution map's gradient ``dconv``
    (:func:`_map_igrad`)."""
    b, cin, h, w = shape
    c, _, k, _ = weight.shape
    if dconv.stride(1) != 1:
        dconv = dconv.contiguous(memory_format=torch.channels_last)
    sd_b, _, sd_h, sd_w = dconv.stride()
    cp, cip = _side(c), _side(cin)
    gx = torch.empty((b, cin, h, w), dtype=dtype, device=dconv.device,
                     memory_format=torch.channels_last)
    m = b * h * w
    _map_igrad[(triton.cdiv(m, MAP_IGRAD_BLOCK),)](
        dconv, _tap_weights(weight, cp, cip, cdtype), gx, m, h, w, *dconv.shape[2:],
        sd_b, sd_h, sd_w, *gx.stride(), C=c, CP=cp, CIN=cin, CIP=cip, K=k, PAD=padding,
        BLOCK=MAP_IGRAD_BLOCK, LOWP=cdtype != torch.float32,
        NATIVE_HALF_DOT=NATIVE_HALF_DOT, num_warps=MAP_IGRAD_WARPS)
    return gx


def _map_weight_grad(dconv: torch.Tensor, xp: torch.Tensor, weight: torch.Tensor
                     ) -> torch.Tensor:
    """``map`` backward: the weights' gradient, float32 (C_out, C_in, k, k), from the
    convolution map's gradient ``dconv`` (channels-last) and the forward's padded copy
    ``xp`` of the input (channels-last, its channels padded or not) by
    :func:`_map_wgrad`, the programs' partial sums added by torch (a fixed order: the
    same sum every run)."""
    c, cin, k, _ = weight.shape
    b, _, hc, wc = dconv.shape
    run = xp.shape[1]
    cp, cip = _side(c), _side(run)
    taps = MAP_WGRAD_TAPS
    groups = triton.cdiv(k * k, taps)
    m = b * hc * wc
    blocks = triton.cdiv(m, MAP_WGRAD_BLOCK)
    per = triton.cdiv(blocks, min(blocks, MAP_WGRAD_PROGRAMS))  # blocks a program
    programs = triton.cdiv(blocks, per)
    part = torch.empty((programs, groups, cp, taps * cip), dtype=torch.float32,
                       device=dconv.device)
    sd_b, _, sd_h, sd_w = dconv.stride()  # both channels-last, as the backward and
    sx_b, _, sx_h, sx_w = xp.stride()  # the forward make them: channel stride 1
    _map_wgrad[(programs, groups)](
        dconv, xp, part, m, hc, wc, per, sd_b, sd_h, sd_w, sx_b, sx_h, sx_w, C=c, CP=cp,
        RUN=run, CIP=cip, K=k, TAPS=taps, BLOCK=MAP_WGRAD_BLOCK,
        LOWP=dconv.dtype != torch.float32, NATIVE_HALF_DOT=NATIVE_HALF_DOT,
        num_warps=MAP_WGRAD_WARPS)
    # (groups, C_out, taps * 16) -> (C_out, tap, channel), the taps ordered (ky, kx)
    total = part.sum(0).permute(1, 0, 2).reshape(cp, groups * taps, cip)[:c, : k * k, :cin]
    return total.reshape(c, k, k, cin).permute(0, 3, 1, 2)


def _triton_backward(ctx, gy):
    """``BACKWARD = "triton"``: the weight and input gradients from the pooled gradients
    and arg-maxes (module docstring), the bias gradient their sum; no map written."""
    xp, weight, y, arg = ctx.saved_tensors
    pool, _, _, cp, block, _, _, _, (b, cin, h, w), xdtype, bdtype, _, padding = ctx.geom
    toff, kp, lowp = ctx.triton
    c, _, k, _ = weight.shape
    ho, wo = y.shape[2:]
    dm, args = _pooled_rows(gy, y, arg, cp)
    gx = gw = None
    if ctx.needs_input_grad[0]:
        cip = _side(cin)
        wt = _tap_weights(weight, cp, cip, xp.dtype)
        gx = torch.empty((b, cin, h, w), dtype=xdtype, device=xp.device,
                         memory_format=torch.channels_last)
        m = b * h * w
        _stage_igrad[(triton.cdiv(m, IGRAD_BLOCK),)](
            dm, args, wt, gx, m, h, w, ho, wo, *gx.stride(), CIN=cin, CIP=cip, CP=cp, K=k,
            PAD=padding, POOL=pool, BLOCK=IGRAD_BLOCK, LOWP=lowp,
            NATIVE_HALF_DOT=NATIVE_HALF_DOT, num_warps=BACKWARD_WARPS)
    if ctx.needs_input_grad[1]:
        programs = triton.cdiv(triton.cdiv(len(dm), block), WGRAD_BLOCKS)
        block_k = min(WGRAD_BLOCK_K_HALF if lowp else WGRAD_BLOCK_K_FLOAT, kp)
        part = torch.empty((programs, kp, cp), dtype=torch.float32, device=xp.device)
        sx_b, _, sx_h, sx_w = xp.stride()
        _stage_wgrad[(programs, kp // block_k)](
            xp, toff, dm, args, part, len(dm), ho, wo, sx_b, sx_h, sx_w, CP=cp, KP=kp,
            POOL=pool, BLOCK=block, BLOCK_K=block_k, BLOCKS=WGRAD_BLOCKS, LOWP=lowp,
            NATIVE_HALF_DOT=NATIVE_HALF_DOT, num_warps=BACKWARD_WARPS)
        total = part.sum(0)[: cin * k * k, :c]  # taps ordered (ky, kx, input channel)
        gw = total.reshape(k, k, cin, c).permute(3, 2, 0, 1).to(weight.dtype)
    gb = dm.sum(0)[:c].to(bdtype) if ctx.needs_input_grad[2] else None
    return gx, gw, gb, None, None, None, None, None


@torch.compiler.disable
def fused_stage(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pool: int,
                padding: int, *, channels_last: bool = False,
                kernel: Stage2Kernel | None = None) -> torch.Tensor:
    """``elu(max_pool2d(conv2d(x, weight, bias, padding=padding), pool))``, forward in one
    kernel; differentiable in ``x``, ``weight`` and ``bias``.

    Parameters
    ----------
    x : (B, C_in, H, W) float32, bfloat16 or float16, any memory format.
    weight, bias : the convolution's (C_out, C_in, k, k) and (C_out,).
    pool : max-pool size and stride (floor mode, at most 16); padding : the convolution's.
    channels_last : write the output in NHWC memory order.
    kernel : the launch and backward (``model.stage2_kernel``); None:
        :func:`default_kernel`.

    Returns
    -------
    (B, C_out, H', W') in autocast's dtype when autocast is on for ``x``'s device, else in
    ``x``'s dtype; accumulation is float32 either way.
    """
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    return _FusedStage.apply(x, weight, bias, pool, padding, out_dtype, channels_last,
                             kernel or default_kernel())
