"""`python -m lartpc.jobs.local.gpu_bench`: the one-command GPU measurement set. Its plan for a
CUDA host is checked option by option; on CPU every step that a CPU can run runs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from lartpc.jobs.local.gpu_bench import plan
from train_helpers import HEAVY_TIMEOUT_S, clean_env


def _args(device: str) -> argparse.Namespace:
    return argparse.Namespace(device=device, size=3600, repeats=10, warmup=3, events=700,
                              train_seconds=120, scan_seconds=90, batches="7,14,28,56,112,256",
                              scan_seeds="0,1", out=Path("gb"), quick=False)


def test_cuda_plan_measures_every_issue_target():
    steps = {name: argv for name, argv, _ in plan(_args("cuda"))}
    assert all(argv is not None for argv in steps.values())
    last = steps["model-jishnet-compile"]
    for flag in ("--elu-after-pool", "--cudnn-benchmark", "--channels-last", "--compile"):
        assert flag in last
    assert last[last.index("--amp") + 1] == "bf16" and "--size" in last
    assert steps["model-scnet-implicit-gemm-fp16"][-3:] == ["--algo", "implicit_gemm",
                                                            "--half"]
    for name in ("train-jishnet-blosc", "train-jishnet-device-dense", "train-scnet-sparse",
                 "train-scnet-sparse-torch"):
        argv = steps[name]
        assert argv[argv.index("--device") + 1] == "cuda"
        assert argv[argv.index("--downsample") + 1] == "1"
        # one plain process per training: a GPU host need not have Horovod built
        assert argv[argv.index("--backend") + 1] == "none"
    # SCNet's fastest measured option (float32 implicit GEMM: 952 against 660 images/s
    # in float16 on an H200), not the float16 trunk, whose training step failed there
    assert "model.algo=implicit_gemm" in steps["train-scnet-sparse"]
    assert "train.amp=fp16" not in steps["train-scnet-sparse"]
    assert "train.amp=fp16" not in steps["minibatch-scnet"]
    # SCNet's layers in torch operations, their tables built in the loader's thread
    torch_train = steps["train-scnet-sparse-torch"]
    assert "model.sparse=torch" in torch_train and "data.rulebooks=loader" in torch_train
    assert steps["model-scnet-torch"][-2:] == ["--sparse", "torch"]
    graphed = steps["train-scnet-sparse-torch-graph"]  # the same, replayed as a CUDA graph
    assert graphed[:len(torch_train)] == torch_train and "train.cuda_graph=true" in graphed
    for name in ("minibatch-scnet", "minibatch-scnet-torch"):
        scan = steps[name]
        assert scan[scan.index("--batch-per-rank") + 1] == "7,14,28,56,112,256"
    assert "model.sparse=torch" in steps["minibatch-scnet-torch"]
    assert "model.algo=implicit_gemm" not in steps["minibatch-scnet-torch"]
    assert steps["minibatch-scnet-torch"].count("--out") == 1


def test_cpu_plan_skips_only_what_spconv_cpu_cannot_run():
    skipped = {name: why for name, argv, why in plan(_args("cpu")) if argv is None}
    # and the fused stem (a Triton kernel for CUDA) and GPU memory; the library's
    # stage breakdown runs
    assert list(skipped) == ["model-jishnet-fused-stem", "model-jishnet-fused-stem-compile",
                             "stages-jishnet-fused", "maxbatch-jishnet-library",
                             "maxbatch-jishnet-fused", "model-scnet-implicit-gemm",
                             "model-scnet-implicit-gemm-fp16", "model-scnet-torch-graph"]
    assert all(skipped.values())  # each says why


@pytest.mark.slow
@pytest.mark.timeout(HEAVY_TIMEOUT_S)
def test_quick_cpu_run_measures_every_step(tmp_path):
    out = tmp_path / "gb"
    r = subprocess.run([sys.executable, "-m", "lartpc.jobs.local.gpu_bench", "--out", str(out),
                        "--device", "cpu", "--quick"], capture_output=True, text=True,
                       timeout=HEAVY_TIMEOUT_S - 100,  # 607 s beside a busy loop (2026-11-29)
                       env=clean_env(), cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "failures.json").read_text()) == []
    compiled = json.loads((out / "model-jishnet-compile.json").read_text())
    assert compiled["compile"] is True and compiled["amp"] == "bf16"
    assert compiled["achieved_tflops"] > 0 and compiled["fraction_of_peak"] is None
    stages = json.loads((out / "stages-jishnet-library.json").read_text())["stages"]
    assert len(stages) == 5 and all(s["forward_backward_ms"] > 0 for s in stages)
    for name in ("train-jishnet-blosc", "train-jishnet-device-dense", "train-scnet-sparse",
                 "train-scnet-sparse-torch"):
        point = json.loads((out / f"{name}.json").read_text())["points"][0]
        assert point["steps"] > 1 and 0 <= point["data_wait_fraction"] < 1
    assert point["sparse"] == "torch" and point["rulebooks"] == "loader"
    assert point["table_cache"] is False  # data.table_cache, off by default
    assert point["cuda_graph"] is None
    graphed = json.loads((out / "train-scnet-sparse-torch-graph.json").read_text())["points"][0]
    # on a CPU the padded step without a graph: every step static, none captured
    assert graphed["cuda_graph"]["steps"] > 1 and graphed["cuda_graph"]["captures"] == 0
    assert {p["loader"] for n in ("blosc", "device-dense") for p in json.loads(
        (out / f"train-jishnet-{n}.json").read_text())["points"]} == {"blosc", "device-dense"}
    for folder in ("minibatch", "minibatch-torch", "minibatch-torch-graph"):
        assert (out / folder / "minibatch.png").exists()
    summary = (out / "summary.md").read_text()
    assert "skipped: spconv's CPU build" in summary and "failed" not in summary
    # the file to commit under docs/results/: one object per measurement
    res = json.loads((out / "results.json").read_text())
    assert "device: cpu" in res["environment"] and res["date"].count("-") == 2
    ms = res["measurements"]
    for m in ms:
        assert m["model"] in ("jishnet", "scnet") and m["device_name"] == "cpu"
        assert m["images_per_s"] > 0 and isinstance(m["options"], dict)
    names = [m["name"] for m in ms]
    assert names.count("minibatch-scnet") == 2  # one per minibatch of --quick's 4,8
    assert sorted(m["options"]["train.batch_per_rank"] for m in ms
                  if m["name"] == "minibatch-scnet") == [4, 8]
    scan_torch = [m for m in ms if m["name"] == "minibatch-scnet-torch"]
    assert sorted(m["options"]["train.batch_per_rank"] for m in scan_torch) == [4, 8]
    assert all(m["options"]["model.sparse"] == "torch" for m in scan_torch)
    scan_graph = [m for m in ms if m["name"] == "minibatch-scnet-torch-graph"]
    assert sorted(m["options"]["train.batch_per_rank"] for m in scan_graph) == [4, 8]
    assert all(m["options"]["train.cuda_graph"] == "true" and m["options"]["data.table_cache"]
               == "true" and m["options"]["data.prefetch_threads"] == "3" for m in scan_graph)
    dense = next(m for m in ms if m["name"] == "train-jishnet-device-dense")
    assert dense["options"]["data.loader"] == "device-dense"
    assert 0 <= dense["data_wait_fraction"] < 1


def _gpu_bench(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc.jobs.local.gpu_bench", *argv],
                          capture_output=True, text=True, timeout=600, env=clean_env(**env),
                          cwd=Path(__file__).resolve().parents[1])


def test_cuda_steps_where_torch_sees_no_gpu_launch_nothing_and_say_why(tmp_path):
    """--device cuda (the default) on a CPU host launched 13 model benches that each
    failed; why (no CUDA device) was only in failures.json."""
    out = tmp_path / "gb"
    (out / "model-scnet-default.json").parent.mkdir()  # kept from an earlier GPU run
    (out / "model-scnet-default.json").write_text(json.dumps({"name": "model-scnet-default",
                                                              "images_per_s": 9.0}))
    r = _gpu_bench("--out", str(out), "--only", "model-*", CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 1
    line = "torch sees no CUDA device: every --device cuda step needs one, none is run"
    assert line in r.stderr and "lartpc bench" not in r.stderr  # no step launched
    assert "model-scnet-default: kept" in r.stderr
    summary = (out / "summary.md").read_text()
    assert summary.startswith(line)
    names = [n for n, *_ in plan(_args("cuda")) if n.startswith("model-")]
    assert summary.count("skipped: torch sees no CUDA device") == len(names) - 1
    assert "| model-scnet-default | 9.0 |" in summary and "failed" not in summary
    assert json.loads((out / "failures.json").read_text()) == []
    assert [f.name for f in out.glob("model-*.json")] == ["model-scnet-default.json"]


@pytest.mark.slow
def test_steps_run_in_parts_into_one_folder_and_none_runs_twice(tmp_path):
    """--only picks steps by glob; a second call into the same --out keeps what the
    first measured (its JSON untouched) and the summary covers both calls' steps."""
    out = tmp_path / "gb"
    r = _gpu_bench("--out", str(out), "--device", "cpu", "--quick", "--only",
                   "model-scnet-*")
    assert r.returncode == 0, r.stderr[-3000:]
    # the CPU runs spconv's default and the torch layers; the rest need CUDA
    assert sorted(f.name for f in out.glob("model-*.json")) == ["model-scnet-default.json",
                                                                "model-scnet-torch.json"]
    first = (out / "model-scnet-default.json").read_text()
    r = _gpu_bench("--out", str(out), "--device", "cpu", "--quick", "--only",
                   "model-scnet-default,model-jishnet-published", "--results",
                   str(tmp_path / "docs" / "gpu.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "docs" / "gpu.json").read_text())
    assert [m["name"] for m in res["measurements"]] == ["model-jishnet-published",
                                                       "model-scnet-default",
                                                       "model-scnet-torch"]
    assert "model-scnet-default: kept" in r.stderr
    assert (out / "model-scnet-default.json").read_text() == first
    summary = (out / "summary.md").read_text()
    assert "| model-jishnet-published |" in summary and "| model-scnet-default |" in summary
    assert summary.index("model-jishnet-published") < summary.index("model-scnet-default")


@pytest.mark.slow
def test_outputs_never_follow_links_planted_in_out(tmp_path):
    """--out may be an earlier run's folder: the step JSON, summary.md, failures.json,
    results.json and --results were written with write_text, through planted links."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data\n")
    outside = tmp_path / "outside.json"
    out = tmp_path / "gb"
    out.mkdir()
    for name in ("summary.md", "failures.json", "results.json"):
        (out / name).symlink_to(victim)
    (out / "model-jishnet-published.json").symlink_to(outside)  # dangling: the step runs
    results = tmp_path / "docs" / "gpu.json"
    results.parent.mkdir()
    results.symlink_to(victim)
    r = _gpu_bench("--out", str(out), "--device", "cpu", "--quick", "--only",
                   "model-jishnet-published", "--results", str(results))
    assert r.returncode == 0, r.stderr[-3000:]
    assert victim.read_text() == "precious data\n" and not outside.exists()
    for f in (*(out / n for n in ("summary.md", "failures.json", "results.json",
                                   "model-jishnet-published.json")), results):
        assert not f.is_symlink()
    step = json.loads((out / "model-jishnet-published.json").read_text())
    assert step["name"] == "model-jishnet-published" and step["images_per_s"] > 0
    assert json.loads(results.read_text()) == json.loads((out / "results.json").read_text())
    assert "| model-jishnet-published |" in (out / "summary.md").read_text()


def test_only_that_matches_nothing_and_list():
    r = _gpu_bench("--out", "unused", "--only", "model-resnet*")
    assert r.returncode == 2 and "matches no step" in r.stderr
    r = _gpu_bench("--list", "--device", "cpu")
    assert r.returncode == 0
    assert "model-scnet-implicit-gemm: skipped: spconv's CPU build" in r.stdout
    assert "minibatch-scnet: lartpc bench minibatch" in r.stdout
