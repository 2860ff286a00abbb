"""``jobs/env/install_spconv.sh`` (``make install``): the spconv build matching torch,
whatever builds are there before, run against a stand-in interpreter that reports
torch's CUDA and pip's list and records what pip is asked to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "jobs" / "env" / "install_spconv.sh"


def _run(tmp_path: Path, cuda: str, installed: list[str]) -> list[str]:
    """The pip commands the script runs (besides ``list``), one line each."""
    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    listing = "\\n".join(installed)
    fake.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == -c ]]; then echo "{cuda}"; exit 0; fi
if [[ "$1" == - ]]; then exec {sys.executable} "$@"; fi
if [[ "$1 $2 $3" == "-m pip list" ]]; then printf '{listing}\\n'; exit 0; fi
shift 2; echo "$*" >> {log}
""")
    fake.chmod(0o755)
    r = subprocess.run(["bash", str(SCRIPT), str(fake), "auto"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("cuda,installed,pip", [
    # the CPU build and a CUDA one side by side on a CPU host: the CUDA one goes
    ("", ["spconv==2.3.8", "spconv-cu126==2.3.8"], ["uninstall -q -y spconv-cu126"]),
    # the wanted build, too old: replaced
    ("", ["spconv==2.3.5"], ["uninstall -q -y spconv", "install -q spconv>=2.3.6"]),
    # none: the build of torch's CUDA
    ("12.4", [], ["install -q spconv-cu124>=2.3.6"]),
    # the right one already: nothing
    ("12.6", ["spconv-cu126==2.3.8"], []),
    # a CPU build on a CUDA host and an older CUDA build: both go
    ("12.8", ["spconv==2.3.8", "spconv-cu120==2.3.6"],
     ["uninstall -q -y spconv spconv-cu120", "install -q spconv-cu126>=2.3.6"]),
])
def test_the_build_matching_torch_and_no_other(tmp_path, cuda, installed, pip):
    assert _run(tmp_path, cuda, installed) == pip
