"""The offline GPU bundle: pins, repacking and the installer's logic, on wheels made here.

The download itself (``pip download`` of the real pins) needs the registries and is not
run; everything after it is, on two small wheels this test writes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from lartpc.jobs import gpu_bundle
from lartpc.jobs.gpu_bundle import BundleError, build, read_pins

PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel in the standard layout (zip with a .dist-info), as pip download saves."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in files.items():
            zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                                        f"Version: {version}\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def bundle(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # A library-like member: compressible the way a big .so is, not random bytes.
    blob = (b"\x7fELF" + bytes(range(256)) * 64) * 200
    _wheel(wheels, "alpha_mod", "1.2.0", {"alpha_mod/__init__.py": b"VALUE = 42\n",
                                          "alpha_mod/lib.bin": blob})
    _wheel(wheels, "beta_mod", "0.3", {
        "beta_mod-0.3.data/purelib/beta_mod/__init__.py": b"from alpha_mod import VALUE\n",
        "beta_mod-0.3.data/scripts/beta": b"#!/bin/sh\n"})
    pins = tmp_path / "pins.txt"
    pins.write_text("# test pins\nalpha-mod==1.2.0\nbeta_mod==0.3  # needs alpha\n")
    out = tmp_path / "gpu-bundle"
    manifest = build(out, pins, PYTHON, wheels)
    manifest_file = json.loads((out / "manifest.json").read_text())
    manifest_file["checks"] = ["alpha_mod", "beta_mod"]  # this test's modules
    (out / "manifest.json").write_text(json.dumps(manifest_file))
    return out, manifest, len(blob)


def _install(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(out / "install.sh"), *args], capture_output=True,
                          text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


def test_bundle_manifest_and_archives(bundle):
    out, m, blob_bytes = bundle
    assert [(p["name"], p["version"]) for p in m["packages"]] == [("alpha-mod", "1.2.0"),
                                                                   ("beta_mod", "0.3")]
    alpha, beta = m["packages"]
    assert alpha["wheel"] == "alpha_mod-1.2.0-py3-none-any.whl"
    assert alpha["archive_bytes"] == (out / alpha["archive"]).stat().st_size
    assert m["total_archive_bytes"] == alpha["archive_bytes"] + beta["archive_bytes"]
    # xz at preset 9e packs the repetitive library far below its size
    assert alpha["archive_bytes"] < blob_bytes / 20
    with tarfile.open(out / alpha["archive"]) as tf:
        sizes = {t.name: t.size for t in tf.getmembers()}
    assert sizes["alpha_mod/lib.bin"] == blob_bytes
    assert "alpha_mod-1.2.0.dist-info/METADATA" in sizes
    # .data/purelib lands at the top; scripts are left out and listed
    with tarfile.open(out / beta["archive"]) as tf:
        assert "beta_mod/__init__.py" in tf.getnames()
    assert beta["skipped"] == ["beta_mod-0.3.data/scripts/beta"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [alpha["archive"], beta["archive"], "install.py", "install.sh", "manifest.json"])


def test_installer_unpacks_and_imports_offline(bundle, tmp_path):
    out, _, blob_bytes = bundle
    target = tmp_path / "site"
    r = _install(out, str(target))
    assert r.returncode == 0, r.stderr
    assert "import alpha_mod: ok" in r.stdout and "import beta_mod: ok" in r.stdout
    assert (target / "alpha_mod" / "lib.bin").stat().st_size == blob_bytes
    v = subprocess.run([sys.executable, "-c", "import beta_mod; print(beta_mod.VALUE)"],
                       capture_output=True, text=True, env={"PYTHONPATH": str(target)})
    assert v.stdout.strip() == "42"
    marker = json.loads((target / ".lartpc-gpu-bundle.json").read_text())
    assert marker["packages"] == ["alpha-mod==1.2.0", "beta_mod==0.3"]
    # installing again replaces its own folder
    assert _install(out, str(target)).returncode == 0


def test_installer_refuses_damage_other_python_and_foreign_target(bundle, tmp_path):
    out, m, _ = bundle
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    r = _install(out, str(foreign))
    assert r.returncode == 1 and "was not made by this installer" in r.stderr
    assert (foreign / "notes.txt").read_text() == "keep me"

    archive = out / m["packages"][0]["archive"]
    data = bytearray(archive.read_bytes())
    data[-20] ^= 0xFF
    archive.write_bytes(bytes(data))
    target = tmp_path / "site"
    r = _install(out, str(target))
    assert r.returncode == 1 and f"{archive}: SHA-256 differs" in r.stderr
    assert not target.exists() and not (tmp_path / "site.partial").exists()

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["python"] = "3.99"
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = _install(out, str(target))
    assert r.returncode == 1 and "made for Python 3.99" in r.stderr


def test_build_errors_leave_nothing(tmp_path):
    pins = tmp_path / "pins.txt"
    pins.write_text("spconv-cu126>=2.3\n")
    with pytest.raises(BundleError, match=r"pins.txt:1: 'spconv-cu126>=2.3' is not an exact"):
        read_pins(pins)
    pins.write_text("alpha==1.0\n")
    (tmp_path / "wheels").mkdir()
    with pytest.raises(BundleError, match=r"expected one wheel of alpha==1.0, found none"):
        build(tmp_path / "b", pins, PYTHON, tmp_path / "wheels")
    _wheel(tmp_path / "wheels", "alpha", "1.0", {"alpha/x.bin": bytes(range(256)) * 4000})
    with pytest.raises(BundleError, match=r"over its budget of 0 MiB"):
        build(tmp_path / "b", pins, PYTHON, tmp_path / "wheels", budget_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pins.txt", "wheels"]


def test_real_pins_name_spconv_cuda_and_its_dependencies():
    """The project's pins: exact, one spconv CUDA build, and cumm inside the range that
    spconv-cu126 2.3.8's own metadata requires (>=0.7.11, <0.8)."""
    pins = dict(read_pins(gpu_bundle.PINS))
    assert pins["spconv-cu126"] == "2.3.8"
    major, minor, patch = (int(x) for x in pins["cumm-cu126"].split("."))
    assert (0, 7, 11) <= (major, minor, patch) < (0, 8, 0)
    for dep in ("pccm", "ccimport", "lark", "fire", "termcolor", "blosc2", "ndindex", "numexpr"):
        assert re.fullmatch(r"[0-9.]+", pins[dep]), dep


def test_installer_keeps_an_unrelated_partial_folder(bundle, tmp_path):
    """the installer staged into TARGET.partial and deleted whatever was there."""
    out, _, _ = bundle
    mine = tmp_path / "site.partial"
    mine.mkdir()
    (mine / "work.txt").write_text("keep me")
    assert _install(out, str(tmp_path / "site")).returncode == 0
    assert (mine / "work.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("entry", ["os; open('PWNED', 'w').write('x')", "os\nimport sys", 7])
def test_manifest_checks_run_no_code(bundle, tmp_path, entry):
    """a manifest-only edit (its hashes cover the archives, not itself) pasted a
    'checks' entry into `python -c`; now an entry must be a module name."""
    out, _, _ = bundle
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["checks"] = [entry]
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = subprocess.run(["bash", str(out / "install.sh"), str(tmp_path / "site")],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and "is not a module name; refusing to run it" in r.stderr
    assert not (tmp_path / "PWNED").exists()


def test_a_source_checkout_on_pythonpath_imports_analysis_and_jobs(tmp_path):
    """The offline host runs the checkout from PYTHONPATH, with no install to map
    ``analysis/`` and ``jobs/`` into the package (an H200 host failed
    ``python3 -m lartpc.jobs.local.gpu_bench`` and the trainings' metrics import so)."""
    import sysconfig

    repo = Path(__file__).resolve().parents[1]
    # -S: no site, so no editable install's finder; the venv's packages by PYTHONPATH
    env = {"PYTHONPATH": f"{repo}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    code = ("import lartpc.jobs.local.gpu_bench as g, lartpc.analysis.metrics as m; "
            "print(g.__file__); print(m.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(repo / "jobs/local/gpu_bench.py"),
                                  str(repo / "analysis/metrics.py")]


def test_the_call_note_weighs_the_bundle_with_the_tracked_tree(tmp_path):
    """What a call to the GPU host carries: the bundle and the checkout's tracked files
    (untracked ones stay behind); over the 64 MiB, the largest files to leave out."""
    repo = tmp_path / "checkout"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "weights.pt").write_bytes(b"w" * 3 * 2**20)
    (repo / "README.md").write_text("lartpc\n")
    (repo / "untracked.bin").write_bytes(b"u" * 50 * 2**20)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "add", "docs", "README.md"], check=True, timeout=30)
    note = gpu_bundle.call_note(40 * 2**20, repo)
    assert note == ("with the checkout's tracked files (3.0 MiB) a call carries 43.0 MiB "
                    "of its 64 MiB")
    note = gpu_bundle.call_note(62 * 2**20, repo)
    assert note.startswith("warning: with the checkout's tracked files (3.0 MiB) a call "
                           "carries 65.0 MiB")
    assert note.endswith("the largest: docs/weights.pt (3.0 MiB), README.md (0.0 MiB)")
    assert "not a git checkout" in gpu_bundle.call_note(1, tmp_path / "elsewhere")
