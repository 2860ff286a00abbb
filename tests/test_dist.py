"""Real multi-process runs of lartpc.dist under horovodrun and torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import clean_env, launcher

from lartpc.dist import detect_backend
from lartpc.dist.world import World

WORKER = str(Path(__file__).with_name("dist_worker.py"))
BIN = Path(sys.executable).parent
LAUNCH_TIMEOUT_S = 240



def _run(cmd: list[str], timeout: float = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=clean_env(OMP_NUM_THREADS="1"))


def _single(out: Path) -> dict:
    r = _run([sys.executable, WORKER, "--out", str(out), "--single"])
    assert r.returncode == 0, r.stderr
    return torch.load(out / "params-rank0-single.pt")


def _check_two_ranks(out: Path, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    p0 = torch.load(out / "params-rank0.pt")
    p1 = torch.load(out / "params-rank1.pt")
    ref = _single(out)
    for k in p0:
        assert torch.equal(p0[k], p1[k]), f"{k} differs between ranks"
        torch.testing.assert_close(p0[k], ref[k], rtol=rtol, atol=atol,
                                   msg=f"{k}: 2-rank run differs from 1 process on the whole batch")
    # The run really trained: parameters moved away from their initial values.
    from dist_worker import model_and_data

    init = model_and_data()[0].state_dict()
    assert any(not torch.allclose(init[k], p0[k]) for k in p0)


@pytest.mark.horovod
def test_horovodrun_two_ranks_match_single_process(tmp_path):
    cmd = [launcher("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, WORKER, "--out", str(tmp_path)]
    r = _run(cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_two_ranks(tmp_path)


def test_torchrun_two_ranks_match_single_process(tmp_path):
    cmd = [launcher("torchrun"), "--standalone", "--nproc-per-node", "2",
           WORKER, "--out", str(tmp_path), "--backend", "torch"]
    r = _run(cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_two_ranks(tmp_path)


@pytest.mark.horovod
def test_horovodrun_fp16_gradient_compression(tmp_path):
    """Gradients sent as float16: ranks stay identical, close to the float32 result."""
    cmd = [launcher("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, WORKER, "--out", str(tmp_path), "--compression", "fp16"]
    r = _run(cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_two_ranks(tmp_path, rtol=1e-2, atol=1e-3)


@pytest.mark.horovod
def test_horovodrun_failing_rank_exits_nonzero(tmp_path):
    r = _run([launcher("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
              sys.executable, WORKER, "--out", str(tmp_path), "--fail-rank", "1"])
    assert r.returncode != 0
    assert "failing on purpose" in r.stdout + r.stderr
    assert not (tmp_path / "params-rank0.pt").exists()


def test_torchrun_failing_rank_exits_nonzero(tmp_path):
    r = _run([launcher("torchrun"), "--standalone", "--nproc-per-node", "2",
              WORKER, "--out", str(tmp_path), "--backend", "torch", "--fail-rank", "1"])
    assert r.returncode != 0
    assert "failing on purpose" in r.stdout + r.stderr
    assert not (tmp_path / "params-rank0.pt").exists()


@pytest.mark.parametrize("env,expected", [
    ({}, "none"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "horovod"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, "horovod"),
    ({"JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "6"}, "horovod"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}, "none"),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2"}, "torch"),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, "torch"),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "PMIX_RANK": "1"}, "horovod"),
    ({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "1"}, "none"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "torch"),
    # srun --mpi=pmix from a shell that had RANK and WORLD_SIZE set: MPI's, not those
    ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4",
      "PMIX_RANK": "3"}, "horovod"),
])
def test_detect_backend(env, expected):
    assert detect_backend(env) == expected


@pytest.mark.parametrize("env,expected", [
    ({"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "4", "SLURM_STEP_TASKS_PER_NODE": "1",
      "SLURM_NODEID": "0"}, 4),  # torchrun under srun: one task per node, 4 ranks each
    # srun -N2 -n8 without --ntasks-per-node: 4 on each node, not the world's 8
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"}, 4),
    ({"SLURM_STEP_TASKS_PER_NODE": "3(x2),2", "SLURM_NODEID": "2"}, 2),
    ({"SLURM_NTASKS_PER_NODE": "2"}, 2),
    ({}, 8),
])
def test_local_world_size(env, expected):
    from lartpc.dist.world import local_world_size

    assert local_world_size(env, 8) == expected


def test_single_process_world_collectives_are_identity():
    from lartpc.dist import init

    w = init("none", device="cpu")
    assert (w.rank, w.local_rank, w.size, w.backend) == (0, 0, 1, "none")
    t = torch.tensor([1.5, -2.0])
    assert torch.equal(w.allreduce_mean(t), t) and torch.equal(w.allreduce_sum(t), t)


def test_bad_backend_is_config_error():
    from lartpc.dist import init
    from lartpc.errors import ConfigError

    with pytest.raises(ConfigError, match="dist.backend"):
        init("mpi")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_ranks_on_cuda_reduce_cpu_and_cuda_tensors(tmp_path):
    """A torch.distributed world on CUDA takes the loop's CPU-tensor agreements (step
    vote, evaluation counts, checkpoint checks) as well as CUDA gradients: NCCL alone
    refused every CPU collective ("No backend type associated with device type cpu")."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import torch, torch.distributed as dist\n"
            "from lartpc.dist import init\n"
            "w = init('torch', device='cuda')\n"
            "a, b = torch.ones(3), torch.ones(3, device='cuda')\n"
            "dist.all_reduce(a); dist.all_reduce(b); dist.barrier()\n"
            "print(w.backend, a.tolist(), b.cpu().tolist())\n"
            "dist.destroy_process_group()\n")
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[-2] == "torch [1.0, 1.0, 1.0] [1.0, 1.0, 1.0]"


class _NanOnRankZero(World):
    """Rank 0 of two, whose parameters are rank 1's with a NaN in front (the base
    class's collectives are one process's: rank 1 holds this process's parameters)."""

    def _broadcast_tensor(self, t, root=0):
        t = t.clone()
        t[0] = float("nan")
        return t


def test_param_divergence_counts_the_same_nan_as_equal():
    """A diverged run's NaN weights, the same on both ranks: NaN, which run.json cannot
    hold as strict JSON, and 'ranks ended with different parameters'."""
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(float("nan"))
        model.bias.fill_(float("inf"))
    assert World(rank=0, size=2).param_divergence(model) == 0.0
    model = torch.nn.Linear(2, 2)  # rank 0 has a NaN where rank 1 has a number
    assert _NanOnRankZero(rank=0, size=2).param_divergence(model) == float("inf")
