"""One namespace: analysis/ and jobs/ are installed as lartpc.analysis and lartpc.jobs,
nothing imports a top-level `analysis` or `jobs`, and a user's own `analysis` package
cannot change what `lartpc analyze` runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_packaging import ROOT, tomllib

BIN = Path(sys.executable).parent


def test_the_installed_subpackages_are_this_checkout():
    """An editable install made from another checkout would map lartpc.analysis there:
    tests must run against the code beside them (run `pip install -e .` here)."""
    import lartpc.analysis
    import lartpc.jobs

    assert Path(lartpc.analysis.__file__).parent == ROOT / "analysis"
    assert Path(lartpc.jobs.__file__).parent == ROOT / "jobs"


def test_nothing_imports_a_top_level_analysis_or_jobs():
    files = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True,
                           cwd=ROOT, check=True).stdout.split()
    hits = [f"{f}:{n}" for f in files if (ROOT / f).exists()
            for n, line in enumerate((ROOT / f).read_text().splitlines(), 1)
            if re.match(r"^\s*(from|import) (analysis|jobs)\b", line)]
    assert hits == []


def test_every_package_folder_is_installed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {v: k for k, v in setuptools["package-dir"].items()}
    want = set()
    for init in [*ROOT.glob("lartpc/**/__init__.py"), *ROOT.glob("analysis/**/__init__.py"),
                 *ROOT.glob("jobs/**/__init__.py")]:
        parts = init.parent.relative_to(ROOT).parts
        top = dirs.get(parts[0], parts[0])
        want.add(".".join([top, *parts[1:]]))
    assert want == set(setuptools["packages"])


def test_a_users_own_analysis_package_does_not_shadow_ours(tmp_path):
    fake = tmp_path / "analysis"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('the user analysis package ran')\n")
    (fake / "__main__.py").write_text("print('the user analysis package ran')\n")
    res = subprocess.run([str(BIN / "lartpc"), "analyze", "fit", str(tmp_path / "none")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "user analysis package" not in res.stdout + res.stderr
    assert res.returncode == 2 and "lartpc analyze: error:" in res.stderr
    res = subprocess.run([sys.executable, "-m", "lartpc.analysis", "fit", "--help"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "user analysis package" not in res.stdout


def test_analyze_imports_no_torch(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from lartpc.cli import main\n"
            f"sys.exit(main(['analyze', 'fit', {str(tmp_path)!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    assert "lartpc analyze: error:" in res.stderr and "not a run folder" in res.stderr
    assert "Traceback" not in res.stderr  # torch blocked: an import of it would raise
