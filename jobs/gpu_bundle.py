"""``make gpu-bundle``: what an offline GPU host lacks, repacked to travel small.

Many GPU compute nodes have no network, and the host this project is measured on takes
at most 64 MiB (working tree included) per call. This downloads the exact pins of
``jobs/env/gpu-bundle.txt`` as cp312 manylinux wheels (``pip download``, no dependency
resolution: the file names every dependency), and repacks each wheel as an xz tarball
of what installing it puts into site-packages. A wheel is a zip, and its one big member
(spconv's 284 MB extension) is stored deflated; xz at its highest preset shrinks that
library about 3x more than deflate, which is what makes the bundle fit.

The output folder (ignored by git) holds ``manifest.json`` (pins, file names, sizes and
SHA-256 of the wheels and archives), the archives, and ``install.sh``/``install.py``: run
``bash gpu-bundle/install.sh`` on the host, with no network, to unpack into
``gpu-bundle/site`` and check the imports (see ``jobs/gpu_bundle_install.py``).

Usage: ``python -m lartpc.jobs.gpu_bundle --out gpu-bundle [--wheels DIR] [--python 3.12]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# The installer runs alone on the host (stdlib only); the builder shares its checksum.
from lartpc.jobs.gpu_bundle_install import sha256, staged

HERE = Path(__file__).resolve().parent
PINS = HERE / "env" / "gpu-bundle.txt"
INSTALLER = HERE / "gpu_bundle_install.py"
#: What the bundle may weigh, leaving room for the working tree under the 64 MiB a call
#: to the GPU host carries.
BUDGET_BYTES = 56 * 2**20
#: What one call to the GPU host carries: the bundle and the working tree together.
CALL_BYTES = 64 * 2**20
#: Imported by the installer's check, in this order (after unpacking).
CHECKS = ("blosc2", "cumm", "spconv", "spconv.pytorch")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


class BundleError(Exception):
    """A bad pins file, a failed download, or a bundle over its budget."""


def read_pins(path: Path) -> list[tuple[str, str]]:
    """``(name, version)`` for each ``name==version`` line; comments and blanks skipped."""
    pins = []
    for no, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise BundleError(f"{path}:{no}: {line!r} is not an exact pin NAME==VERSION")
        pins.append((m.group(1), m.group(2)))
    if not pins:
        raise BundleError(f"{path}: no pins")
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(folder: Path, name: str, version: str) -> Path:
    """The one wheel of ``name==version`` in ``folder``."""
    found = [w for w in Path(folder).glob("*.whl")
             if _norm(w.name.split("-")[0]) == _norm(name) and w.name.split("-")[1] == version]
    if len(found) != 1:
        raise BundleError(f"{folder}: expected one wheel of {name}=={version}, found "
                          f"{[w.name for w in found] or 'none'}")
    return found[0]


def download(pins: list[tuple[str, str]], dest: Path, python: str) -> None:
    """``pip download`` every pin for CPython ``python`` on manylinux x86_64."""
    dest.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", *plat, "-d", str(dest),
           *(f"{n}=={v}" for n, v in pins)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BundleError("pip download failed:\n" + r.stderr.strip()[-2000:])


def _installed_name(member: str) -> str | None:
    """Where a wheel member lands in site-packages (None: not a library file).

    ``NAME.data/purelib`` and ``platlib`` go to the top; ``scripts``, ``headers`` and
    ``data`` are left out (nothing the study runs needs them).
    """
    top, _, rest = member.partition("/")
    if not top.endswith(".data"):
        return member
    kind, _, inner = rest.partition("/")
    return inner if kind in ("purelib", "platlib") and inner else None


def repack(wheel: Path, out_dir: Path) -> dict:
    """Write ``out_dir/<wheel stem>.tar.xz`` with the wheel's installed tree."""
    archive = out_dir / (wheel.name[:-len(".whl")] + ".tar.xz")
    files, skipped = 0, []
    with zipfile.ZipFile(wheel) as zf, \
            tarfile.open(archive, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = _installed_name(info.filename)
            if name is None:
                skipped.append(info.filename)
                continue
            ti = tarfile.TarInfo(name)
            ti.size = info.file_size
            ti.mode = (info.external_attr >> 16) & 0o777 or 0o644
            ti.mtime = int(datetime.datetime(*info.date_time).timestamp())
            with zf.open(info) as src:
                tf.addfile(ti, src)
            files += 1
    return {"archive": archive.name, "archive_sha256": sha256(archive),
            "archive_bytes": archive.stat().st_size, "files": files, "skipped": skipped}


def build(out: Path, pins_file: Path = PINS, python: str = "3.12",
          wheels: Path | None = None, budget_bytes: int = BUDGET_BYTES) -> dict:
    """Make the bundle in ``out`` (written to a temporary folder, then renamed).

    ``wheels``: a folder that already holds the pinned wheels (no download).
    """
    pins = read_pins(pins_file)
    out = Path(out)
    if out.exists() and not (out / "manifest.json").is_file():
        raise BundleError(f"--out {out}: exists and is not a GPU bundle; choose another folder")
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    with staged(tmp, out):
        src = wheels
        if src is None:
            src = tmp / "wheels"
            download(pins, src, python)
        packages = []
        for name, version in pins:
            whl = find_wheel(src, name, version)
            entry = {"name": name, "version": version, "wheel": whl.name,
                     "wheel_sha256": sha256(whl), "wheel_bytes": whl.stat().st_size}
            entry.update(repack(whl, tmp))
            packages.append(entry)
        total = sum(p["archive_bytes"] for p in packages)
        if total > budget_bytes:
            raise BundleError(f"bundle is {total / 2**20:.1f} MiB, over its budget of "
                              f"{budget_bytes / 2**20:.0f} MiB")
        manifest = {"python": python, "created": datetime.date.today().isoformat(),
                    "pins_file": pins_file.name, "checks": list(CHECKS),
                    "total_archive_bytes": total, "packages": packages}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.copy(INSTALLER, tmp / "install.py")
        (tmp / "install.sh").write_text(
            '#!/usr/bin/env bash\n# Offline install of this bundle; see install.py --help.\n'
            'exec "${PYTHON:-python3}" "$(dirname "$0")/install.py" "$@"\n')
        shutil.rmtree(tmp / "wheels", ignore_errors=True)
    return manifest


def tracked_files(root: Path) -> list[tuple[int, str]] | None:
    """``(bytes, path)`` of every file git tracks in ``root``, largest first (None where
    ``root`` is not a git checkout): the working tree that travels with the bundle."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    names = [n.decode() for n in out.stdout.split(b"\0") if n]
    return sorted(((root / n).stat().st_size if (root / n).is_file() else 0, n)
                  for n in names)[::-1]


def call_note(bundle_bytes: int, root: Path) -> str:
    """What a call to the GPU host would carry: the bundle and the checkout's tracked
    files, and, over :data:`CALL_BYTES`, the largest files to leave out of the copy."""
    files = tracked_files(root)
    if files is None:
        return f"{root} is not a git checkout: the working tree's size is not known"
    tree = sum(b for b, _ in files)
    total = bundle_bytes + tree
    line = (f"with the checkout's tracked files ({tree / 2**20:.1f} MiB) a call carries "
            f"{total / 2**20:.1f} MiB of its {CALL_BYTES / 2**20:.0f} MiB")
    if total <= CALL_BYTES:
        return line
    largest = ", ".join(f"{name} ({b / 2**20:.1f} MiB)" for b, name in files[:5])
    return (f"warning: {line}: leave files out of the copy sent to the host; the "
            f"largest: {largest}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lartpc.jobs.gpu_bundle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu-bundle"))
    ap.add_argument("--pins", type=Path, default=PINS)
    ap.add_argument("--python", default="3.12", help="the GPU host's Python (X.Y)")
    ap.add_argument("--wheels", type=Path, help="use the wheels in this folder, no download")
    args = ap.parse_args(argv)
    try:
        m = build(args.out, args.pins, args.python, args.wheels)
    except (BundleError, OSError) as e:
        print(f"gpu-bundle: error: {e}", file=sys.stderr)
        return 1
    for p in m["packages"]:
        print(f"{p['name']}=={p['version']}: {p['wheel_bytes'] / 2**20:.1f} MiB wheel -> "
              f"{p['archive_bytes'] / 2**20:.1f} MiB")
    print(f"{args.out}: {m['total_archive_bytes'] / 2**20:.1f} MiB; on the GPU host: "
          f"bash {args.out}/install.sh")
    print(call_note(m["total_archive_bytes"], HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
