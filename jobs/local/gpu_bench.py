"""Every GPU speed measurement of the project in one command, for one GPU host.

    python -m lartpc.jobs.local.gpu_bench --out gpu-bench            # on the GPU host
    python -m lartpc.jobs.local.gpu_bench --out /tmp/gb --device cpu --quick   # smoke run
    python -m lartpc.jobs.local.gpu_bench --list                     # the steps, not run

The whole set takes about half an hour on one GPU, mostly the minibatch scan. To run
it in parts (a job with a short time limit), name steps with ``--only`` (globs) and
the same ``--out``: a step whose JSON is already there is kept, never run again, and
``summary.md`` always covers every step in the folder::

    python -m lartpc.jobs.local.gpu_bench --out gb --only 'model-*,train-*' --train-seconds 60
    python -m lartpc.jobs.local.gpu_bench --out gb --only minibatch-scnet --scan-seeds 0

Runs, each as its own ``lartpc bench`` process, writing its JSON into ``--out``:

1. ``model-jishnet-*``: JishNet forward+backward at 3600 x 3600, minibatch 7, from the
   published layer order up through ELU-after-pool, cuDNN autotuning, bf16 autocast,
   channels_last and torch.compile (each step adds one option), with TFLOP/s and the
   fraction of the device's peak; then with the first stage as one Triton kernel
   (``--stem fused``), eager and compiled. ``stages-jishnet-{library,fused}``: each
   stage's forward and backward time alone; ``maxbatch-jishnet-{library,fused}``: the
   largest minibatch that fits and its peak memory.
2. ``model-scnet-*``: SCNet with spconv's default, implicit GEMM, and implicit GEMM in
   float16.
3. ``train-*``: one-GPU trainings through the real loaders (JishNet from Blosc and from
   device-dense, SCNet sparse) with the fastest options: images/s and the share of each
   step spent waiting for data. One plain process each: Horovod need not be built.
4. ``minibatch-scnet``: SCNet throughput and time-to-loss for minibatch 7 ... 256
   (``--scan-batches``); ``minibatch-scnet-torch`` the same with SCNet's layers in torch
   operations (``model.sparse=torch``, tables built in the loader's thread);
   ``minibatch-scnet-torch-graph`` with those layers as issue 36 trains them fastest:
   the step one CUDA graph, the tables joined from the table cache, three loader
   threads.

``summary.md`` collects the headline numbers and ``results.json`` every measurement as
one object (``name``, ``model``, ``device_name``, ``images_per_s``, ``options``, and the
rest of what the bench printed), with ``lartpc env``'s lines; ``--results FILE`` copies it
there too (e.g. ``docs/results/gpu-2026-11-24-h100.json``, to commit). A failing step is
reported and the rest still run; the exit status is non-zero if any failed. Options a
CPU cannot run (spconv float16 and implicit GEMM) are listed as skipped with
``--device cpu``. With ``--device cuda`` (the default) where ``lartpc env`` sees no CUDA
device, no step is launched: one line says so, on the console and atop ``summary.md``,
which lists every selected step as skipped for it, and the exit status is 1
(``--device cpu`` runs the parts a CPU can).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
import time
from pathlib import Path

from lartpc.bench.train import LARTPC
from lartpc.fsutil import atomic_write

JISHNET_STEPS = (  # (name, added flags): each step keeps the previous ones
    ("published", []),
    ("elu-after-pool", ["--elu-after-pool"]),
    ("cudnn-benchmark", ["--cudnn-benchmark"]),
    ("bf16", ["--amp", "bf16"]),
    ("channels-last", ["--channels-last"]),
    ("compile", ["--compile"]),
)
SCNET_VARIANTS = (  # (name, flags, needs CUDA)
    ("default", [], False),
    ("implicit-gemm", ["--algo", "implicit_gemm"], True),
    ("implicit-gemm-fp16", ["--algo", "implicit_gemm", "--half"], True),
    ("torch", ["--sparse", "torch"], False),  # lartpc/models/sparse_torch.py
    ("torch-graph", ["--sparse", "torch", "--cuda-graph"], True),  # lartpc/bench/graphed.py
)

#: the minibatch scans (spconv, SCNet's layers in torch operations, those with the
#: step's graph and the table cache): each step's folder under ``--out``
SCANS = {"minibatch-scnet": "minibatch", "minibatch-scnet-torch": "minibatch-torch",
         "minibatch-scnet-torch-graph": "minibatch-torch-graph"}
#: why a --device cuda step is skipped on a host where torch sees no GPU
NO_CUDA = "torch sees no CUDA device"


def _say(msg: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _lartpc(out: Path, name: str, argv: list[str], timeout: float) -> dict:
    """Run ``lartpc ARGV``; its JSON is written to OUT/NAME.json and returned."""
    cmd = [*LARTPC, *argv]
    _say(f"{name}: {' '.join(cmd)}")
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"timed out after {timeout:.0f} s", "command": cmd}
    if r.returncode != 0:
        _say(f"{name}: failed (exit {r.returncode})")
        return {"name": name, "error": r.stderr[-3000:], "command": cmd}
    res = json.loads(r.stdout)
    res.update(name=name, command=cmd, wall_s=round(time.time() - t0, 1))
    atomic_write(out / f"{name}.json", json.dumps(res, indent=2))
    return res


def plan(args) -> list[tuple[str, list[str] | None, str]]:
    """(name, lartpc arguments or None when skipped, why skipped) in running order."""
    size = ["--size", str(args.size)]
    dev = ["--device", args.device]
    reps = ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    steps: list[tuple[str, list[str] | None, str]] = []
    flags: list[str] = []
    for name, added in JISHNET_STEPS:
        flags = flags + added
        if name == "cudnn-benchmark" and args.device == "cpu":
            continue  # no cuDNN on CPU: the step would repeat the previous one
        steps.append((f"model-jishnet-{name}",
                      ["bench", "model", "--model", "jishnet", *size, *dev, *reps, *flags], ""))
    steps += _stem_steps(args, size, dev, reps)
    for name, extra, needs_cuda in SCNET_VARIANTS:
        argv = ["bench", "model", "--model", "scnet", *size, *dev, *reps, *extra]
        skip = needs_cuda and args.device != "cuda"
        why = "a CUDA graph needs CUDA" if "--cuda-graph" in extra else \
            "spconv's CPU build has no implicit GEMM or float16"
        steps.append((f"model-scnet-{name}", None if skip else argv, why if skip else ""))
    downsample = str(3600 // args.size)
    fast_jish = ["--set", "train.amp=bf16", "--set", "model.channels_last=true"] \
        if args.device == "cuda" else []
    # SCNet's fastest on an H200 (2026-11-25): implicit GEMM in float32, 952 images/s
    # against 660 in float16; and spconv 2.3.8's float16 tuner found no kernel for a
    # training step there (docs/results/gpu-2026-11-25-h200-scnet-fp16-failure.txt)
    fast_scnet = ["--set", "model.algo=implicit_gemm"] if args.device == "cuda" else []
    # --quick (a smoke run, also in the tests) bounds its trainings by epochs, not by a
    # wall-clock limit: on a busy machine a 10 s limit left one step to measure. Its bare
    # steps are 5 (default 30): the same code path, a third of the quick run's time saved.
    bound = ["--set", "train.epochs=2", "--bare-steps", "5"] if args.quick else []
    train = ["bench", "train", "--ranks", "1", "--backend", "none", *dev, "--downsample",
             downsample, "--events", str(args.events), "--seconds", str(args.train_seconds),
             *bound]
    # SCNet's layers in torch operations, their index tables built in the loader's
    # thread: a step without rulebooks or host synchronisations (issue 36)
    torch_scnet = ["--set", "model.sparse=torch", "--set", "data.rulebooks=loader"]
    for name, model, loader, fast in (("jishnet-blosc", "jishnet", "blosc", fast_jish),
                                      ("jishnet-device-dense", "jishnet", "device-dense",
                                       fast_jish),
                                      ("scnet-sparse", "scnet", "sparse", fast_scnet),
                                      ("scnet-sparse-torch", "scnet", "sparse", torch_scnet),
                                      # and forward + backward replayed as one CUDA graph
                                      ("scnet-sparse-torch-graph", "scnet", "sparse",
                                       [*torch_scnet, "--set", "train.cuda_graph=true"])):
        steps.append((f"train-{name}", [*train, "--model", model, "--loader", loader, *fast],
                      ""))
    scan = ["bench", "minibatch", "--model", "scnet", *dev, "--downsample", downsample,
            "--events", str(args.events), "--batch-per-rank", args.batches, "--seeds",
            args.scan_seeds, "--seconds", str(args.scan_seconds), *bound]
    graph_scnet = [*torch_scnet, "--set", "train.cuda_graph=true", "--set",
                   "data.table_cache=true", "--set", "data.prefetch_threads=3"]
    for (name, folder), options in zip(SCANS.items(), (fast_scnet, torch_scnet, graph_scnet),
                                       strict=True):
        steps.append((name, [*scan, "--out", str(args.out / folder), *options], ""))
    return steps


def _stem_steps(args, size, dev, reps) -> list[tuple[str, list[str] | None, str]]:
    """JishNet with its first stage fused (issue 35), the per-stage breakdown with the
    library and the fused stem, and the largest minibatch that fits with each."""
    cuda = args.device == "cuda"
    best = ["--elu-after-pool", "--amp", "bf16", "--channels-last",
            *(["--cudnn-benchmark"] if cuda else [])]
    base = ["bench", "model", "--model", "jishnet", *size, *dev, *reps, *best]
    why = "" if cuda else "the fused stem is a Triton kernel for CUDA (its tests run it " \
                          "on CPU under Triton's interpreter)"
    steps = [("model-jishnet-fused-stem", [*base, "--stem", "fused"] if cuda else None, why),
             ("model-jishnet-fused-stem-compile",
              [*base, "--stem", "fused", "--compile"] if cuda else None, why)]
    for stem in ("library", "fused"):
        usable = cuda or stem == "library"
        steps.append((f"stages-jishnet-{stem}",
                      [*base, "--stem", stem, "--stages"] if usable else None,
                      "" if usable else why))
    for stem in ("library", "fused"):
        steps.append((f"maxbatch-jishnet-{stem}",
                      [*base, "--stem", stem, "--max-batch"] if cuda else None,
                      "" if cuda else "GPU memory: needs CUDA"))
    return steps


def summary(results: list[dict], skipped: list[tuple[str, str]]) -> str:
    lines = ["| measurement | images/s | TFLOP/s | fraction of peak | data wait | note |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | – | – | – | – | failed |")
            continue
        point = (r.get("points") or [{}])[0]
        rate = r.get("images_per_s", point.get("images_per_s"))
        wait = point.get("data_wait_fraction")
        cells = [f"{rate:.1f}" if rate else "–",
                 f"{r['achieved_tflops']:.2f}" if r.get("achieved_tflops") else "–",
                 f"{100 * r['fraction_of_peak']:.1f} %" if r.get("fraction_of_peak") else "–",
                 f"{100 * wait:.1f} %" if wait is not None else "–",
                 r.get("device_name", r.get("device", ""))]
        if r["name"] in SCANS:
            cells = [f"see {SCANS[r['name']]}/minibatch.md", "–", "–", "–", ""]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    lines += [f"| {name} | – | – | – | – | skipped: {why} |" for name, why in skipped]
    return "\n".join(lines) + "\n"


def _sets(command: list[str]) -> dict[str, str]:
    """The ``--set key=value`` pairs and ``--loader`` of a bench command line."""
    out = {}
    for flag, value in zip(command, command[1:], strict=False):
        if flag == "--set" and "=" in value:
            key, val = value.split("=", 1)
            out[key] = val
        elif flag == "--loader":
            out["data.loader"] = value
    return out


def records(done: list[dict], device_name: str) -> list[dict]:
    """One object per measurement: a model bench as it is; a training bench or the
    minibatch scan one object per point, with the options its command line set."""
    out = []
    for r in done:
        if "points" not in r:
            out.append(r)
            continue
        common = {"name": r["name"], "model": r["model"], "device_name": device_name,
                  "command": r.get("command")}
        opts = _sets(r.get("command") or [])
        rows = r.get("rows") or r["points"]  # the scan: medians over seeds per minibatch
        for pt in rows:
            extra = ({"train.batch_per_rank": pt["batch_per_rank"]} if "batch_per_rank" in pt
                     else {})
            out.append({**common, **pt, "options": {**opts, **extra},
                        "images_per_s": pt["images_per_s"]})
    return out


def environment() -> list[str]:
    """``lartpc env``'s lines (versions, CUDA, spconv build), or why they are missing."""
    r = subprocess.run([*LARTPC, "env"], capture_output=True, text=True, timeout=300)
    return r.stdout.splitlines() if r.returncode == 0 else [f"lartpc env failed: {r.stderr}"]


def _device_name(done: list[dict], env: list[str]) -> str:
    names = {r["device_name"] for r in done if r.get("device_name")}
    if len(names) == 1:
        return names.pop()
    line = next((ln.split(":", 1)[1].strip() for ln in env if ln.startswith("device:")), "")
    return line.split(" (")[0] or "unknown"


def _selected(name: str, only: str | None) -> bool:
    return only is None or any(fnmatch.fnmatchcase(name, g.strip())
                               for g in only.split(",") if g.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="results folder (new, or one to add steps to)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true",
                    help="small images and short runs: checks that every step runs")
    ap.add_argument("--only", default=None,
                    help="comma-separated globs of step names to run (see --list)")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--results", type=Path, default=None,
                    help="also write results.json to this file (to commit under docs/results/)")
    ap.add_argument("--train-seconds", type=float, default=None,
                    help="time limit of each train-* run (default 120; --quick 600, "
                         "bounded by 2 epochs)")
    ap.add_argument("--scan-seconds", type=float, default=None,
                    help="time limit of each minibatch-scan run (default 90; --quick 600, "
                    "bounded by 2 epochs)")
    ap.add_argument("--scan-batches", default=None,
                    help="minibatches of the scans (default 7,14,28,56,112,256; --quick 4,8)")
    ap.add_argument("--scan-seeds", default=None,
                    help="seeds of the minibatch scan (default 0,1; --quick 0)")
    args = ap.parse_args(argv)
    quick = args.quick
    args.size = 450 if quick else 3600
    args.repeats, args.warmup = (1, 1) if quick else (10, 3)
    args.events = 40 if quick else 700
    args.train_seconds = args.train_seconds or (600 if quick else 120)
    args.scan_seconds = args.scan_seconds or (600 if quick else 90)
    args.batches = args.scan_batches or ("4,8" if quick else "7,14,28,56,112,256")
    args.scan_seeds = args.scan_seeds or ("0" if quick else "0,1")
    if args.list:
        args.out = args.out or Path("OUT")
        for name, cmd, why in plan(args):
            print(f"{name}: " + (f"skipped: {why}" if cmd is None else "lartpc " + " ".join(cmd)))
        return 0
    if args.out is None:
        ap.error("--out is required (unless --list)")
    everything = plan(args)
    steps = [step for step in everything if _selected(step[0], args.only)]
    if not steps:
        ap.error(f"--only {args.only!r}: matches no step (see --list)")
    env = environment()
    no_cuda = _no_cuda(args.device, env)
    if no_cuda:
        _say(no_cuda)
    args.out.mkdir(parents=True, exist_ok=True)
    results, skipped = _run_steps(args, steps, no_cuda)
    failed = [r for r in results if "error" in r]
    _write(args, [name for name, *_ in everything], failed, skipped, env, no_cuda)
    _say(f"done: {len(results) - len(failed)} measured, {len(skipped)} skipped, "
         f"{len(failed)} failed; see {args.out / 'summary.md'}")
    return 1 if failed or any(why == NO_CUDA for _, why in skipped) else 0


def _no_cuda(device: str, env: list[str]) -> str:
    """The line saying that no step can run: ``--device cuda`` where ``lartpc env``
    (the interpreter the steps run in) sees no CUDA device; '' otherwise (also when
    ``lartpc env`` failed: then each step says for itself what is wrong)."""
    if device != "cuda" or "cuda available: no" not in env:
        return ""
    return (f"{NO_CUDA}: every --device cuda step needs one, none is run (--device cpu "
            "runs the parts a CPU can)")


def _run_steps(args, steps, no_cuda: str) -> tuple[list[dict], list[tuple[str, str]]]:
    """Run the selected steps: (each run's result, (name, why) of each skipped one).
    A step whose JSON is in ``--out`` is kept; with ``no_cuda`` none is launched."""
    results, skipped = [], []
    for name, cmd, why in steps:
        if cmd is None:
            skipped.append((name, why))
        elif (args.out / f"{name}.json").exists():
            _say(f"{name}: kept from an earlier run ({args.out / name}.json)")
        elif no_cuda:
            skipped.append((name, NO_CUDA))
        else:
            results.append(_lartpc(args.out, name, cmd, timeout=600 if args.quick else 3600))
    return results, skipped


def _write(args, order: list[str], failed: list[dict], skipped: list[tuple[str, str]],
           env: list[str], note: str) -> None:
    """summary.md (``note`` above the table), failures.json, results.json (and
    ``--results``), from every step JSON in ``--out``."""
    done = [json.loads(f.read_text()) for f in sorted(args.out.glob("*.json"))
            if f.name not in ("failures.json", "results.json")]
    done.sort(key=lambda r: order.index(r["name"]) if r.get("name") in order else len(order))
    # every file through atomic_write: a link planted in --out is replaced, not followed
    atomic_write(args.out / "summary.md",
                 (f"{note}\n\n" if note else "") + summary(done + failed, skipped))
    atomic_write(args.out / "failures.json", json.dumps(failed, indent=2))
    res = {"date": time.strftime("%Y-%m-%d"), "environment": env,
           "measurements": records(done, _device_name(done, env))}
    atomic_write(args.out / "results.json", json.dumps(res, indent=2))
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.results, json.dumps(res, indent=2))

if __name__ == "__main__":
    raise SystemExit(main())
