"""Bad input ends in one line naming the file or field and exit 2, never a traceback
with exit 1 (the documented code of a diverged run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from train_helpers import BIN, rows, run, train_cmd

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _one_line_exit_2(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and message in errors[0], r.stderr[-2000:]


def test_corrupt_run_json_beside_a_valid_checkpoint(completed_run, train_events_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    (out / "run.json").write_text("{corrupt")
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"))
    _one_line_exit_2(r, f"{out / 'run.json'}: not valid JSON")


@pytest.mark.parametrize("argv,message", [
    (["train", "train.weight_decay=1e308"], "train.weight_decay = 1e+308: must be in [0, 1]"),
    (["train", "train.threads=100000"], "train.threads = 100000: must be at most 1024"),
    # each segfaulted creating the threads, as train.threads did
    (["bench", "model", "--model", "jishnet", "--size", "400", "--threads", "100000"],
     "--threads = 100000: must be in 0..1024"),
    (["bench", "model", "--model", "jishnet", "--size", "400", "--threads", "-1"],
     "--threads = -1: must be in 0..1024"),
    (["bench", "noise", "--threads", "100000"], "--threads = 100000: must be in 1..1024"),
    (["bench", "noise", "--threads", "0"], "--threads = 0: must be in 1..1024"),
])
def test_out_of_range_settings(train_events_dir, tmp_path, argv, message):
    cmd = (train_cmd(train_events_dir, tmp_path / "run", *argv[1:]) if argv[0] == "train"
           else [str(BIN / "lartpc"), *argv])
    _one_line_exit_2(run(cmd), message)


@pytest.mark.parametrize("text,message", [
    (b"[train]\nlr = " + b"[" * 5000 + b"]" * 5000 + b"\n", "invalid TOML (nested too deeply)"),
    (b"[train]\nlr = 0.001 # \xff\xfe\n", "not UTF-8 text"),
])
def test_bad_config_files(train_events_dir, tmp_path, text, message):
    cfg = tmp_path / "my.toml"
    cfg.write_bytes(text)
    r = run(train_cmd(train_events_dir, tmp_path / "run", config=str(cfg)))
    _one_line_exit_2(r, f"{cfg}")
    assert message in r.stderr


def test_garbage_noise_row_does_not_block_resume(completed_run, train_events_dir, tmp_path):
    """A noise.csv row that cannot be read is dropped with a warning on resume (it is a
    measurement log); it used to make the run un-resumable."""
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    (out / "noise.csv").write_text("step,epoch,loss\n0,0,1.6\ngarbage,line,here\n")
    r = run(train_cmd(train_events_dir, out, "train.epochs=2", "train.noise_scale=halves"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "noise.csv: dropped 1 unreadable row(s) on resume" in r.stderr
    steps = [int(x["step"]) for x in rows(out / "noise.csv")]
    assert "garbage" not in (out / "noise.csv").read_text() and steps and steps[0] == 0


def test_report_into_a_read_only_folder(completed_run, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount instead
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.strip()}")
    else:
        ro.chmod(0o555)
    try:
        r = subprocess.run([sys.executable, "-m", "lartpc.analysis", "report",
                            str(completed_run), "--out", str(ro / "rep")],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], capture_output=True)
    _one_line_exit_2(r, f"{ro / 'rep'}: cannot write")


@pytest.mark.parametrize("field", ["model", "optimizer", "config", "rng", "global_step"])
def test_checkpoint_missing_fields(completed_run, train_events_dir, tmp_path, field):
    import torch

    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    del ck[field]
    torch.save(ck, out / "checkpoint.pt")
    _one_line_exit_2(run(train_cmd(train_events_dir, out, "train.epochs=2")),
                     f"{out / 'checkpoint.pt'}: not a")
    assert json.loads((out / "run.json").read_text())["status"] == "completed"


# Reliability round 3 (issue 38, N5 and N8): damaged or crafted checkpoints, extreme
# options, bad stores and analysis inputs each end in one line and exit 2.

def _tensor_byte(path: Path) -> int:
    """Offset of a byte inside the largest tensor record of the zip torch.save wrote."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)
    head = path.read_bytes()[info.header_offset:info.header_offset + 30]
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def test_checkpoint_with_one_flipped_byte_is_refused(completed_run, train_events_dir, tmp_path):
    """torch.load checks no CRC: a flipped byte in a weight resumed silently (N5)."""
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    data = bytearray((out / "checkpoint.pt").read_bytes())
    data[_tensor_byte(out / "checkpoint.pt")] ^= 0x10
    (out / "checkpoint.pt").write_bytes(bytes(data))
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"))
    _one_line_exit_2(r, f"{out / 'checkpoint.pt'}: damaged: record ")
    assert "fails its CRC-32 check" in r.stderr
    assert json.loads((out / "run.json").read_text())["status"] == "completed"


def _crafted(field: str, value):
    return lambda ck: {**ck, field: value}


def _first_weight_reshaped(ck):
    import torch

    k = next(iter(ck["model"]))
    return {**ck, "model": {**ck["model"], k: torch.zeros(3)}}


def _adam_moment_reshaped(ck):
    import torch

    state = ck["optimizer"]["state"]
    k = next(iter(state))
    return {**ck, "optimizer": {**ck["optimizer"], "state": {
        **state, k: {**state[k], "exp_avg": torch.zeros(2)}}}}


def _rng_part(part: str, value):
    return lambda ck: {**ck, "rng": {**ck["rng"], part: value}}


def _short_torch_rng(ck):
    import torch

    return _rng_part("torch", torch.zeros(3, dtype=torch.uint8))(ck)


CRAFTED = {
    "rng={}": (_crafted("rng", {}), "field rng"),
    "rng=[]": (_crafted("rng", []), "field rng"),
    "rng.python short": (_rng_part("python", {"version": 3, "internal": [1, 2],
                                              "gauss_next": None}), "field rng"),
    "rng.torch short": (_short_torch_rng, "field rng"),
    "epoch=-1": (_crafted("epoch", -1), "field epoch = -1"),
    "epoch='1'": (_crafted("epoch", "1"), "field epoch = '1'"),
    "step_in_epoch=10**6": (_crafted("step_in_epoch", 10 ** 6), "field step_in_epoch"),
    "global_step=True": (_crafted("global_step", True), "field global_step = True"),
    "config=[]": (_crafted("config", []), "field config = []"),
    "world_size='1'": (_crafted("world_size", "1"), "field world_size = '1'"),
    "eval_rows={}": (_crafted("eval_rows", {}), "field eval_rows = {}"),
    "train_time_s=nan": (_crafted("train_time_s", float("nan")), "field train_time_s = nan"),
    "model=[]": (_crafted("model", []), "field model = []"),
    "optimizer={}": (_crafted("optimizer", {}), "field optimizer = {}"),
    "store junk": (_crafted("store", {"events": "x"}), "field store"),
    "weight shape": (_first_weight_reshaped, "does not fit this jishnet and its optimizer "
                                             "(Error(s) in loading state_dict for JishNet: "
                                             "size mismatch"),
    "moment shape": (_adam_moment_reshaped, "optimizer state exp_avg has shape (2,)"),
    "no param groups": (lambda ck: {**ck, "optimizer": {**ck["optimizer"],
                                                        "param_groups": []}},
                        "different number of parameter groups"),
}


@pytest.mark.parametrize("variant", list(CRAFTED))
def test_checkpoint_with_wrong_field_types(completed_run, train_events_dir, tmp_path, variant):
    import torch

    change, message = CRAFTED[variant]
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    torch.save(change(torch.load(out / "checkpoint.pt", weights_only=True)),
               out / "checkpoint.pt")
    r = run(train_cmd(train_events_dir, out, "train.epochs=2"))
    _one_line_exit_2(r, f"{out / 'checkpoint.pt'}: ")
    assert message in r.stderr


def test_text_checkpoint_is_refused(completed_run, train_events_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    (out / "checkpoint.pt").write_text("not a checkpoint\n")
    _one_line_exit_2(run(train_cmd(train_events_dir, out, "train.epochs=2")),
                     f"{out / 'checkpoint.pt'}: not a checkpoint torch.save wrote")


def test_init_from_a_text_file_is_refused(train_events_dir, tmp_path):
    text = tmp_path / "weights.pt"
    text.write_text("not a checkpoint\n")
    r = run(train_cmd(train_events_dir, tmp_path / "run", f"train.init_from={text}"))
    _one_line_exit_2(r, f"{text}: not a checkpoint torch.save wrote")
    assert "train.init_from needs a checkpoint lartpc wrote" in r.stderr
    # refused before the run folder is taken: no failed run left behind
    assert not (tmp_path / "run").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(train_cmd(train_events_dir, tmp_path / "run", f"train.init_from={empty}"))
    _one_line_exit_2(r, f"train.init_from {str(empty)!r}: no checkpoint there")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("setting,message", [
    (f"train.seed={2 ** 64}", f"train.seed = {2 ** 64}: must be at most 2**63 - 1"),
    ("train.batch_per_rank=1000000000", "train.batch_per_rank = 1000000000: more than the "),
])
def test_extreme_training_options(train_events_dir, tmp_path, setting, message):
    r = run(train_cmd(train_events_dir, tmp_path / "run", setting))
    _one_line_exit_2(r, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("seed,message", [
    ("-1", "--seed: must be in 0..2**63-1, got -1"),
    (str(10 ** 23), f"--seed: must be in 0..2**63-1, got {10 ** 23}"),
    ("1e23", "argument --seed: invalid int value: '1e23'"),
])
def test_simulate_seed_out_of_range(tmp_path, seed, message):
    r = run([str(BIN / "lartpc"), "simulate", "--out", str(tmp_path / "E"), "--events", "2",
             "--seed", seed, "--downsample", "9"])
    _one_line_exit_2(r, message)


def test_convert_refuses_text_labels(tmp_path):
    import h5py
    import numpy as np

    src = tmp_path / "up.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("image/wires", (2, 3, 96, 36), np.int32)
        f["label/type"] = np.array([[b"gamma"] * 10] * 2)
    r = run([str(BIN / "lartpc"), "convert", str(src), "--out", str(tmp_path / "store")])
    _one_line_exit_2(r, f"{src}: dataset 'label/type' holds |S5, expected integer counts")


def test_inspect_refuses_a_label_out_of_range(train_events_dir, tmp_path):
    import h5py

    store = tmp_path / "E"
    shutil.copytree(train_events_dir, store)
    shard = sorted(store.glob("*.h5"))[1]
    with h5py.File(shard, "r+") as f:
        f["label"][3] = 126
    r = run([str(BIN / "lartpc"), "inspect", str(store)])
    _one_line_exit_2(r, f"{shard}: event 3 label 126 out of range 0..4")


@pytest.fixture(scope="module")
def noisy(train_events_dir, tmp_path_factory):
    """A completed one-epoch run that measured the gradient noise scale (noise.csv)."""
    out = tmp_path_factory.mktemp("noisy") / "run"
    r = run(train_cmd(train_events_dir, out, "train.epochs=1", "train.noise_scale=halves",
                      "train.noise_every_steps=1"))
    assert r.returncode == 0, r.stderr
    return out


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return run([str(BIN / "lartpc"), "analyze", *args], timeout=180)


def test_report_on_a_run_named_like_mathtext(noisy, tmp_path):
    """The noise figure's legend holds the folder name: '$\\frac{$' crashed mathtext."""
    odd = tmp_path / "x$\\frac{$"
    shutil.copytree(noisy, odd)
    r = _analyze("report", str(odd), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "rep" / "noise_scale.png").is_file()


@pytest.mark.parametrize("command", ["fit", "curves", "confusion", "report"])
def test_analysis_of_a_rank_log_with_a_huge_field(completed_run, tmp_path, command):
    out = tmp_path / "run"
    shutil.copytree(completed_run, out)
    lines = (out / "rank-000.csv").read_text().splitlines()
    lines[3] += "x" * 5_000_000
    (out / "rank-000.csv").write_text("\n".join(lines) + "\n")
    r = _analyze(command, str(out), "--strict", "--out", str(tmp_path / "rep"))
    _one_line_exit_2(r, f"{out / 'rank-000.csv'}:4: malformed CSV (field larger than field limit")
    r = _analyze(command, str(out), "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]


FILE_SIZE_LIMIT = textwrap.dedent("""
    import resource, signal, sys
    from lartpc.cli import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("limit", ["tmpfs", "rlimit"])
def test_checkpoint_on_a_full_disk_names_the_os_error(train_events_dir, tmp_path, limit):
    """torch.save's own writer reported a full disk as 'inline_container.cc:672'."""
    out = tmp_path / "disk" / "run"
    out.parent.mkdir()
    cmd = train_cmd(train_events_dir, out, "train.epochs=1")
    if limit == "tmpfs":  # a real full disk: 1 MiB holds the logs, not the 8 MB checkpoint
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(out.parent)],
                           capture_output=True, text=True)
        if m.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
        reason = "No space left on device"
    else:
        cmd = [sys.executable, "-c", FILE_SIZE_LIMIT, *cmd[1:]]
        reason = "File too large"
    try:
        r = run(cmd)
    finally:
        if limit == "tmpfs":
            subprocess.run(["umount", str(out.parent)], capture_output=True)
    _one_line_exit_2(r, f"checkpoint.pt: cannot write the checkpoint ({reason})")
    assert "inline_container" not in r.stderr


def test_report_skips_an_unreadable_noise_csv(noisy, tmp_path):
    """N9: one unparsable noise.csv failed the whole report; the run's noise scale is now
    left out with a warning, as fit leaves out an unusable run (--strict: exit 2)."""
    bad = tmp_path / "bad"
    shutil.copytree(noisy, bad)
    (bad / "noise.csv").write_text("garbage\n")
    r = _analyze("report", str(noisy), str(bad), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr[-2000:]
    why = f"{bad / 'noise.csv'}:1: header is 'garbage'"
    assert f"{why}, expected 'step,epoch" in r.stderr and "noise scale not used" in r.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Not used for the noise scale" in page and "header is &#x27;garbage&#x27;" in page
    assert (tmp_path / "rep" / "noise_scale.png").is_file()  # the readable run's curve
    strict = _analyze("report", str(noisy), str(bad), "--strict", "--out",
                      str(tmp_path / "strict"))
    _one_line_exit_2(strict, why)
    assert not (tmp_path / "strict" / "report.html").exists()


def test_a_path_the_system_refuses_is_one_line_exit_2(monkeypatch, tmp_path, capsys):
    """An OSError about a path (a folder that is not writable: the test runs as root,
    where permissions do not apply, so the writer's error is stood in) is the user's to
    fix: one line naming the path, exit 2; one about no path is a bug and propagates."""
    from lartpc.cli import main
    from lartpc.commands import display

    out = tmp_path / "ro" / "x.png"

    def refused(args):
        raise PermissionError(13, "Permission denied", str(out))

    monkeypatch.setattr(display, "run", refused)
    assert main(["display", str(tmp_path), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"lartpc display: error: {out}: Permission denied\n"

    def broken(args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(display, "run", broken)
    with pytest.raises(OSError, match="Input/output error"):
        main(["display", str(tmp_path), "--out", str(out)])


def test_atomic_writes_name_the_file_not_their_temporary(tmp_path, monkeypatch):
    """The error of a folder where the temporary file cannot be made names the file
    the caller writes (it named '.x.png.<hex>.lartpc-tmp')."""
    from lartpc import fsutil

    real_open = os.open

    def no_create(path, flags, *a, **kw):
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(fsutil.os, "open", no_create)
    with pytest.raises(PermissionError) as e:
        fsutil.atomic_write(tmp_path / "x.png", b"png")
    assert e.value.filename == str(tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []
