"""Install a GPU bundle (made by ``python -m lartpc.jobs.gpu_bundle``) on an offline host.

Copied into the bundle as ``install.py`` and run by its ``install.sh``; standard library
only. Checks the Python version and every archive's SHA-256 against ``manifest.json``,
unpacks the archives into a staging folder beside TARGET and renames it into place (a
failed install leaves no half-filled TARGET), then imports the manifest's modules and,
with ``--require-cuda``, runs ``python -m lartpc env`` from the working tree and requires
spconv's CUDA build and blosc2 in its output.

Usage: ``bash gpu-bundle/install.sh [TARGET] [--require-cuda] [--repo DIR]``; TARGET
defaults to ``<bundle>/site``. Then ``export PYTHONPATH=<repo>:<TARGET>``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent
MARKER = ".lartpc-gpu-bundle.json"
#: what a manifest "checks" entry may be: a dotted module name, imported by name
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class InstallError(Exception):
    """Why the bundle cannot be installed here."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(bundle: Path, manifest: dict, python: tuple[int, int]) -> None:
    """Refuse another Python's bundle, a missing or altered archive."""
    want = tuple(int(x) for x in manifest["python"].split("."))
    if want != python:
        raise InstallError(f"{bundle}/manifest.json: made for Python "
                           f"{manifest['python']}, this is {python[0]}.{python[1]}")
    for p in manifest["packages"]:
        path = bundle / p["archive"]
        if not path.is_file():
            raise InstallError(f"{path}: missing (listed in manifest.json)")
        if sha256(path) != p["archive_sha256"]:
            raise InstallError(f"{path}: SHA-256 differs from manifest.json (damaged copy?)")


def _safe_members(tf: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    members = tf.getmembers()
    for m in members:
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
            raise InstallError(f"{archive}: member {m.name!r} would land outside the target")
    return members


@contextlib.contextmanager
def staged(stage: Path, target: Path) -> Iterator[Path]:
    """Fill ``stage`` in the block; then it replaces ``target``. On any failure the stage
    is removed and ``target`` stays as it was (the builder uses this too)."""
    try:
        yield stage
        if target.exists():
            shutil.rmtree(target)
        stage.rename(target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def unpack(bundle: Path, manifest: dict, target: Path) -> None:
    """Unpack every archive into ``target`` (staged, then renamed into place)."""
    if target.exists() and not (target / MARKER).is_file():
        raise InstallError(f"{target}: exists and was not made by this installer; "
                           "choose another TARGET")
    # a fresh folder of our own beside TARGET (never a fixed name that may be someone's)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.",
                                  suffix=".lartpc-tmp"))
    with staged(stage, target):
        for p in manifest["packages"]:
            archive = bundle / p["archive"]
            with tarfile.open(archive, "r:xz") as tf:
                members = _safe_members(tf, archive)
                # the "data" filter (Python >= 3.11.4) re-checks paths and modes
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tf.extractall(stage, members=members, **safe)
        record = {k: manifest[k] for k in ("python", "created")}
        record["packages"] = [f"{p['name']}=={p['version']}" for p in manifest["packages"]]
        (stage / MARKER).write_text(json.dumps(record, indent=1) + "\n")


def _run(code: list[str], pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath))
    return subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env)


def check(manifest: dict, target: Path, repo: Path | None, require_cuda: bool) -> list[str]:
    """Import the manifest's modules from ``target``; with ``require_cuda``, ``lartpc env``
    must show spconv's CUDA build and blosc2. Returns the lines it reports."""
    lines = []
    for module in manifest.get("checks", []):
        if not isinstance(module, str) or not MODULE_NAME.fullmatch(module):
            raise InstallError(f"manifest.json: checks entry {module!r} is not a module "
                               "name; refusing to run it")
        # the name is data, never pasted into code
        r = _run(["-c", "import importlib, sys; importlib.import_module(sys.argv[1])", module],
                 [target])
        if r.returncode != 0:
            raise InstallError(f"import {module} failed from {target}:\n{r.stderr.strip()[-1500:]}")
        lines.append(f"import {module}: ok")
    if require_cuda:
        if repo is None or not (repo / "lartpc" / "__init__.py").is_file():
            raise InstallError(f"--repo {repo}: not a lartpc working tree")
        r = _run(["-m", "lartpc", "env"], [repo, target])
        out = r.stdout
        if r.returncode != 0 or "spconv:" not in out:
            raise InstallError(f"lartpc env failed:\n{(r.stderr or out).strip()[-1500:]}")
        spconv = next(x for x in out.splitlines() if x.startswith("spconv:"))
        if "CUDA build" not in spconv or "cuda available: yes" not in out:
            raise InstallError(f"lartpc env: expected spconv's CUDA build on a CUDA device, "
                               f"got {spconv!r}")
        if "blosc2: " not in out or "blosc2: ?" in out:
            raise InstallError("lartpc env: blosc2 missing")
        lines += out.strip().splitlines()
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", type=Path, default=BUNDLE / "site")
    ap.add_argument("--require-cuda", action="store_true",
                    help="also require `lartpc env` to show spconv's CUDA build")
    ap.add_argument("--repo", type=Path, default=BUNDLE.parent,
                    help="the lartpc working tree (default: the bundle's parent folder)")
    args = ap.parse_args(argv)
    target = args.target.resolve()
    try:
        manifest = json.loads((BUNDLE / "manifest.json").read_text())
        verify(BUNDLE, manifest, sys.version_info[:2])
        unpack(BUNDLE, manifest, target)
        for line in check(manifest, target, args.repo.resolve(), args.require_cuda):
            print(line)
    except (InstallError, OSError, KeyError, ValueError) as e:
        print(f"install: error: {e}", file=sys.stderr)
        return 1
    print(f"installed into {target}\nexport PYTHONPATH={args.repo.resolve()}:{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
