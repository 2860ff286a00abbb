"""The Makefile's install stamp: ``make test`` / ``make demo`` install only when the venv
lacks the install or a file that defines it is newer (an installed venv runs them with
no package index); ``make install`` always installs. Dry runs (``make -n``) of a venv
in a temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _plan(target: str, venv: Path) -> str:
    r = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_an_installed_venv_is_not_reinstalled(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    for target in ("test", "demo"):  # no stamp: the install first
        assert "pip install -q -e" in _plan(target, venv)
    stamp = venv / ".lartpc-installed"
    stamp.touch()
    for target in ("test", "demo"):
        plan = _plan(target, venv)
        assert "pip install" not in plan and "install_spconv" not in plan
        assert "pytest" in plan or "lartpc.jobs.local.study" in plan
    assert f"rm -f {stamp}" in _plan("install", venv)  # always, when asked (the stamp
    # removed, then the install made; a dry run cannot show the second)
    old = (ROOT / "pyproject.toml").stat().st_mtime - 10
    os.utime(stamp, (old, old))  # a file the install reads is newer than the stamp
    assert "pip install -q -e" in _plan("test", venv)
