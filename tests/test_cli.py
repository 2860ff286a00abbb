"""The `lartpc` command itself: light help, `lartpc env`, errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LARTPC = str(Path(sys.executable).parent / "lartpc")


def _main_without_torch(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``lartpc argv`` in a Python where torch and spconv cannot be imported."""
    code = ("import sys; sys.modules['torch'] = None; sys.modules['spconv'] = None\n"
            "from lartpc.cli import main\n"
            f"try:\n    sys.exit(main({argv!r}))\nexcept SystemExit as e:\n    sys.exit(e.code)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def test_help_does_not_import_torch():
    r = _main_without_torch(["--help"])
    assert r.returncode == 0, r.stderr
    for name in ("simulate", "train", "bench", "sweep", "env"):
        assert name in r.stdout


@pytest.mark.parametrize("argv,message", [
    (["train", "--config", "tiny-jishnet", "--data", "ev", "--out", "run", "--set",
      "train.weight_decay=1e308"], "train.weight_decay = 1e+308: must be in [0, 1]"),
    (["bench", "model", "--model", "jishnet", "--threads", "100000"],
     "--threads = 100000: must be in 0..1024"),
    (["bench", "noise", "--threads", "0"], "--threads = 0: must be in 1..1024"),
    (["bench", "loader", "--data", "ev", "--repeats", "0"], "--repeats and --batches"),
    (["bench", "allreduce", "--min-bytes", "3x"], "--min-bytes '3x': expected bytes"),
    (["evaluate", "run", "--store", "ev", "--threads", "0"], "--threads and --workers"),
    (["train", "--config", "tiny-jishnet", "--data", "ev", "--out", "run", "--set",
      "model.stage2_kernel=64:8:12"],
     "model.stage2_kernel='64:8:12': BLOCK_K = '12' must be a power of two in 16..8192"),
    (["bench", "model", "--model", "jishnet", "--stem-kernel", "100:4"],
     "--stem-kernel='100:4': BLOCK = '100' must be a power of two"),
])
def test_a_bad_option_is_refused_before_torch_is_imported(argv, message, tmp_path):
    """Options are checked before torch's ~1.5 s import: a mistyped one is one line at
    once (here torch cannot be imported at all, so a late check would fail otherwise)."""
    r = _main_without_torch(argv, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and message in r.stderr, r.stderr[-2000:]


def test_env_reports_horovod_with_pytorch_and_gloo():
    r = subprocess.run([LARTPC, "env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert lines["horovod"].startswith("0.28")
    assert "PyTorch" in lines["horovod frameworks"]
    assert "Gloo=yes" in lines["horovod controllers"]
    assert lines["torch"].startswith("2.")
    assert not lines["spconv"].startswith("not available")
    for key in ("python", "cuda available", "blosc2", "h5py", "triton"):
        assert key in lines


def test_unknown_command_is_an_error():
    r = subprocess.run([LARTPC, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "invalid choice" in r.stderr


@pytest.mark.parametrize("argv,shown", [
    (["simulate"], ["--momentum-gev MOMENTUM_GEV", "(default: 1.5:4.5)", "(default: 1000)",
                    "processes (output is identical) (default: 1)"]),
    (["bench"], ["simulate", "loader", "model", "train", "minibatch", "noise", "allreduce"]),
])
def test_help_shows_defaults_and_every_kind(argv, shown, capsys):
    from lartpc.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in shown:
        assert " ".join(text.split()) in out
    assert "(default: None)" not in out and "(default: False)" not in out


def _without_spconv(tmp_path: Path, error: str) -> dict:
    """An environment whose ``import spconv`` raises ``error`` (a package of that name
    first on the path), as a host without spconv or with a broken build."""
    fake = tmp_path / "fake" / "spconv"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise {error}\n")
    return {**os.environ, "PYTHONPATH": str(fake.parent)}


def test_scnet_without_spconv_is_one_line_naming_the_install(train_events_dir, tmp_path):
    env = _without_spconv(tmp_path, "ImportError(\"No module named 'spconv'\")")
    out = tmp_path / "run"
    r = subprocess.run([LARTPC, "train", "--config", "tiny-scnet", "--data",
                        str(train_events_dir), "--out", str(out), "--set",
                        "data.downsample=9"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "spconv is not installed" in r.stderr and "lartpc[sparse]" in r.stderr
    assert not out.exists()


def test_env_reports_a_spconv_that_fails_at_import(tmp_path):
    env = _without_spconv(tmp_path, "OSError('libcuda.so.1: cannot open shared object file')")
    r = subprocess.run([LARTPC, "env"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert lines["spconv"].startswith("not available (OSError: libcuda.so.1"), lines["spconv"]


#: ``lartpc sweep --dry-run`` printing ~130 kB, twice what a pipe holds, so the writer
#: is still writing when its reader goes away
LONG_SWEEP = ["sweep", "--scheduler", "slurm", "--launcher", "torchrun", "--data",
              "nowhere", "--no-data-check", "--config-prefix", "tiny", "--cores-per-rank",
              "2", "--seeds", "0,1,2,3,4,5,6,7", "--dry-run"]


def test_piping_into_head_ends_quietly_with_141(tmp_path):
    """``lartpc sweep --dry-run | head -1``: the scripts' first line, then the command
    stops as ``cat`` would, exit 128 + SIGPIPE, no traceback (it was exit 1 with a
    BrokenPipeError traceback)."""
    writer = subprocess.Popen([LARTPC, *LONG_SWEEP, "--out-dir", str(tmp_path / "s")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    head = subprocess.run(["head", "-1"], stdin=writer.stdout, capture_output=True,
                          text=True, timeout=120)
    writer.stdout.close()  # head alone holds the reading end now; it ends after one line
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=120) == 141, err
    assert err == "" and head.stdout.startswith("### jishnet-n1-s0: ")
    assert not (tmp_path / "s").exists()


def test_a_reader_gone_before_the_first_line_is_quiet_too(events_dir, tmp_path):
    """stdout whose reader closed before anything was written: ``inspect`` (a few lines,
    still buffered when the command returns), ``--version`` (argparse's exit) and
    ``python -m lartpc.analysis --help`` end
    without a traceback or Python's "Exception ignored" at exit. Buffered, as a user's
    stdout into a pipe is (PYTHONUNBUFFERED unset)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read, write = os.pipe()
    os.close(read)
    try:
        analysis = [sys.executable, "-m", "lartpc.analysis"]  # its own entry point
        for argv in ([LARTPC, "inspect", str(events_dir)], [LARTPC, "--version"],
                     [*analysis, "--help"]):
            r = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE,
                               text=True, timeout=120, cwd=tmp_path, env=env)
            assert r.returncode == 141 and r.stderr == "", (argv, r.returncode, r.stderr)
    finally:
        os.close(write)


def test_a_broken_pipe_that_is_not_stdouts_keeps_its_traceback(tmp_path):
    """A command that writes into a subprocess that has exited is a bug or a failure to
    see, stdout being fine: exit 1 with the traceback, as any unexpected error."""
    code = ("import subprocess, sys\n"
            "import lartpc.commands.env as command\n"
            "def run(args):\n"
            "    p = subprocess.Popen(['true'], stdin=subprocess.PIPE)\n"
            "    p.wait()\n"
            "    p.stdin.write(b'x' * 200_000)\n"
            "    p.stdin.flush()\n"
            "command.run = run\n"
            "from lartpc.cli import main\n"
            "sys.exit(main(['env']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 1 and "BrokenPipeError" in r.stderr, r.stderr[-2000:]
    assert "Traceback" in r.stderr


def test_a_command_started_with_stdout_closed_keeps_its_exit_status(tmp_path):
    """Started with stdout closed (``>&-``, a daemonising script), Python has no
    sys.stdout: the flush on the way out raised AttributeError, exit 1 instead of the
    command's own status."""
    r = subprocess.run(["bash", "-c", f"'{LARTPC}' watch --once '{tmp_path / 'nope'}' >&-"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "no such file or directory" in r.stderr and "Traceback" not in r.stderr
