"""``jobs/env/install_larcv.sh`` finds HDF5 where an HPC module or conda puts it
(``HDF5_ROOT`` and friends, ``CPATH``) before the system's folders, and keys its wheel
cache by that HDF5's version: run against a stand-in interpreter and a cached wheel, so
nothing is built or installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "jobs" / "env" / "install_larcv.sh"


def _hdf5(root: Path, version: tuple[int, int, int]) -> Path:
    inc = root / "include"
    inc.mkdir(parents=True)
    (inc / "hdf5.h").write_text("/* stand-in */\n")
    (inc / "H5public.h").write_text("".join(
        f"#define H5_VERS_{k} {v} /* */\n"
        for k, v in zip(("MAJOR", "MINOR", "RELEASE"), version, strict=True)))
    return inc


@pytest.mark.parametrize("where", ["HDF5_ROOT", "HDF5_DIR", "CPATH"])
def test_an_hdf5_outside_the_system_is_found_and_keys_the_cache(tmp_path, where):
    inc = _hdf5(tmp_path / "hdf5", (1, 14, 9))
    cache = tmp_path / "cache"
    key = cache / "larcv-3.5.1_cp311_numpy2_hdf5-1.14.9"
    key.mkdir(parents=True)
    (key / "larcv-3.5.1-cp311-cp311-linux_x86_64.whl").write_text("stand-in")
    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == -c ]]; then [[ "$2" == *numpy* ]] && echo 2 || echo cp311; exit 0; fi
if [[ "$1" == - ]]; then exit 1; fi  # larcv not installed
shift 2; echo "$*" >> {log}
""")
    fake.chmod(0o755)
    value = str(inc) if where == "CPATH" else str(inc.parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HDF5_ROOT", "HDF5_DIR", "HDF5_HOME", "CPATH", "C_INCLUDE_PATH")}
    r = subprocess.run(["bash", str(SCRIPT), str(fake)], capture_output=True, text=True,
                       timeout=60, env={**env, where: value, "LARTPC_WHEEL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    assert f"HDF5 headers in {inc}" in r.stdout
    assert log.read_text().split() == ["install", "--no-deps", "--force-reinstall",
                                       str(key / "larcv-3.5.1-cp311-cp311-linux_x86_64.whl")]
