"""``jobs/local/gpu_issues.sh``'s own logic, with a stand-in for Python that records its
calls: every part runs and is logged even when one fails, ``DEADLINE_S`` stops the
running part and skips the rest, ``PACK`` packs the folder into one archive (the lent
GPU machine returns at most 8 files from a call), and on CUDA JishNet's runs get the
fastest kernels' flags."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "jobs/local/gpu_issues.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
case "$1" in  # the script's own one-line readers of JSON run as written
    -c) exec python3 "$@" ;;
esac
echo "$*" >> "$FAKE_LOG"
case "$*" in
    *gpu_bench*) sleep "${FAKE_SLEEP:-0}"; exit "${FAKE_RC:-0}" ;;
esac
printf '{"flags": "%s", "train_flags": "%s"}\n' "$FAKE_FLAGS" "$FAKE_SETS"
"""


def _run(tmp_path: Path, script: Path = SCRIPT, **env) -> tuple[list[str], list[str], Path]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log, out, pack = tmp_path / "calls.log", tmp_path / "gi", tmp_path / "back/gi.tar.gz"
    full = {**os.environ, "DEVICE": "cpu", "PYTHON": str(fake), "FAKE_LOG": str(log),
            "PACK": str(pack), "EVENTS_DIR": str(tmp_path), "FAKE_FLAGS": "",
            "FAKE_SETS": "", **env}
    subprocess.run(["bash", str(script), str(out)], env=full, check=True, timeout=120,
                   capture_output=True)
    parts = (out / "parts.txt").read_text().splitlines()
    return parts, log.read_text().splitlines(), pack


def test_every_part_runs_and_a_failure_is_logged(tmp_path):
    parts, calls, pack = _run(tmp_path, FAKE_RC="3")
    names = [p.split(":")[0] for p in parts]
    assert names == ["env", "events", "loader-probe",
                     "train-scnet-torch-graph-threads-3-table-cache",
                     "train-scnet-torch-graph-threads-3-table-cache-fused-adam",
                     "train-scnet-torch-graph-threads-3", "gpu-tests", "train-jishnet-graph",
                     "train-scnet-torch-graph-processes-8",
                     "train-scnet-torch-graph-threads-1-table-cache",
                     "gpu-bench-train-scnet-sparse", "gpu-bench-model-scnet-default", "done"]
    assert "gpu-bench-train-scnet-sparse: exit 3" in "\n".join(parts)
    assert "env: exit 0" in "\n".join(parts)
    assert sum("gpu_bench" in c for c in calls) == 2
    events = str(tmp_path / "events")  # one store, made once, read by 1a and both trainings
    assert [c for c in calls if events in c][0].startswith("-m lartpc simulate")
    assert sum(events in c for c in calls) == 8
    trainings = [c for c in calls if "bench train" in c and "--model scnet" in c]
    assert [c.split("data.prefetch_threads=")[-1].split()[0] if "prefetch" in c else "proc"
            for c in trainings] == ["3", "3", "3", "proc", "1"]
    assert ["data.table_cache=true" in c for c in trainings] == [True, True, False, False,
                                                                 True]
    assert "data.loader_processes=8" in trainings[3]
    assert all("train.cuda_graph=true" in c for c in trainings)
    assert ["train.optimizer_impl=fused" in c for c in trainings] == [False, True, False,
                                                                      False, False]
    jishnet = next(c for c in calls if "bench train" in c and "--model jishnet" in c)
    assert "--device cpu" in jishnet and "train.cuda_graph=true" in jishnet
    assert "train.epochs=2" in jishnet and "train.amp" not in jishnet  # float32 on a CPU
    with tarfile.open(pack) as tar:
        assert "gi/parts.txt" in tar.getnames()


def test_the_deadline_stops_the_running_part_and_skips_the_rest(tmp_path):
    # 30 s: the parts before the first slow one (each a stand-in call) must leave it the
    # 10 s a part needs to start, also on a loaded machine (11 s was too few in CI once)
    parts, calls, pack = _run(tmp_path, FAKE_SLEEP="60", DEADLINE_S="30")
    text = "\n".join(parts)
    assert "gpu-bench-train-scnet-sparse: stopped at the deadline (30 s)" in text
    assert "gpu-bench-model-scnet-default: not run, deadline (30 s) reached" in text
    assert sum("gpu_bench" in c for c in calls) == 1  # the later part never started
    with tarfile.open(pack) as tar:  # packed although the run was cut short
        member = tar.extractfile("gi/parts.txt")
        assert member is not None and b"stopped at the deadline" in member.read()


def _cuda_tree(tmp_path: Path) -> Path:
    """The script in a copy of its tree whose bundle installer does nothing."""
    tree = tmp_path / "tree"
    (tree / "jobs/local").mkdir(parents=True)
    (tree / "gpu-bundle").mkdir()
    (tree / "gpu-bundle/install.sh").write_text("exit 0\n")
    script = tree / "jobs/local/gpu_issues.sh"
    script.write_text(SCRIPT.read_text())
    return script


def test_on_cuda_jishnet_runs_at_the_fastest_kernels_in_both_benches(tmp_path):
    """``DEVICE=cuda`` (the lease): after the kernel checks, JishNet's stage run gets
    fastest_kernels' ``flags`` and its graphed training the same choices as
    ``train_flags``; each runs again with the stem's empty blocks left out, the fused
    stem asked for whatever the flags say. The script runs from a copy of its tree whose
    bundle installer does nothing."""
    parts, calls, _ = _run(tmp_path, _cuda_tree(tmp_path), DEVICE="cuda",
                           FAKE_FLAGS="--stem fused --stem-kernel 64:4:hoist",
                           FAKE_SETS="--set model.stem=fused --set model.stem_kernel=64:4:hoist")
    names = [p.split(":")[0] for p in parts]
    assert names.index("fastest-kernels") < names.index("model-jishnet-stages") \
        < names.index("train-jishnet-graph") < names.index("model-jishnet-stages-skip-empty") \
        < names.index("train-scnet-torch-graph-processes-8") \
        < names.index("train-jishnet-graph-skip-empty") < names.index("done")
    assert "fastest kernels: --stem fused --stem-kernel 64:4:hoist" in parts
    stages = next(c for c in calls if "bench model --model jishnet" in c)
    assert stages.endswith("--stem fused --stem-kernel 64:4:hoist --stages --repeats 10 "
                           "--max-batch --cuda-graph")
    train = next(c for c in calls if "bench train" in c and "--model jishnet" in c)
    assert "--downsample 1 " in train and "--set train.cuda_graph=true" in train
    assert "--set train.amp=bf16" in train and "--set model.channels_last=true" in train
    assert train.endswith("--set model.stem=fused --set model.stem_kernel=64:4:hoist")
    stages_skip, train_skip = (c for c in calls if "--model jishnet" in c
                               and ("--stem-skip-empty" in c or "stem_skip_empty" in c))
    # the fused stem after the pick (the last wins): skipping empty blocks is its own
    assert stages_skip.startswith("-m lartpc bench model") and stages_skip.endswith(
        "--stem fused --stem-kernel 64:4:hoist --stem fused --stem-skip-empty --stages "
        "--repeats 10 --cuda-graph")
    assert train_skip == train + " --set model.stem=fused --set model.stem_skip_empty=true"


def test_on_cuda_without_a_pick_jishnets_stages_run_fused_as_training_would(tmp_path):
    """When the kernel checks pick nothing (one failed), JishNet's stage run asks for
    the fused stages that ``model.stem=auto`` and ``model.stage2=auto`` train with on
    CUDA, not ``bench model``'s library default, which would time the dense network
    the issue is replacing."""
    parts, calls, _ = _run(tmp_path, _cuda_tree(tmp_path), DEVICE="cuda")
    assert "fastest kernels: --stem fused --stage2 fused" in parts
    stages = next(c for c in calls if "bench model --model jishnet" in c)
    assert stages.endswith("--stem fused --stage2 fused --stages --repeats 10 --max-batch "
                           "--cuda-graph")
    train = next(c for c in calls if "bench train" in c and "--model jishnet" in c)
    assert "model.stem=" not in train  # the config's auto: fused on CUDA


def test_the_scans_start_with_the_graphed_torch_layers_at_the_minibatches_asked(tmp_path):
    """``SCAN_TOO=1``: issue 36's scan (the torch layers with the step's graph and the
    table cache) before spconv's and the torch layers' without the graph, each at
    ``SCAN_BATCHES``."""
    parts, calls, _ = _run(tmp_path, _cuda_tree(tmp_path), DEVICE="cuda", SCAN_TOO="1",
                           SCAN_BATCHES="7,28,112")
    scans = [c for c in calls if "gpu_bench" in c and "minibatch" in c]
    assert [c.split("--only ")[1].split()[0] for c in scans] == [
        "minibatch-scnet-torch-graph", "minibatch-scnet,minibatch-scnet-torch"]
    assert all(c.endswith("--scan-seeds 0 --scan-seconds 30 --scan-batches 7,28,112")
               for c in scans)
    assert parts[-1].startswith("done")
