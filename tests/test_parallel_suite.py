"""`make test` runs the suite under pytest-xdist with each file on one worker, the files
that start the local SLURM together on one (tests/conftest.py), and a lock keeps two test
sessions on one host (two checkouts) from sharing the SLURM (tests/slurm_harness.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import SLURM_FILES

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_that_starts_slurm_is_in_the_one_unit():
    starts = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
              if re.search(r"^import slurm_harness|^from slurm_harness |mark\.slurm\b",
                           p.read_text(), re.M)}
    assert starts == set(SLURM_FILES), "tests/conftest.py SLURM_FILES: " + str(sorted(starts))


def test_the_slurm_files_run_on_one_worker(tmp_path):
    """pytest -n 2 --dist loadfile (as `make test`) with this conftest, on stand-in files
    named like the SLURM ones and two others: each test records its worker."""
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    body = textwrap.dedent("""
        import os, time
        import pytest

        @pytest.mark.parametrize("i", range(3))
        def test_record(i):
            time.sleep(0.2)
            with open(os.environ["RECORD"], "a") as f:
                f.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
    """)
    names = [Path(f).stem for f in SLURM_FILES] + ["test_other_a", "test_other_b"]
    for name in names:
        (tests / f"{name}.py").write_text(body)
    record = tmp_path / "record.txt"
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile",
                        "-p", "no:cacheprovider", "-q", "tests"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "RECORD": str(record)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for line in record.read_text().splitlines():
        module, worker = line.split()
        workers.setdefault(module, set()).add(worker)
    assert set(workers) == set(names) and all(len(w) == 1 for w in workers.values())
    slurm = [next(iter(workers[Path(f).stem])) for f in SLURM_FILES]
    assert len(set(slurm)) == 1, workers
    # and the run was parallel: the other files did not all follow them on that worker
    assert {next(iter(w)) for w in workers.values()} == {"gw0", "gw1"}, workers


def test_a_second_session_waits_for_the_local_slurm(tmp_path, monkeypatch):
    """Two suites on one host (two checkouts): the second's start() waits for the lock
    the first holds from start() to stop(), and says so when it gives up."""
    import fcntl

    import pytest
    import slurm_harness as sh

    monkeypatch.setattr(sh, "LOCK", tmp_path / "slurm.lock")
    first = (tmp_path / "slurm.lock").open("a")  # the other session
    fcntl.flock(first, fcntl.LOCK_EX)
    t0 = time.monotonic()
    with pytest.raises(sh.SlurmUnavailable, match="another test session has held"):
        sh._take_lock(1.5)
    assert time.monotonic() - t0 >= 1.5 and sh._held is None
    first.close()  # the other session stops
    sh._take_lock(1.5)
    try:
        assert sh._held is not None
        with pytest.raises(BlockingIOError):  # now this session holds it
            fcntl.flock((tmp_path / "slurm.lock").open("a"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        sh._drop_lock()
    assert sh._held is None
