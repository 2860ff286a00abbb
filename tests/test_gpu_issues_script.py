"""``jobs/local/gpu_issues.sh``'s own logic, with a stand-in for Python that records its
calls: every part runs and is logged even when one fails, ``DEADLINE_S`` stops the
running part and skips the rest, and ``PACK`` packs the folder into one archive (the lent
GPU machine returns at most 8 files from a call)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "jobs/local/gpu_issues.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
case "$*" in
    *gpu_bench*) sleep "${FAKE_SLEEP:-0}"; exit "${FAKE_RC:-0}" ;;
esac
echo '{"flags": ""}'
"""


def _run(tmp_path: Path, **env) -> tuple[list[str], list[str], Path]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log, out, pack = tmp_path / "calls.log", tmp_path / "gi", tmp_path / "back/gi.tar.gz"
    full = {**os.environ, "DEVICE": "cpu", "PYTHON": str(fake), "FAKE_LOG": str(log),
            "PACK": str(pack), "EVENTS_DIR": str(tmp_path), **env}
    subprocess.run(["bash", str(SCRIPT), str(out)], env=full, check=True, timeout=120,
                   capture_output=True)
    parts = (out / "parts.txt").read_text().splitlines()
    return parts, log.read_text().splitlines(), pack


def test_every_part_runs_and_a_failure_is_logged(tmp_path):
    parts, calls, pack = _run(tmp_path, FAKE_RC="3")
    names = [p.split(":")[0] for p in parts]
    assert names == ["env", "events", "loader-probe", "train-scnet-torch-graph-threads-3",
                     "train-scnet-torch-graph-threads-1", "gpu-tests",
                     "train-scnet-torch-graph-threads-3-fused-adam",
                     "train-scnet-torch-graph-processes-8",
                     "gpu-bench-train-scnet-sparse", "gpu-bench-model-scnet-default", "done"]
    assert "gpu-bench-train-scnet-sparse: exit 3" in "\n".join(parts)
    assert "env: exit 0" in "\n".join(parts)
    assert sum("gpu_bench" in c for c in calls) == 2
    events = str(tmp_path / "events")  # one store, made once, read by 1a and both trainings
    assert [c for c in calls if events in c][0].startswith("-m lartpc simulate")
    assert sum(events in c for c in calls) == 6
    trainings = [c for c in calls if "bench train" in c]
    assert [c.split("data.")[-1].split()[0] for c in trainings] == [
        "prefetch_threads=3", "prefetch_threads=1", "prefetch_threads=3", "loader_processes=8"]
    assert all("train.cuda_graph=true" in c for c in trainings)
    assert ["train.optimizer_impl=fused" in c for c in trainings] == [False, False, True, False]
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
