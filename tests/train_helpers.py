"""Running ``lartpc train`` in subprocesses for the training tests."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

#: pytest-timeout's limit (pyproject: 600 s) guards against hangs. The heaviest tests
#: (the beam headline rescored on 1,500 regenerated full-resolution events, gpu_bench
#: --quick, bench model --compile) took 114-290 s alone and 316 s beside one busy loop,
#: and passed 600 s with two more test processes beside the suite: they get this one
#: (and the second stage's stem_check on CPU, 340 s beside a busy loop, 2026-11-29).
HEAVY_TIMEOUT_S = 1800

BIN = Path(sys.executable).parent


def launcher(name: str) -> str:
    """The path of launcher ``name`` (horovodrun, torchrun) beside the interpreter or on
    PATH; missing, the test fails saying how to get it (never a silent skip)."""
    import shutil

    import pytest

    exe = BIN / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found next to {sys.executable} or on PATH: run `make install`")
    return found
LAUNCHER_VARS = ("HOROVOD_", "OMPI_", "PMI", "SLURM_", "TORCHELASTIC", "JSM_")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (tests start their own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra)
    return env


def train_cmd(data: Path, out: Path, *sets: str, config: str = "tiny-jishnet") -> list[str]:
    """``lartpc train`` on 400x400 test events (downsample 9), short, deterministic."""
    base = ["data.downsample=9", "data.eval_fraction=0.2", "train.epochs=2",
            "train.log_flush_steps=1", "train.threads=1"]
    cmd = [str(BIN / "lartpc"), "train", "--config", config, "--data", str(data),
           "--out", str(out)]
    for s in (*base, *sets):
        cmd += ["--set", s]
    return cmd


def torchrun_train_cmd(data: Path, out: Path, *sets: str, ranks: int = 2,
                       config: str = "tiny-jishnet") -> list[str]:
    """:func:`train_cmd` on ``ranks`` torchrun ranks (the torch backend, DDP), lartpc run
    as a module."""
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={ranks}", "-m",
            "lartpc", *train_cmd(data, out, *sets, config=config)[1:]]


def run(cmd: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=clean_env(**env))


def kill_after_steps(cmd: list[str], out: Path, steps: int, timeout_s: float = 240) -> None:
    """Start ``cmd`` (a training into ``out``) and SIGKILL it once rank 0 has logged
    ``steps`` rows: a job lost mid-run, as a node failure leaves it."""
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    log = out / "rank-000.csv"
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) - 1 >= steps:
            break
        time.sleep(0.05)
    # a run that ended first was not lost mid-run: the caller's premise does not hold
    assert proc.poll() is None, f"{out}: the training ended (exit {proc.returncode}) " \
        f"before it could be killed after {steps} steps"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]
