"""What `pip install -e .` brings: every core dependency is imported by the package,
Horovod's runtime needs only come with the `horovod` extra."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MODULE = {"pyyaml": "yaml"}  # distribution name -> import name, where they differ


def _deps(items: list[str]) -> list[str]:
    return [re.split(r"[<>=;\[ ]", d, maxsplit=1)[0].strip().lower() for d in items]


def _imported() -> set[str]:
    names = set()
    for folder in ("lartpc", "analysis", "jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"^\s*(?:from|import) ([A-Za-z_]\w*)", path.read_text(),
                                    re.M))
    return names


def test_core_dependencies_are_all_imported_and_horovod_is_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _deps(project["dependencies"])
    extras = project["optional-dependencies"]
    imported = _imported()
    unused = [d for d in core if MODULE.get(d, d) not in imported]
    assert unused == [], f"declared but never imported: {unused}"
    assert {"cloudpickle", "psutil", "pyyaml", "cffi", "packaging"}.isdisjoint(core)
    assert set(_deps(extras["horovod"])) == {"cloudpickle", "psutil", "pyyaml", "packaging",
                                             "cffi"}
    assert {"test", "gpu", "horovod"} <= set(extras)
