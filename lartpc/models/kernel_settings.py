"""Launch settings of JishNet's Triton kernels, ``model.stem_kernel`` and
``model.stage2_kernel``: parsed and checked here without torch or Triton.

How many pooled outputs a program takes, how many warps run it and how many taps each
matrix product slices do not change what a kernel computes, only how fast it runs on a
given card and the order in which float32 partial sums are added (a last-bit
difference). The fastest differ from card to card, so they are options:

=========================  ====================================================
option                     spelling (e.g. ``64:4:dot``, ``64:8:64:igrad:vec``)
=========================  ====================================================
``model.stem_kernel``      ``BLOCK:WARPS[:dot|:band|:patch|:hoist]``
``model.stage2_kernel``    ``BLOCK:WARPS:BLOCK_K[:hybrid|:igrad|:map|:triton[:vec]]``
=========================  ====================================================

``""`` (the default) is the kernel module's own setting (``fused_stem.BLOCK``,
``NUM_WARPS``, ``SUMS``; ``fused_stage2.BLOCK``, ``NUM_WARPS``, ``BLOCK_K``,
``BACKWARD``, ``VEC``; ``vec`` pads the second stage's input copy to 16 channels,
which changes only how its taps are loaded). Two parts do change the arithmetic: the
stem's ``dot``, ``band``, ``patch`` and ``hoist`` sum its taps on the matrix units
(TF32: under bf16 autocast ``dot`` moved near-tied arg-maxes on an H200,
BENCHMARKS.md; they differ in what they gather, :mod:`lartpc.models.fused_stem`), and
the second stage's backwards sum in their
own orders: ``hybrid`` (the library's gradients of the convolution map), ``igrad``
(the input's gradient of the same map by Triton, the weights' by the library), ``map``
(both of the map's gradients by Triton) and ``triton`` (no map), all from operands
rounded alike (tested).
``jobs/local/stem_check.py`` times settings on a GPU and
``jobs/local/fastest_kernels.py`` picks the fastest of its results.
"""

from __future__ import annotations

from dataclasses import dataclass

from lartpc.errors import ConfigError

#: the largest block of pooled outputs (or taps) a program may take
MAX_BLOCK = 8192
WARPS = (1, 2, 4, 8, 16)
BACKWARDS = ("hybrid", "igrad", "map", "triton")
#: the backwards ``:vec`` goes with (the triton backward reads the forward's copy
#: unpadded)
VEC_BACKWARDS = ("hybrid", "igrad", "map")
#: how the fused stem sums a window's taps: one by one (``taps``), or as matrix
#: products of gathered input (:mod:`lartpc.models.fused_stem`)
STEM_SUMS = ("taps", "dot", "band", "patch", "hoist")


@dataclass(frozen=True, slots=True)
class StemKernel:
    """The fused stem's launch: pooled outputs per program, warps, how taps are summed
    (one of :data:`STEM_SUMS`)."""

    block: int
    num_warps: int
    sums: str = "taps"

    def __str__(self) -> str:
        return f"{self.block}:{self.num_warps}" + ("" if self.sums == "taps" else f":{self.sums}")


@dataclass(frozen=True, slots=True)
class Stage2Kernel:
    """The fused second stage's launch: pooled outputs per program, warps, taps per
    matrix-product slice, and which backward."""

    block: int
    num_warps: int
    block_k: int
    backward: str = "hybrid"
    #: the forward's input copy with each pixel's channels padded to a multiple of 8, so
    #: a tap's channels load as 16-byte vectors (:mod:`lartpc.models.fused_stage2`)
    vec: bool = False

    def __str__(self) -> str:
        return f"{self.block}:{self.num_warps}:{self.block_k}:{self.backward}" + \
            (":vec" if self.vec else "")


def _power_of_two(key: str, text: str, name: str, value: str, low: int, high: int) -> int:
    n = int(value) if value.isdigit() else 0
    if not low <= n <= high or n & (n - 1):
        raise ConfigError(f"{key}={text!r}: {name} = {value!r} must be a power of two in "
                          f"{low}..{high}")
    return n


def _warps(key: str, text: str, value: str) -> int:
    if not value.isdigit() or int(value) not in WARPS:
        raise ConfigError(f"{key}={text!r}: WARPS = {value!r} must be one of "
                          f"{', '.join(map(str, WARPS))}")
    return int(value)


def parse_stem_kernel(text: str, key: str = "model.stem_kernel") -> StemKernel | None:
    """``"BLOCK:WARPS[:dot|:band|:patch|:hoist]"`` (``d``, ``b``, ``p``, ``h`` for short) as a
    :class:`StemKernel`; None for ``""`` (the kernel's default). BLOCK is at least 16.
    A ConfigError names ``key`` and the part at fault."""
    if text == "":
        return None
    parts = text.split(":")
    names = {s: s for s in STEM_SUMS[1:]} | {s[0]: s for s in STEM_SUMS[1:]}
    sums = "taps" if len(parts) == 2 else names.get(parts[-1])
    if len(parts) not in (2, 3) or sums is None:
        raise ConfigError(f"{key}={text!r}: expected BLOCK:WARPS with an optional "
                          f":{' or :'.join(STEM_SUMS[1:])}, e.g. 64:4:dot")
    return StemKernel(_power_of_two(key, text, "BLOCK", parts[0], 16, MAX_BLOCK),
                      _warps(key, text, parts[1]), sums)


def parse_stage2_kernel(text: str, key: str = "model.stage2_kernel") -> Stage2Kernel | None:
    """``"BLOCK:WARPS:BLOCK_K[:hybrid|:igrad|:map|:triton[:vec]]"`` (``i`` for ``igrad``,
    ``m`` for ``map``, ``t`` for ``triton``, ``v`` for ``vec``; ``vec`` not with
    ``triton``) as a
    :class:`Stage2Kernel`; None for ``""``. BLOCK and BLOCK_K are at least 16, the
    matrix units' smallest tile side."""
    if text == "":
        return None
    parts = text.split(":")
    names = {s: s for s in BACKWARDS} | {"i": "igrad", "m": "map", "t": "triton"}
    vec = len(parts) == 5 and parts[4] in ("vec", "v")
    backward = "hybrid" if len(parts) == 3 else names.get(parts[3]) if len(parts) > 3 \
        else None
    if len(parts) not in (3, 4, 5) or backward is None or (len(parts) == 5 and not vec):
        raise ConfigError(f"{key}={text!r}: expected BLOCK:WARPS:BLOCK_K with an optional "
                          f":{' or :'.join(BACKWARDS)} and then an optional :vec, e.g. "
                          "64:8:32:triton or 64:8:64:igrad:vec")
    if vec and backward not in VEC_BACKWARDS:
        raise ConfigError(f"{key}={text!r}: :vec (the forward's channels padded) goes with "
                          "the hybrid, igrad or map backward, not triton (which reads that copy "
                          "unpadded)")
    return Stage2Kernel(_power_of_two(key, text, "BLOCK", parts[0], 16, MAX_BLOCK),
                        _warps(key, text, parts[1]),
                        _power_of_two(key, text, "BLOCK_K", parts[2], 16, MAX_BLOCK),
                        backward, vec)


def check(stem_kernel: str, stage2_kernel: str) -> None:
    """Both settings parse (a ConfigError naming the one that does not)."""
    parse_stem_kernel(stem_kernel)
    parse_stage2_kernel(stage2_kernel)
