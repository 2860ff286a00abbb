"""An event store is replaced whole (issue 38, N7): one writer at a time, the new store
swapped in by one rename, staging folders of killed writers removed by the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from lartpc.cli import main
from lartpc.data import EventStore
from lartpc.sim import write_dataset

SIM = ["--downsample", "9", "--shard-size", "2"]
#: ``lartpc`` whose generator waits for a line on stdin before event 3 (it says
#: "writing" first): a writer caught in the middle of its store.
PAUSED = """
import sys
import lartpc.sim.generate as gen
real = gen.simulate_event
def paused(index, *a, **k):
    if index == 3:
        print("writing", flush=True)
        sys.stdin.readline()
    return real(index, *a, **k)
gen.simulate_event = paused
from lartpc.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: ``lartpc`` killed (SIGKILL) at a point of the store's replacement: argv[1] says which.
KILLED = """
import os, signal, sys
from pathlib import Path
import lartpc.data.staging as st
def die():
    os.kill(os.getpid(), signal.SIGKILL)
when, out = sys.argv[1], str(Path(sys.argv[2]).resolve())
real_exchange = getattr(st, "exchange", None)  # None: a lartpc without it
real_rename, real_replace = os.rename, os.replace
def exchange(a, b):
    if when == "before-swap":
        die()
    if when == "between-renames":  # a filesystem without RENAME_EXCHANGE
        return False
    done = real_exchange(a, b)
    if when == "after-swap":
        die()
    return done
def rename(a, b, *rest, **kw):
    if when == "between-renames" and str(b) == out:
        die()
    return real_rename(a, b, *rest, **kw)
def replace(a, b, *rest, **kw):  # what replaced the store shard by shard before
    if os.path.dirname(os.path.abspath(b)) == out and when == "second-shard":
        replace.n = getattr(replace, "n", 0) + 1
        if replace.n == 2:
            die()
    return real_replace(a, b, *rest, **kw)
st.exchange, os.rename, os.replace = exchange, rename, replace
from lartpc.cli import main
sys.exit(main(["simulate", "--out", out, *sys.argv[3:]]))
"""


def _seeds(out: Path) -> list[int]:
    """The generator seed of every shard in ``out``."""
    seeds = []
    for p in EventStore(out).paths:
        with h5py.File(p, "r") as f:
            seeds.append(int(f.attrs["seed"]))
    return seeds


def _beside(out: Path) -> list[str]:
    """What lies beside ``out`` in its parent (staging folders, locks)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


@pytest.fixture
def old_store(tmp_path) -> Path:
    """A store of 8 events (4 shards, seed 1) with a user's note beside its shards."""
    out = tmp_path / "store" / "E"
    write_dataset(out, 8, seed=1, downsample=9, shard_size=2)
    (out / "notes.txt").write_text("mine")
    return out


def _killed(when: str, out: Path, *argv: str) -> int:
    r = subprocess.run([sys.executable, "-c", KILLED, when, str(out), *argv],
                       capture_output=True, text=True, timeout=120)
    return r.returncode


def test_kill_during_overwrite_never_leaves_a_mixed_store(old_store):
    """The shards were renamed into the store one by one: a kill after the second left
    2 new shards among the old ones, which inspect and train accepted."""
    rc = _killed("second-shard", old_store, "--events", "4", "--seed", "2", *SIM,
                 "--overwrite")
    assert rc in (0, -signal.SIGKILL)
    assert _seeds(old_store) in ([1, 1, 1, 1], [2, 2])
    assert (old_store / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("when,seeds", [("before-swap", [1, 1, 1, 1]),
                                        ("after-swap", [2, 2]),
                                        ("between-renames", None)])
def test_killed_at_the_swap_one_whole_store_and_the_next_writer_cleans_up(old_store, when,
                                                                          seeds, capsys):
    assert _killed(when, old_store, "--events", "4", "--seed", "2", *SIM,
                   "--overwrite") == -signal.SIGKILL
    if seeds is None:  # killed between renaming the old store aside and the new one in
        assert not old_store.exists()
    else:
        assert _seeds(old_store) == seeds
    assert any(n.endswith(".lartpc-tmp") for n in _beside(old_store))
    # the next writer, refused (no --overwrite), first puts back what the dead one left
    assert main(["simulate", "--out", str(old_store), "--events", "2", "--seed", "3",
                 *SIM]) == 2
    assert "already holds" in capsys.readouterr().err
    assert _seeds(old_store) == (seeds or [1, 1, 1, 1])
    assert (old_store / "notes.txt").read_text() == "mine"
    assert _beside(old_store) == []


def test_second_writer_is_refused_while_the_first_writes(tmp_path, capsys):
    """Two simulate runs into one folder both exited 0 and the first store vanished."""
    out = tmp_path / "E"
    first = subprocess.Popen([sys.executable, "-c", PAUSED, "simulate", "--out", str(out),
                              "--events", "6", "--seed", "1", *SIM],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "writing\n"
        assert main(["simulate", "--out", str(out), "--events", "4", "--seed", "2",
                     *SIM]) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: being written by another lartpc command, pid {first.pid} " \
               "on host" in err and err.count("\n") == 1, err
        first.stdin.write("\n")
        first.stdin.close()
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert _seeds(out) == [1, 1, 1] and len(EventStore(out)) == 6
    assert _beside(out) == []


def test_staging_folder_of_a_killed_writer_is_removed_by_the_next(old_store):
    """A kill while the shards were written left .E.*.lartpc-tmp folders nobody
    removed."""
    writer = subprocess.Popen([sys.executable, "-c", PAUSED, "simulate", "--out",
                               str(old_store), "--events", "6", "--seed", "2", *SIM,
                               "--overwrite"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    writer.kill()
    writer.wait(timeout=60)
    assert _seeds(old_store) == [1, 1, 1, 1]
    stale = [n for n in _beside(old_store) if n.endswith(".lartpc-tmp")]
    assert len(stale) == 1 and os.listdir(old_store.parent / stale[0])  # shards in it
    assert main(["simulate", "--out", str(old_store), "--events", "2", "--seed", "3", *SIM,
                 "--overwrite"]) == 0
    assert _seeds(old_store) == [3] and _beside(old_store) == []
    assert sorted(os.listdir(old_store)) == ["events-00000.h5", "notes.txt"]


def test_a_store_named_through_the_users_link_is_replaced_where_it_points(tmp_path):
    real = tmp_path / "disk" / "E"
    write_dataset(real, 4, seed=1, downsample=9, shard_size=2)
    link = tmp_path / "E"
    link.symlink_to(real, target_is_directory=True)
    write_dataset(link, 2, seed=2, downsample=9, shard_size=2, overwrite=True)
    assert link.is_symlink() and _seeds(real) == [2]
