"""The loops of the fused stem's forward as an H100/H200 would run them, without a GPU.

    python -m lartpc.jobs.local.sass_loops [--configs 64:4:d,64:4:h]
    python -m lartpc.jobs.local.sass_loops --stage 2 [--configs 64:8:64,64:8:64:hybrid:vec]

Compiles ``fused_stem._stem_forward`` for sm_90 at each launch (bf16 input, as under
autocast; Triton's bundled ptxas) and reads its machine code (``cuobjdump -sass``): for
every loop (a branch back), its length in instructions and the count of each opcode.
A window position of the stem is one pass of its loop, so where the kernel is bound by
issuing instructions (its gathers' address arithmetic and bounds checks: BENCHMARKS.md,
issue 35) a shorter loop is a faster kernel. ``--stage 2``: the same of the fused
second stage's forward, one loop pass a window position (its taps' slices unrolled).
A static count, not a timing: the GPU's ``stem_check`` times the same launches. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

#: a SASS line: its address and its instruction
_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sm90_cubin(fn, pointers: dict, consts: dict, warps: int = 4,
               aligned: tuple[str, ...] = ()) -> bytes:
    """Triton kernel ``fn`` compiled for sm_90 (an H100/H200) as a launch there would
    compile it: its pointer arguments' types (``pointers``; other arguments int32), its
    constants and warps; ``aligned``: arguments a launch finds divisible by 16 (torch's
    allocations, strides of 16 or more channels), which Triton then compiles for as it
    would there (wider loads). Needs no GPU, only Triton's bundled ptxas."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    built = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return built.asm["cubin"]


def cuobjdump(cubin: bytes, flag: str) -> str:
    """What Triton's bundled ``cuobjdump FLAG`` prints of ``cubin`` (``-sass``: the
    machine code; ``-res-usage``: registers and stack a thread)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def stem_sass(text: str) -> str:
    """The sm_90 machine code of the stem's forward at launch ``text`` (BLOCK:WARPS:SUMS)."""
    import lartpc.models.fused_stem as fs
    from lartpc.models.kernel_settings import parse_stem_kernel

    k = parse_stem_kernel(text, "--configs")
    consts = dict(C=10, CP=16, K=5, PAD=2, POOL=5, BLOCK=k.block, SUMS=fs._SUMS_CODE[k.sums],
                  KP=fs.tile_taps(5, 5, k.sums), LOWP=True, SKIP=False)
    pointers = {"x_ptr": "*bf16", "w_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": "*bf16",
                "arg_ptr": "*u8", "occ_ptr": "*bf16"}
    return cuobjdump(sm90_cubin(fs._stem_forward, pointers, consts, k.num_warps), "-sass")


def stage2_sass(text: str) -> str:
    """The sm_90 machine code of the second stage's forward at launch ``text``
    (``model.stage2_kernel``'s spelling; ``:vec`` pads the input's 10 channels to 16),
    bf16, its pointers and the padded input's strides aligned as a launch finds them."""
    import lartpc.models.fused_stage2 as fs2
    from lartpc.models.kernel_settings import parse_stage2_kernel

    k = parse_stage2_kernel(text, "--configs")
    run, kp, block_k = fs2.forward_taps(10, 5, k.block_k, k.vec, lowp=True)
    consts = dict(C=64, CP=64, POOL=5, BLOCK=k.block, KP=kp, BLOCK_K=block_k,
                  LOWP=True, NATIVE_HALF_DOT=True, RUN=run if k.vec else 0, K=5)
    pointers = {"x_ptr": "*bf16", "toff_ptr": "*i32", "w_ptr": "*bf16", "b_ptr": "*fp32",
                "y_ptr": "*bf16", "arg_ptr": "*u8"}
    # (unpadded, a row of 724 pixels of 10 channels is not a multiple of 16 values)
    aligned = (*pointers, "sx_b") + (("sx_h", "sx_w") if k.vec else ())
    return cuobjdump(sm90_cubin(fs2._stage_forward, pointers, consts, k.num_warps, aligned),
                     "-sass")


def loops(sass: str) -> list[dict]:
    """Each loop of ``sass`` (from a branch's target back to the branch): its first
    address, its length and its opcodes (predicates and modifiers dropped), most first."""
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, sass.splitlines())
            if m]
    where = {address: i for i, (address, _) in enumerate(code)}
    out = []
    for i, (address, ins) in enumerate(code):
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in where:
            body = [x for _, x in code[where[int(target.group(1), 16)]:i + 1]]
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0]
                                      for x in body)
            out.append({"start": hex(int(target.group(1), 16)), "instructions": len(body),
                        "opcodes": dict(ops.most_common())})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lartpc.jobs.local.sass_loops",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--stage", type=int, default=1, choices=(1, 2),
                    help="1: the stem's forward (default); 2: the second stage's")
    ap.add_argument("--configs", default=None,
                    help="launches, comma-separated: stage 1 BLOCK:WARPS:SUMS (default "
                         "64:4:d,64:4:h), stage 2 as model.stage2_kernel (default "
                         "64:8:64,64:8:64:hybrid:vec)")
    args = ap.parse_args(argv)
    configs = args.configs or ("64:4:d,64:4:h" if args.stage == 1 else
                               "64:8:64,64:8:64:hybrid:vec")
    os.environ.pop("TRITON_INTERPRET", None)  # the interpreter compiles nothing
    sass = stem_sass if args.stage == 1 else stage2_sass
    print(json.dumps({text: loops(sass(text)) for text in configs.split(",")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
