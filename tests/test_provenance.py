"""``run.json``'s ``git_sha``: the commit of the lartpc checkout the code runs from,
marked ``+dirty`` where tracked files differ from it, and "unknown" where the package is
not in its own checkout (a pip install inside some other git repository)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "lartpc" / "runfolder" / "provenance.py"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                           "user.email=t@t", *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def _repo(tmp_path: Path, project: str) -> Path:
    """A git repository holding a project named ``project`` with lartpc's provenance
    module at lartpc's place, one commit."""
    repo = tmp_path / "repo"
    (repo / "lartpc" / "runfolder").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(f'[project]\nname = "{project}"\n')
    shutil.copy(SOURCE, repo / "lartpc" / "runfolder" / "provenance.py")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def _sha(repo: Path) -> str:
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('p', "
            "sys.argv[1]); m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(m.git_sha())")
    return subprocess.run([sys.executable, "-c", code,
                           str(repo / "lartpc" / "runfolder" / "provenance.py")],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_the_checkouts_commit_and_its_changes(tmp_path):
    repo = _repo(tmp_path, "lartpc")
    head = _git(repo, "rev-parse", "HEAD")
    assert _sha(repo) == head
    (repo / "pyproject.toml").write_text('[project]\nname = "lartpc"\nversion = "2"\n')
    assert _sha(repo) == head + "+dirty"
    (repo / "notes.txt").write_text("untracked: not a change to the code\n")
    _git(repo, "checkout", "--", "pyproject.toml")
    assert _sha(repo) == head


def test_a_package_inside_another_projects_repository_is_unknown(tmp_path):
    assert _sha(_repo(tmp_path, "someone-elses")) == "unknown"
    repo = _repo(tmp_path / "b", "lartpc")
    shutil.rmtree(repo / ".git")  # a copy of the tree, no repository
    assert _sha(repo) == "unknown"
