"""``lartpc bench model``: forward and forward+backward time of JishNet or SCNet.

Runs on real generated events (``lartpc.sim``) or on events from ``--data``, never on
zeros, and prints one JSON object. ``peak_memory_bytes`` is, on CUDA,
``torch.cuda.max_memory_allocated`` over warmup and timed steps; on CPU, the growth of
the process's peak resident set size (``getrusage`` ``ru_maxrss``) over those steps,
which counts everything the allocator kept (activations, gradients, workspace).

``train_gflop_per_image`` is the convolution and matrix-multiply work of one
forward+backward pass, counted by ``torch.utils.flop_counter.FlopCounterMode`` on the
meta device (no compute; elementwise work not counted); ``achieved_tflops`` divides it
by the measured step time, and ``fraction_of_peak`` by the device's dense peak for the
step's precision (:mod:`lartpc.models.peaks`, or ``--peak-tflops``). spconv's kernels
are invisible to the counter, so SCNet reports no FLOP numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import sys

from lartpc.cliparse import (
    add_batch_per_rank,
    check_non_negative,
    check_positive,
    check_positive_finite,
    check_seed,
)
from lartpc.config import MAX_THREADS, choices

DEVICES = choices("train.device", without=("auto",))

log = logging.getLogger(__name__)
FULL_SIZE = 3600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, choices=choices("model.name"))
    add_batch_per_rank(parser)
    parser.add_argument("--size", type=int, default=None,
                        help="image side, a divisor of 3600 (default 3600, or the --data geometry)")
    parser.add_argument("--device", default="cpu", choices=DEVICES)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--data", default=None, help="event store to read the batch from")
    parser.add_argument("--seed", type=int, default=0, help="generator seed without --data")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--loss", default="ce", choices=choices("model.loss"))
    speed = parser.add_argument_group("speed options (all off by default)")
    speed.add_argument("--amp", default="none", choices=choices("train.amp"),
                       help="autocast dtype around forward (JishNet; SCNet uses --half)")
    speed.add_argument("--channels-last", action="store_true", help="JishNet: NHWC activations")
    speed.add_argument("--elu-after-pool", action="store_true",
                       help="JishNet: ELU after max-pool (same result, less work)")
    speed.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN autotuning")
    speed.add_argument("--compile", action="store_true",
                       help="JishNet: torch.compile the model (fuses ELU into pooling)")
    speed.add_argument("--stem", default=None, choices=choices("model.stem"),
                       help="JishNet: first stage as the published layers (library, the "
                            "default here), one Triton kernel (fused), or auto")
    speed.add_argument("--stage2", default=None, choices=choices("model.stage2"),
                       help="JishNet: second stage as the published layers (library, the "
                            "default here), a Triton forward kernel (fused), or auto")
    speed.add_argument("--stem-kernel", default="", metavar="BLOCK:WARPS[:SUMS]",
                       help="JishNet, fused stem: its launch (model.stem_kernel; default: "
                            "the kernel's)")
    speed.add_argument("--stem-skip-empty", action="store_true",
                       help="JishNet, fused stem: leave out its blocks with no charge under "
                            "their windows (model.stem_skip_empty: the same numbers, but no "
                            "longer a dense first layer)")
    speed.add_argument("--stage2-kernel", default="",
                       metavar="BLOCK:WARPS:BLOCK_K[:hybrid|:igrad|:map|:triton[:vec]]",
                       help="JishNet, fused second stage: its launch and backward "
                            "(model.stage2_kernel; default: the kernel's)")
    parser.add_argument("--stages", action="store_true",
                        help="JishNet: also time each stage and the head alone (forward, "
                             "forward+backward) into the JSON's 'stages'")
    parser.add_argument("--max-batch", action="store_true",
                        help="JishNet on CUDA: also find the largest minibatch that fits "
                             "(the events repeated to fill it) and its peak memory")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOP/s for fraction_of_peak (default: "
                             "from the device name and precision, when known)")
    speed.add_argument("--algo", default=None,
                       choices=choices("model.algo", without=("auto",)),
                       help="SCNet: spconv algorithm (default: spconv's choice)")
    speed.add_argument("--half", action="store_true", help="SCNet: float16 trunk (CUDA)")
    speed.add_argument("--cuda-graph", action="store_true",
                       help="JishNet, or SCNet with --sparse torch, on CUDA: also time the "
                            "training step (Adam included) captured as one CUDA graph "
                            "against the same step run eagerly, both back to back, into "
                            "the JSON's 'graphed'")
    speed.add_argument("--sparse", default=None, choices=choices("model.sparse"),
                       help="SCNet: sparse layers by spconv (the default) or in torch "
                            "operations (their index tables built in the timed step)")


def _model_options(args) -> dict:
    """The model's speed options; an option meant for the other model is an error."""
    from lartpc.errors import LartpcError

    foreign = ({"--algo": args.algo, "--half": args.half, "--sparse": args.sparse}
               if args.model == "jishnet" else
               {"--amp": args.amp != "none", "--channels-last": args.channels_last,
                "--elu-after-pool": args.elu_after_pool, "--compile": args.compile,
                "--stem": args.stem is not None, "--stage2": args.stage2 is not None,
                "--stem-kernel": args.stem_kernel, "--stage2-kernel": args.stage2_kernel,
                "--stem-skip-empty": args.stem_skip_empty,
                "--stages": args.stages,
                "--max-batch": args.max_batch})
    used = [flag for flag, value in foreign.items() if value]
    if used:
        raise LartpcError(f"{', '.join(used)}: not an option of --model {args.model}")
    from lartpc.config import ModelConfig
    from lartpc.models import model_class

    cfg = ModelConfig(name=args.model, channels_last=args.channels_last,
                      elu_after_pool=args.elu_after_pool, algo=args.algo or "auto",
                      stem=(args.stem or "library") if args.model == "jishnet" else "auto",
                      # the published layers unless asked for (as --stem)
                      stage2=(args.stage2 or "library") if args.model == "jishnet" else "auto",
                      sparse=args.sparse or "spconv", stem_kernel=args.stem_kernel,
                      stage2_kernel=args.stage2_kernel, stem_skip_empty=args.stem_skip_empty)
    # the model's own checks, as in training (SCNet's --half is its fp16 trunk)
    amp = "fp16" if args.half else "none"
    return model_class(args.model).options(cfg, amp, args.device)


def batch_from_events(events, shape: tuple[int, int], kind: str):
    """A :class:`Batch` (dense or sparse, per ``kind``) from a list of events."""
    import numpy as np
    import torch

    from lartpc.data.batch import Batch

    labels = torch.tensor([e.label for e in events], dtype=torch.int64)
    ids = np.array([e.event_id for e in events], np.int64)
    if kind == "dense":
        dense = np.stack([e.dense(shape) for e in events])[:, None]
        return Batch(labels=labels, shape=shape, dense=torch.from_numpy(dense), event_ids=ids)
    coords = np.concatenate([np.stack([np.full(len(e), b), e.row, e.col], 1)
                             for b, e in enumerate(events)]).astype(np.int32)
    feats = np.concatenate([e.charge for e in events]).astype(np.float32)[:, None]
    return Batch(labels=labels, shape=shape, coords=torch.from_numpy(coords),
                 features=torch.from_numpy(feats), event_ids=ids)


def check_size(size: int | None) -> int | None:
    """``--size``: None (the default) or an image side the generator makes."""
    from lartpc.errors import LartpcError

    if size is not None and (size < 1 or FULL_SIZE % size):
        raise LartpcError(f"--size {size}: must divide {FULL_SIZE} (the generator bins "
                          "the full image by an integer factor)")
    return size


def load_events(args):
    """``args.batch_per_rank`` events and their image shape, from ``--data`` or freshly
    generated."""
    from lartpc.data.store import EventStore
    from lartpc.errors import LartpcError

    if args.data:
        store = EventStore(args.data)
        if len(store) < args.batch_per_rank:
            raise LartpcError(f"--data {args.data}: holds {len(store)} events, --batch is "
                              f"{args.batch_per_rank}")
        if args.size is not None and args.size != store.geometry.height:
            raise LartpcError(f"--size {args.size} disagrees with --data {args.data} "
                              f"({store.geometry.shape})")
        return store.read_many(range(args.batch_per_rank)), store.geometry.shape
    size = FULL_SIZE if args.size is None else check_size(args.size)
    from lartpc.geometry import Geometry
    from lartpc.sim import simulate_event

    geometry = Geometry(downsample=FULL_SIZE // size)
    n = args.batch_per_rank
    log.info("generating %d events at %dx%d (seed %d)", n, size, size, args.seed)
    # event i cycles through the five classes, so a batch of 7 holds every class
    return [simulate_event(i, args.seed, geometry) for i in range(n)], geometry.shape


def train_flops(name: str, shape: tuple[int, int], images: int, options: dict,
                loss_fn) -> float | None:
    """FLOPs of one forward+backward of ``images`` images (None for SCNet)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from lartpc.data.batch import Batch
    from lartpc.models import build

    if name != "jishnet":
        return None
    # the fused stem computes the same convolution; the counter sees only torch's layers
    # (with the stem's empty blocks left out, the dense network's FLOPs all the same:
    # achieved_tflops is then dense-equivalent)
    model = build(name, image_size=shape, **{**options, "stem": "library", "stage2": "library",
                                             "stem_skip_empty": False}).to("meta")
    batch = Batch(labels=torch.zeros(images, dtype=torch.int64, device="meta"),
                  shape=shape, dense=torch.empty(images, 1, *shape, device="meta"))
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(batch), batch.labels).backward()
    return float(counter.get_total_flops())


def _sig(x: float, digits: int = 5) -> float:
    """Round to significant digits, not decimals: a ratio of two rounded numbers then
    stays within 1e-4 of the ratio of the unrounded ones at any magnitude."""
    return float(f"{x:.{digits}g}")


def _max_batch(model, batch, loss_fn, autocast, start: int) -> dict:
    """The largest minibatch that fits on the GPU, with its peak memory per image."""
    import torch

    from lartpc.bench.stages import max_batch

    def step_at(b: int) -> None:
        reps = -(-b // start)
        dense = batch.dense.repeat(reps, 1, 1, 1)[:b]
        labels = batch.labels.repeat(reps)[:b]
        model.zero_grad(set_to_none=True)
        with autocast():
            logits = model.forward_tensor(dense)
        loss_fn(logits, labels).backward()
        del dense, labels, logits

    # autotuning each size tried (and every size that runs out of memory) took minutes
    # on an H200; the search runs with cuDNN's default algorithms, and gives the run's
    # own setting back
    tuned = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        largest, peak, why = max_batch(step_at, start)
    finally:
        torch.backends.cudnn.benchmark = tuned
    return {"max_batch": largest, "max_batch_limited_by": why,
            "max_batch_peak_memory_bytes": int(peak),
            "max_batch_memory_per_image_bytes": int(peak / largest) if largest else None,
            "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory}


def _check_options(args) -> None:
    """The options alone, before torch (~1.5 s to import): a mistyped one is one line at
    once."""
    from lartpc.errors import LartpcError

    check_positive(args.batch_per_rank, "--batch-per-rank")
    check_positive(args.repeats, "--repeats")
    check_non_negative(args.warmup, "--warmup")
    check_seed(args.seed)
    check_size(args.size)
    if args.peak_tflops is not None:
        check_positive_finite(args.peak_tflops, "--peak-tflops")
    if args.threads is not None and not 0 <= args.threads <= MAX_THREADS:
        # torch crashes creating that many threads
        raise LartpcError(f"--threads = {args.threads}: must be in 0..{MAX_THREADS} (0: "
                          "torch's default)")
    from lartpc.models.kernel_settings import parse_stage2_kernel, parse_stem_kernel

    parse_stem_kernel(args.stem_kernel, "--stem-kernel")
    parse_stage2_kernel(args.stage2_kernel, "--stage2-kernel")
    if args.cuda_graph and ((args.model == "scnet" and args.sparse != "torch")
                            or args.device != "cuda"):
        raise LartpcError("--cuda-graph: captures JishNet's step, or SCNet's with its torch "
                          "layers (--model scnet --sparse torch), on --device cuda")


def run(args) -> int:
    from lartpc.errors import LartpcError

    _check_options(args)
    import torch

    from lartpc.bench.stages import timed
    from lartpc.models import build, num_parameters
    from lartpc.models.losses import build_loss

    if args.device == "cuda" and not torch.cuda.is_available():
        raise LartpcError("--device cuda: torch sees no CUDA device")
    if args.max_batch and args.device != "cuda":
        raise LartpcError("--max-batch: measures GPU memory; needs --device cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    dev = torch.device(args.device)
    options = _model_options(args)
    events, shape = load_events(args)
    model = build(args.model, image_size=shape, **options).to(dev)
    batch = batch_from_events(events, shape, model.input_kind).to(dev)
    loss_fn = build_loss(args.loss)
    flops = train_flops(args.model, shape, args.batch_per_rank, options, loss_fn)
    plain = model
    if args.compile:
        model = torch.compile(model)
    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]

    def autocast(cache: bool = True):  # no cache of weight casts in a CUDA graph's capture
        return torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None,
                              cache_enabled=cache)

    def forward():
        with autocast():
            return model(batch)

    def infer():
        with torch.no_grad():
            forward()

    def train_step():
        model.zero_grad(set_to_none=True)
        loss_fn(forward(), batch.labels).backward()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    # baseline before warmup: the first step reaches the peak the others repeat
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        train_step()
    if args.warmup:  # no_grad is another graph to torch.compile: compiled here, not timed
        infer()
    fwd, _ = timed(infer, args.repeats, sync)
    fb, fb_cpu = timed(train_step, args.repeats, sync)
    if dev.type == "cuda":
        peak, peak_kind = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:  # Linux reports ru_maxrss in KiB
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
        peak_kind = "growth of process peak RSS (ru_maxrss) over warmup and timed steps"
    fb_s = statistics.median(fb)
    from lartpc.models.peaks import peak_tflops

    precision = {"none": "tf32" if dev.type == "cuda" else "fp32", "bf16": "bf16",
                 "fp16": "fp16"}[args.amp] if args.model == "jishnet" else \
        ("fp16" if args.half else "fp32")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak_tf = args.peak_tflops or peak_tflops(name, precision)
    achieved = flops / fb_s / 1e12 if flops else None
    result = {
        "model": args.model, "size": list(shape), "batch_per_rank": args.batch_per_rank,
        "device": args.device, "device_name": name,
        "threads": torch.get_num_threads(), "options": options, "compile": args.compile,
        "amp": args.amp, "parameters": num_parameters(model),
        "active_pixels": int(sum(len(e) for e in events)),
        "repeats": args.repeats, "warmup": args.warmup,
        "forward_ms": round(statistics.median(fwd) * 1e3, 3),
        "forward_backward_ms": round(fb_s * 1e3, 3),
        "forward_backward_ms_all": [round(t * 1e3, 3) for t in fb],
        # CPU seconds of all threads: on a shared host less noisy than wall time
        "forward_backward_cpu_ms": round(statistics.median(fb_cpu) * 1e3, 3),
        "images_per_s": _sig(args.batch_per_rank / fb_s),
        "train_gflop_per_image": _sig(flops / args.batch_per_rank / 1e9) if flops else None,
        "achieved_tflops": _sig(achieved) if achieved else None,
        "precision": precision, "peak_tflops": peak_tf,
        "peak_source": "--peak-tflops" if args.peak_tflops else
        ("lartpc.models.peaks" if peak_tf else None),
        "fraction_of_peak": _sig(achieved / peak_tf) if achieved and peak_tf else None,
        "peak_memory_bytes": int(peak), "peak_memory_kind": peak_kind,
        "torch": torch.__version__,
    }
    result.update(_extras(args, plain, batch, loss_fn, autocast, sync, options))
    print(json.dumps(result), file=sys.stdout, flush=True)
    return 0


def _extras(args, plain, batch, loss_fn, autocast, sync, options: dict) -> dict:
    """What the options add to the result: the stem's blocks with charge, the stage
    table, the graphed step, the largest minibatch (in that order: the last may fail
    badly past the sizes the kernels ran at)."""
    result: dict = {}
    if options.get("stem_skip_empty"):
        from lartpc.models.fused_stem import blocks_with_charge

        conv = plain.convs[0]
        # achieved_tflops counts the dense network's FLOPs, skipped blocks included
        result["flops_basis"] = "dense-equivalent: the stem's empty blocks are skipped " \
                                "but their FLOPs counted"
        # what the stem computes of this batch: its blocks with charge under them
        result["stem_blocks_with_charge"] = _sig(blocks_with_charge(
            batch.dense, conv.weight, plain.pools[0], conv.padding[0], plain.stem_kernel))
    if args.stages:
        from lartpc.bench.stages import stage_times

        # the model as built (not compiled): each stage alone
        result["stages"] = stage_times(plain, batch.dense, batch.labels, loss_fn, autocast,
                                       args.repeats, args.warmup, sync)
    if args.cuda_graph:
        from lartpc.bench.graphed import measure, measure_dense

        repeats = max(args.repeats, 20)
        try:
            result["graphed"] = measure(plain, batch, loss_fn, repeats, args.warmup) \
                if args.model == "scnet" else \
                measure_dense(plain, batch, loss_fn, lambda: autocast(cache=False), repeats,
                              args.warmup)
        except RuntimeError as e:  # a capture that fails keeps the measurements above
            first = str(e).splitlines()[0] if str(e) else ""
            result["graphed"] = {"error": f"{type(e).__name__}: {first}"}
            log.warning("--cuda-graph: the capture failed (%s)", result["graphed"]["error"])
    if args.max_batch:  # last: sizes past what the kernels were run at may fail badly
        # the model as built: torch.compile would recompile for every size tried
        result.update(_max_batch(plain, batch, loss_fn, autocast, args.batch_per_rank))
    return result
