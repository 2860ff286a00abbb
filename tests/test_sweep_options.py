"""`lartpc sweep` options that real clusters need: sites, scheduler arguments, a
prelude, user configs, cores per rank, the data check, idempotent and retried submission,
and the ranks' environment."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lartpc(*args: str, path_first: Path | None = None,
           hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``lartpc ARGS``; ``hide``: commands PATH must not find (the machine's own SLURM,
    installed by the SLURM tests, must not stand in): a folder of PATH that holds one is
    replaced by links to everything else in it."""
    env = dict(os.environ)
    folders = []
    for d in env["PATH"].split(":"):
        if any((Path(d) / name).exists() for name in hide):
            shim = Path(tempfile.mkdtemp(prefix="path-"))
            for entry in Path(d).iterdir():
                if entry.name not in hide:
                    (shim / entry.name).symlink_to(entry)
            d = str(shim)
        folders.append(d)
    env["PATH"] = ":".join(folders)
    if path_first is not None:  # stand-ins for sbatch/squeue/sinfo come first
        env["PATH"] = f"{path_first}:{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "lartpc", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def fake(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("#!/bin/sh\n" + body)
    (folder / name).chmod(0o755)


def rendered_scripts(stdout: str) -> dict[str, str]:
    """Script text per point from a --dry-run's output."""
    out, name, lines = {}, None, []
    for line in stdout.splitlines():
        m = re.match(r"### (\S+): \S+ -> run ", line)
        if m:
            name, lines = m.group(1), []
        elif line.startswith("### submit:") and name:
            out[name] = "\n".join(lines) + "\n"
            name = None
        elif name:
            lines.append(line)
    return out


def test_perlmutter_site_renders_clean_scripts(tmp_path):
    res = lartpc("sweep", "--site", "perlmutter", "--account", "m1234_g", "--data",
                 str(tmp_path), "--out-dir", str(tmp_path / "runs"), "--gpus", "4,8",
                 "--dry-run")
    assert res.returncode == 0, res.stderr
    scripts = rendered_scripts(res.stdout)
    assert set(scripts) == {f"{m}-n{n}-s0" for m in ("jishnet", "scnet") for n in (4, 8)}
    text = scripts["scnet-n8-s0"]
    for line in ("--constraint=gpu", "--qos=regular", "--account=m1234_g", "--nodes=2",
                 "--ntasks-per-node=1", "--cpus-per-task=128", "--gpus-per-node=4"):
        assert f"#SBATCH {line}\n" in text
    assert "export LARTPC_CORES_PER_TASK=32\n" in text  # 128 CPUs / 4 GPUs per node
    assert f"export LARTPC_PRELUDE={tmp_path}/runs/jobs/prelude.sh\n" in text
    launch = [ln for ln in res.stdout.splitlines() if ln.startswith("### launch: srun")]
    assert "--cpus-per-task=128 torchrun --nnodes=2 --nproc-per-node=4" in launch[-1]
    assert not (tmp_path / "runs").exists()
    for name, body in scripts.items():
        (tmp_path / f"{name}.sbatch").write_text(body)
    files = [str(p) for p in tmp_path.glob("*.sbatch")]
    assert subprocess.run(["bash", "-n", *files[:1]]).returncode == 0
    for f in files:
        assert subprocess.run(["bash", "-n", f], capture_output=True).returncode == 0, f
    sc = subprocess.run(["shellcheck", "-x", *files], capture_output=True, text=True, cwd=ROOT)
    assert sc.returncode == 0, sc.stdout


def test_site_that_needs_an_account_says_which(tmp_path):
    res = lartpc("sweep", "--site", "perlmutter", "--data", str(tmp_path), "--dry-run")
    assert res.returncode == 2
    assert "--account is required; Perlmutter charges GPU jobs to a GPU account" in res.stderr


def test_command_line_wins_over_the_site(tmp_path):
    res = lartpc("sweep", "--site", "perlmutter", "--account", "m1_g", "--qos", "debug",
                 "--cores-per-rank", "8", "--data", str(tmp_path), "--models", "scnet",
                 "--gpus", "4", "--out-dir", str(tmp_path / "runs"), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --qos=debug\n" in res.stdout and "--qos=regular" not in res.stdout
    assert "#SBATCH --cpus-per-task=32\n" in res.stdout  # 4 ranks x 8


@pytest.mark.parametrize("arg", [
    "--comment=x\n#SBATCH --uid=0", "--comment=a;touch /tmp/x", "--comment=`id`",
    "--comment=$(id)", "--comment='a'", "--comment=a\\b", "--mail-type=END extra words",
])
def test_hostile_sbatch_arg_is_refused(tmp_path, arg):
    res = lartpc("sweep", "--data", str(tmp_path), "--out-dir", str(tmp_path / "runs"),
                 "--scheduler", "slurm", "--launcher", "torchrun", f"--sbatch-arg={arg}",
                 "--no-data-check")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and f"--sbatch-arg {arg!r}:" in res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("arg,option", [("--time=1:00:00", "--time"),
                                        ("-p gpu", "--queue"), ("--nodes=3", "--gpus")])
def test_sbatch_arg_may_not_set_what_the_sweep_writes(tmp_path, arg, option):
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "slurm",
                 "--launcher", "torchrun", f"--sbatch-arg={arg}", "--dry-run")
    assert res.returncode == 2 and f"is written by the sweep; use {option}" in res.stderr


def test_scheduler_args_go_into_directives(tmp_path):
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "slurm", "--launcher",
                 "horovod", "--models", "jishnet", "--gpus", "1", "--dry-run",
                 "--sbatch-arg=--mail-type=END,FAIL", "--sbatch-arg=--exclusive",
                 "--reservation", "lartpc_res", "--constraint", "gpu&hbm80g")
    assert res.returncode == 0, res.stderr
    for line in ("--mail-type=END,FAIL", "--exclusive", "--reservation=lartpc_res",
                 "--constraint=gpu&hbm80g"):
        assert f"#SBATCH {line}\n" in res.stdout
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "lsf", "--launcher",
                 "jsrun", "--models", "jishnet", "--gpus", "1", "--dry-run",
                 '--bsub-arg=-alloc_flags "nvme smt4"')
    assert res.returncode == 0, res.stderr
    assert '#BSUB -alloc_flags "nvme smt4"\n' in res.stdout
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "lsf", "--launcher",
                 "jsrun", "--bsub-arg=-alloc_flags smt4", "--qos", "regular", "--dry-run")
    assert res.returncode == 2 and "--constraint and --qos are SLURM options" in res.stderr


def test_user_toml_config_and_prelude_are_copied(tmp_path, events_dir):
    cfg = tmp_path / "my-scnet.toml"
    cfg.write_text((ROOT / "lartpc/configs/tiny-scnet.toml").read_text()
                   .replace("[train]", "[train]\nlr = 0.0005", 1))
    prelude = tmp_path / "site.sh"
    prelude.write_text("export LARTPC_TEST_PRELUDE=1\n")
    out = tmp_path / "runs"
    res = lartpc("sweep", "--config", str(cfg), "--data", str(events_dir), "--out-dir",
                 str(out), "--scheduler", "slurm", "--launcher", "torchrun", "--gpus", "1,2",
                 "--gpus-per-node", "2", "--cores-per-rank", "1", "--cpu",
                 "--prelude", str(prelude))
    assert res.returncode == 0, res.stderr
    copy = out / "jobs/config-scnet.toml"
    assert copy.read_text() == cfg.read_text()
    assert (out / "jobs/prelude.sh").read_text() == prelude.read_text()
    man = json.loads((out / "manifest.json").read_text())
    assert {p["name"] for p in man["points"]} == {"scnet-n1-s0", "scnet-n2-s0"}
    assert all(p["config"] == str(copy) for p in man["points"])
    assert len(man["prelude"]["sha256"]) == 64
    text = (out / "jobs/scnet-n2-s0.sbatch").read_text()
    assert f"export LARTPC_CONFIG={copy}\n" in text

    res = lartpc("sweep", "--config", str(cfg), "--models", "jishnet", "--data", str(tmp_path),
                 "--scheduler", "slurm", "--launcher", "torchrun", "--dry-run")
    assert res.returncode == 2 and "does not match the models of --config" in res.stderr
    bad = tmp_path / "bad.sh"
    bad.write_text("if then fi\n")
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "slurm", "--launcher",
                 "torchrun", "--prelude", str(bad), "--dry-run")
    assert res.returncode == 2 and f"--prelude {bad}: " in res.stderr and "syntax" in res.stderr


@pytest.mark.parametrize("args,message", [
    (["--config-prefix", "paper", "--gpus", "1"],
     "events are downsampled by 4 but the config says data.downsample=1"),
    (["--config-prefix", "tiny", "--gpus", "1,64"], "does not fit jishnet on 64 ranks"),
])
def test_data_that_does_not_fit_is_refused_before_writing(tmp_path, events_dir, args, message):
    res = lartpc("sweep", "--models", "jishnet", "--data", str(events_dir), "--out-dir",
                 str(tmp_path / "runs"), "--scheduler", "slurm", "--launcher", "torchrun",
                 "--cores-per-rank", "1", *args)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert str(events_dir) in res.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_says_whether_the_data_fits(tmp_path, events_dir):
    """--dry-run checks the data as writing would, and says so on stderr after the
    scripts (exit 0: it writes nothing either way); --no-data-check says nothing."""
    base = ("sweep", "--models", "jishnet", "--data", str(events_dir), "--out-dir",
            str(tmp_path / "runs"), "--scheduler", "slurm", "--launcher", "torchrun",
            "--cores-per-rank", "1", "--dry-run")
    res = lartpc(*base, "--config-prefix", "tiny", "--gpus", "1,64")
    assert res.returncode == 0 and "#!/usr/bin/env bash" in res.stdout, res.stderr
    assert f"--data {events_dir} does not fit jishnet on 64 ranks" in res.stderr
    assert "(writing or submitting would refuse it)" in res.stderr
    res = lartpc(*base, "--config-prefix", "tiny", "--gpus", "1,2")
    assert res.returncode == 0, res.stderr
    assert f"--dry-run: --data {events_dir} fits every point" in res.stderr
    res = lartpc(*base, "--config-prefix", "tiny", "--gpus", "1,64", "--no-data-check")
    assert res.returncode == 0 and "--data" not in res.stderr, res.stderr
    res = lartpc(*base[:4], str(tmp_path / "elsewhere"), *base[5:], "--gpus", "1")
    assert res.returncode == 0 and "no such folder here" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()


def test_cores_per_rank_from_the_nodes_cpus(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "sinfo", 'echo 64\necho 96\n')
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "slurm", "--launcher",
                 "horovod", "--models", "jishnet", "--gpus", "4", "--dry-run",
                 path_first=bin_dir)
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --cpus-per-task=16\n" in res.stdout  # smallest node: 64 CPUs / 4 GPUs
    assert "--cpus-per-task=16 --kill-on-bad-exit=1 lartpc train" in res.stdout
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "lsf", "--launcher",
                 "jsrun", "--models", "jishnet", "--gpus", "6", "--dry-run")
    assert res.returncode == 0 and "cores per rank: 1 (the node's cores are unknown" in res.stderr


def _submit(tmp_path, events_dir, bin_dir, hide: tuple[str, ...] = ()):
    return lartpc("sweep", "--models", "jishnet", "--gpus", "1,2", "--data", str(events_dir),
                  "--out-dir", str(tmp_path / "runs"), "--scheduler", "slurm", "--launcher",
                  "torchrun", "--config-prefix", "tiny", "--cpu", "--gpus-per-node", "2",
                  "--cores-per-rank", "1", "--submit", path_first=bin_dir, hide=hide)


def _counting_sbatch(tmp_path: Path) -> tuple[Path, Path]:
    """bin/ with an sbatch that numbers its jobs 101, 102, ... in ``count``."""
    bin_dir, counter = tmp_path / "bin", tmp_path / "count"
    fake(bin_dir, "sbatch", f'n=$(cat {counter} 2>/dev/null || echo 100); n=$((n + 1))\n'
                            f'echo $n > {counter}; echo "$n"\n')
    return bin_dir, counter


def test_submit_twice_submits_each_point_once(tmp_path, events_dir):
    # sbatch numbers its jobs 101, 102, ...; squeue says job 101 still waits.
    bin_dir, counter = _counting_sbatch(tmp_path)
    fake(bin_dir, "squeue", 'case "$3" in 101) echo PENDING ;; esac\n')
    res = _submit(tmp_path, events_dir, bin_dir)
    assert res.returncode == 0, res.stderr
    runs = tmp_path / "runs"
    man = json.loads((runs / "manifest.json").read_text())
    assert {p["name"]: p["job_id"] for p in man["points"]} == \
        {"jishnet-n1-s0": "101", "jishnet-n2-s0": "102"}
    res = _submit(tmp_path, events_dir, bin_dir)  # 101 queued, 102 gone: only n2 again
    assert res.returncode == 0, res.stderr
    assert "jishnet-n1-s0: not submitted, its job 101 is pending" in res.stdout
    man = json.loads((runs / "manifest.json").read_text())
    jobs = {p["name"]: p["jobs"] for p in man["points"]}
    assert jobs == {"jishnet-n1-s0": ["101"], "jishnet-n2-s0": ["102", "103"]}
    assert len(man["sweeps"]) == 2
    (runs / "jishnet-n2-s0").mkdir()
    (runs / "jishnet-n2-s0/run.json").write_text(json.dumps({"status": "completed"}))
    res = _submit(tmp_path, events_dir, bin_dir)
    assert "jishnet-n2-s0: not submitted, its run completed" in res.stdout
    assert counter.read_text().strip() == "103"  # nothing submitted the third time


def test_transient_submission_failure_is_retried(tmp_path, monkeypatch):
    from lartpc.jobs import submit

    bin_dir = tmp_path / "bin"
    tries = tmp_path / "tries"
    fake(bin_dir, "sbatch", f'echo x >> {tries}\n'
                            f'if [ $(wc -l < {tries}) -lt 3 ]; then\n'
                            '  echo "sbatch: error: Batch job submission failed: Socket timed '
                            'out on send/recv operation" >&2; exit 1; fi\necho 7\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(submit, "BACKOFF_S", (0.0, 0.0, 0.0))
    script = tmp_path / "a.sbatch"
    script.write_text("#!/bin/sh\n")
    assert submit.submit_one("sbatch", str(script)) == "7"
    assert len(tries.read_text().split()) == 3
    fake(bin_dir, "sbatch", f'echo x >> {tries}\necho "sbatch: error: invalid partition" >&2\n'
                            'exit 1\n')
    tries.unlink()
    from lartpc.errors import LartpcError

    with pytest.raises(LartpcError, match="invalid partition"):
        submit.submit_one("sbatch", str(script))
    assert len(tries.read_text().split()) == 1  # not a transient error: no retry


def test_ranks_environment_defaults_and_prelude(tmp_path):
    """env.sh's defaults reach the launch; the prelude's and the user's values win."""
    prelude = tmp_path / "prelude.sh"
    prelude.write_text("export NCCL_DEBUG=INFO\nexport FROM_PRELUDE=$UNSET_IN_PRELUDE\n")
    probe = (f'source {ROOT}/jobs/slurm/common.sh; lartpc_setup torch; '
             'echo "$HDF5_USE_FILE_LOCKING $OMP_NUM_THREADS $NCCL_DEBUG '
             '$TORCH_NCCL_ASYNC_ERROR_HANDLING $LARTPC_SRUN_MPI ${FROM_PRELUDE-unset}"')
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LARTPC_"))}
    base.pop("OMP_NUM_THREADS", None)
    base["PATH"] = f"{Path(sys.executable).parent}:{base['PATH']}"
    env = {**base, "LARTPC_CONFIG": "tiny-jishnet", "LARTPC_DATA": "/d", "LARTPC_RUN": "/r",
           "LARTPC_CORES_PER_TASK": "3", "LARTPC_PRELUDE": str(prelude),
           "LARTPC_TIME_LIMIT_S": "60"}
    res = subprocess.run(["bash", "-c", "set -euo pipefail; " + probe], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["FALSE", "3", "INFO", "1", "pmix"]  # FROM_PRELUDE empty
    env["HDF5_USE_FILE_LOCKING"] = "TRUE"
    env["SLURM_CPUS_PER_TASK"] = "8"
    env["LARTPC_RANKS_PER_TASK"] = "2"  # torchrun: one task holds the node's 2 ranks
    res = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    assert res.stdout.split()[:2] == ["TRUE", "4"]


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_threads_follow_the_cpu_mask_not_the_machine():
    res = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                          "from lartpc.train.parts import usable_cores; print(usable_cores())"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1"


def test_measure_network_runs_first_and_the_points_wait_for_it(tmp_path, events_dir):
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    counter = tmp_path / "count"
    fake(bin_dir, "sbatch", f'echo "$@" >> {calls}\n'
                            f'n=$(cat {counter} 2>/dev/null || echo 200); n=$((n + 1))\n'
                            f'echo $n > {counter}; echo "$n"\n')
    fake(bin_dir, "squeue", 'case "$3" in 202|203) echo PENDING ;; esac\n')  # the points
    args = ("sweep", "--models", "jishnet", "--gpus", "1,2", "--data", str(events_dir),
            "--out-dir", str(tmp_path / "runs"), "--scheduler", "slurm", "--launcher",
            "torchrun", "--config-prefix", "tiny", "--cpu", "--gpus-per-node", "1",
            "--cores-per-rank", "1", "--measure-network")
    res = lartpc(*args, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --job-name=lartpc-allreduce\n#SBATCH --nodes=2\n" in res.stdout
    (launch,) = [ln for ln in res.stdout.splitlines()
                 if ln.startswith("### launch:") and "bench allreduce" in ln]
    assert launch.startswith("### launch: srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ")
    assert f"--out {tmp_path}/runs/network.json" in launch
    res = lartpc(*args, "--submit", path_first=bin_dir)
    assert res.returncode == 0, res.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].endswith("jobs/allreduce.sbatch")
    assert all("--dependency=afterany:201" in ln for ln in lines[1:]) and len(lines) == 3
    man = json.loads((tmp_path / "runs/manifest.json").read_text())
    assert man["network"]["job_id"] == "201"
    assert man["network"]["profile"] == str(tmp_path / "runs/network.json")
    # measured already, the points queued: only the new point, not waiting for anything
    (tmp_path / "runs/network.json").write_text("{}")
    res = lartpc(*args[:4], "1,2,4", *args[5:], "--submit", path_first=bin_dir)
    assert res.returncode == 0, res.stderr
    new = calls.read_text().splitlines()[3:]
    assert len(new) == 1 and "allreduce" not in new[0] and "--dependency" not in new[0]
    res = lartpc("sweep", "--data", str(tmp_path), "--scheduler", "lsf", "--launcher",
                 "jsrun", "--measure-network", "--dry-run")
    assert res.returncode == 2 and "--measure-network needs --scheduler slurm" in res.stderr


@pytest.mark.parametrize("args,message", [
    (["--site", "perlmutter", "--account", "m1_g", "--gpus", "100000"],
     "--gpus 100000: needs 25000 nodes of 4 GPUs; site perlmutter has 1792 nodes"),
    (["--site", "slurm-gpu", "--gpus", "100000"],
     "--gpus 100000: needs 25000 nodes of 4 GPUs; more than 10000 nodes"),
    (["--site", "perlmutter", "--account", "m1_g", "--gpus-per-node", "8", "--gpus", "8"],
     "--gpus-per-node 8: site perlmutter has 4 GPUs per node"),
    (["--site", "slurm-gpu", "--gpus-per-node", "0"], "--gpus-per-node 0: must be at least 1"),
])
def test_gpu_counts_are_checked_against_the_site(tmp_path, args, message):
    res = lartpc("sweep", "--data", str(tmp_path), "--out-dir", str(tmp_path / "runs"),
                 "--models", "jishnet", "--cores-per-rank", "1", "--dry-run", *args)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert message in res.stderr
    assert "--nodes=" not in res.stdout and not (tmp_path / "runs").exists()


def test_site_that_declares_its_size_keeps_valid_points(tmp_path):
    site = tmp_path / "small.toml"
    site.write_text('scheduler = "slurm"\nlauncher = "torchrun"\ngpus_per_node = 4\n'
                    'nodes = 2\nsbatch_args = ["--exclusive"]\n')
    ok = lartpc("sweep", "--site", str(site), "--data", str(tmp_path), "--models", "jishnet",
                "--gpus", "1,8", "--gpus-per-node", "2", "--cores-per-rank", "1", "--dry-run")
    assert ok.returncode == 2 and "--gpus 8: needs 4 nodes of 2 GPUs; site" in ok.stderr
    ok = lartpc("sweep", "--site", str(site), "--data", str(tmp_path), "--models", "jishnet",
                "--gpus", "1,8", "--cores-per-rank", "1", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert "#SBATCH --nodes=2\n" in ok.stdout and "#SBATCH --exclusive\n" in ok.stdout
    site.write_text('scheduler = "slurm"\nnodes = 0\n')
    bad = lartpc("sweep", "--site", str(site), "--data", str(tmp_path), "--dry-run")
    assert bad.returncode == 2 and "nodes = 0 must be at least 1" in bad.stderr


@pytest.mark.parametrize("site", ["perlmutter", "slurm-gpu"])
def test_gpu_sites_ask_for_whole_nodes(tmp_path, site):
    res = lartpc("sweep", "--site", site, "--account", "m1_g", "--data", str(tmp_path),
                 "--models", "jishnet", "--gpus", "1", "--cores-per-rank", "1", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --exclusive\n" in res.stdout  # the 1-GPU baseline shares no node


def test_data_only_on_the_cluster_and_variables_kept_for_the_job(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    base = ["sweep", "--scheduler", "slurm", "--launcher", "torchrun", "--models",
            "jishnet", "--gpus", "1", "--cores-per-rank", "1", "--out-dir", str(out)]
    monkeypatch.delenv("LARTPC_TEST_SCRATCH", raising=False)
    res = lartpc(*base, "--data", "$LARTPC_TEST_SCRATCH/events")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--data $LARTPC_TEST_SCRATCH/events: no such folder here; --no-data-check" \
        in res.stderr and not out.exists()
    # Written without --dry-run, the variable left for the job's shell.
    res = lartpc(*base, "--data", "${LARTPC_TEST_SCRATCH}/my events", "--no-data-check")
    assert res.returncode == 0, res.stderr
    script = (out / "jobs/jishnet-n1-s0.sbatch").read_text()
    line = "export LARTPC_DATA=\"${LARTPC_TEST_SCRATCH:?is not set on this node}\"'/my events'\n"
    assert line in script
    man = json.loads((out / "manifest.json").read_text())
    assert man["data"] == "${LARTPC_TEST_SCRATCH}/my events"
    probe = subprocess.run(["bash", "-c", line + 'printf %s "$LARTPC_DATA"'],
                           env={**os.environ, "LARTPC_TEST_SCRATCH": "/lus/x"},
                           capture_output=True, text=True)
    assert probe.stdout == "/lus/x/my events"  # expanded on the node, the rest literal
    probe = subprocess.run(["bash", "-c", line + 'printf %s "$LARTPC_DATA"'],
                           env={**os.environ, "LARTPC_TEST_SCRATCH": ""},
                           capture_output=True, text=True)  # not "/my events": stopped
    assert probe.returncode != 0 and probe.stdout == ""
    assert "LARTPC_TEST_SCRATCH: is not set on this node" in probe.stderr
    res = lartpc(*base, "--data", "events/$LARTPC_TEST_SCRATCH", "--no-data-check")
    assert res.returncode == 2 and "must start with one or with /" in res.stderr
    res = lartpc(*base[:-1], "$LARTPC_TEST_SCRATCH/runs", "--data", str(tmp_path),
                 "--no-data-check")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--out-dir '$LARTPC_TEST_SCRATCH/runs': goes into #SBATCH/#BSUB lines" in res.stderr


def test_failed_squeue_submits_nothing(tmp_path, events_dir):
    bin_dir, counter = _counting_sbatch(tmp_path)
    fake(bin_dir, "squeue", 'exit 0\n')
    assert _submit(tmp_path, events_dir, bin_dir).returncode == 0
    manifest = tmp_path / "runs/manifest.json"
    before = manifest.read_text()
    # The controller does not answer: the points' jobs may still be queued.
    fake(bin_dir, "squeue", 'echo "slurm_load_jobs error: Socket timed out on send/recv '
                            'operation" >&2\nexit 1\n')
    res = _submit(tmp_path, events_dir, bin_dir)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--submit: `squeue -h -j 101 -o %T` failed (exit 1: slurm_load_jobs error: " \
        "Socket timed out" in res.stderr and "nothing submitted" in res.stderr
    assert counter.read_text().strip() == "102" and manifest.read_text() == before
    # A job the controller no longer knows has ended: its point is submitted again.
    fake(bin_dir, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2\n'
                            'exit 1\n')
    res = _submit(tmp_path, events_dir, bin_dir)
    assert res.returncode == 0, res.stderr
    assert counter.read_text().strip() == "104"
    (bin_dir / "squeue").unlink()
    res = _submit(tmp_path, events_dir, bin_dir, hide=("squeue",))
    assert res.returncode == 2 and "`squeue` not found on PATH" in res.stderr
    assert counter.read_text().strip() == "104"


def test_lsf_resubmission_is_recorded_and_not_submitted_again(tmp_path, events_dir):
    """An LSF job that resubmits itself (common.sh) writes the new id into the manifest,
    and --submit then leaves the point to that chain."""
    bin_dir, runs = tmp_path / "bin", tmp_path / "runs"
    calls = tmp_path / "bsub.calls"
    fake(bin_dir, "bsub", f'cat > /dev/null; echo x >> {calls}\n'
                          'echo "Job <$((700 + $(wc -l < ' + str(calls) + ')))> is submitted '
                          'to queue <batch>."\n')
    fake(bin_dir, "bjobs", 'case "$4" in 702) echo PEND ;; *) echo "Job <$4> is not found" '
                           '>&2; exit 255 ;; esac\n')
    args = ["sweep", "--models", "jishnet", "--gpus", "1", "--data", str(events_dir),
            "--out-dir", str(runs), "--scheduler", "lsf", "--launcher", "horovod",
            "--config-prefix", "tiny", "--cores-per-rank", "1", "--submit"]
    res = lartpc(*args, path_first=bin_dir)
    assert res.returncode == 0, res.stderr
    script = runs / "jobs/jishnet-n1-s0.lsf"
    assert f"export LARTPC_MANIFEST={runs}/manifest.json\n" in script.read_text()
    # Job 701 reaches its time limit and resubmits the script: job 702.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LARTPC_"))}
    env.update(PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
               LSB_JOBID="701", LARTPC_SCRIPT=str(script), LARTPC_POINT="jishnet-n1-s0",
               LARTPC_MANIFEST=str(runs / "manifest.json"))
    r = subprocess.run(["bash", "-c", f'source {ROOT}/jobs/slurm/common.sh; lartpc_requeue'],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "Job <702> is submitted" in r.stderr, r.stderr
    point = json.loads((runs / "manifest.json").read_text())["points"][0]
    assert point["job_id"] == "702" and point["jobs"] == ["701", "702"]
    res = lartpc(*args, path_first=bin_dir)
    assert res.returncode == 0, res.stderr
    assert "jishnet-n1-s0: not submitted, its job 702 is pend" in res.stdout
    assert len(calls.read_text().split()) == 2  # the sweep's and the job's own



def test_lsf_resubmission_leaves_out_what_the_job_worked_out_itself(tmp_path):
    """bsub hands the next job the resubmitting shell's environment. What this job
    worked out for itself (env.sh's defaults: NCCL's log named by this job's id, the
    thread count; the time limit's origin) is left out, so the next job works out its
    own; what the user set before submitting is handed on."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "bsub.env"
    fake(bin_dir, "bsub", f'cat > /dev/null; env > {seen}; echo "Job <702> is submitted."\n')
    script = tmp_path / "job.lsf"
    script.write_text("#!/bin/bash\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "LARTPC_", "NCCL_", "OMP_", "HDF5_", "TORCH_NCCL"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", LSB_JOBID="701", LARTPC_SCRIPT=str(script),
               LARTPC_RUN=str(tmp_path / "runs" / "r"), TORCH_NCCL_ASYNC_ERROR_HANDLING="0")
    probe = (f'source {ROOT}/jobs/slurm/common.sh; lartpc_env 4; '
             'export LARTPC_LIMIT_FROM=$(date +%s); lartpc_requeue')
    r = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "Job <702> is submitted" in r.stderr, r.stderr
    handed = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    for name in ("NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "OMP_NUM_THREADS",
                 "HDF5_USE_FILE_LOCKING", "LARTPC_SRUN_MPI", "LARTPC_LIMIT_FROM"):
        assert name not in handed, (name, handed.get(name))
    assert handed["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"  # the user's
    assert handed["LARTPC_RESUBMIT_COUNT"] == "1"
    assert handed["LARTPC_SCRIPT"] == str(script)

def test_lsf_chain_stops_when_its_script_was_rewritten(tmp_path):
    """An LSF chain resubmits its script from disk: its first job notes the script's hash
    and hands it on, and a job whose script has been rewritten since (another sweep into
    the same folder) does not resubmit it."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "bsub.env"
    fake(bin_dir, "bsub", f'cat > /dev/null; env > {seen}; echo "Job <702> is submitted."\n')
    script = tmp_path / "job.lsf"
    script.write_text("#!/bin/bash\n# LARTPC_SET=train.epochs=3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LARTPC_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", LSB_JOBID="701", LARTPC_SCRIPT=str(script))
    chain = f"source {ROOT}/jobs/slurm/common.sh; lartpc_note_script; "
    r = subprocess.run(["bash", "-c", chain + "lartpc_requeue"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "Job <702> is submitted" in r.stderr, r.stderr
    handed = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert handed["LARTPC_SCRIPT_SHA256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    seen.unlink()
    # job 702 starts with the hash handed on; the script is rewritten while it runs
    env["LARTPC_SCRIPT_SHA256"] = handed["LARTPC_SCRIPT_SHA256"]
    r = subprocess.run(["bash", "-c", chain + f"echo changed >> {script}; lartpc_requeue"],
                       env=env, capture_output=True, text=True)
    # a give-up: nonzero, so the job ends FAILED and no afterok dependent starts
    assert r.returncode == 1 and "not the script this chain started with" in r.stderr
    assert "not resubmitted" in r.stderr and not seen.exists(), r.stderr


_BIND = """
import json, socket, sys
from dataclasses import dataclass
from lartpc.config import load_config
from lartpc.dist.world import LocalWorld
from lartpc.train.parts import bind_cores, set_threads, cpu_mask

peers = json.loads(sys.argv[1])  # the other ranks' masks on this host, by rank

@dataclass(frozen=True)
class Node(LocalWorld):
    def allgather_object(self, obj):
        return [(socket.gethostname(), cpu_mask() if m is None else m, r)
                for r, m in enumerate(peers)]

world = Node(rank=1, local_size=len(peers))
binding = bind_cores(world)
threads = set_threads(load_config("tiny-jishnet", []), world, binding)
print(json.dumps({**binding, "threads": threads, "mask_after": cpu_mask()}))
"""


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_same_threads_and_own_cores_under_every_launcher():
    """torchrun's two ranks share their task's 2 cores and bind one each; srun's tasks
    come with a core each: either way a rank has one core and one thread."""
    def rank1(cores: str, peers: list) -> dict:
        res = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", _BIND,
                              json.dumps(peers)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    torchrun = rank1("0,1", [None, None])  # both ranks in one mask
    assert torchrun == {"launcher_mask": "0-1", "ranks_sharing_mask": 2, "bound_by": "lartpc",
                        "cores": "1", "ranks_per_core_set": 1, "threads": 1,
                        "mask_after": [1]}
    srun = rank1("1", [[0], None])  # srun gave each task its own core
    assert srun["bound_by"] in ("launcher", "none") and srun["ranks_sharing_mask"] == 1
    assert srun["threads"] == torchrun["threads"] and srun["mask_after"] == [1]


def test_generic_lsf_site_renders_jsrun_scripts(tmp_path):
    res = lartpc("sweep", "--site", "lsf-jsrun", "--data", str(tmp_path), "--models",
                 "jishnet", "--gpus", "12", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#BSUB -nnodes 2\n" in res.stdout and "export LARTPC_CORES_PER_TASK=7\n" in res.stdout
    assert "### launch: jsrun -n 12 -a 1 -c 7 -g 1 --bind=packed:7 lartpc train" in res.stdout
