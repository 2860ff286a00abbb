"""``lartpc bench allreduce`` without SLURM: the ring fit on synthetic timings (made with
analysis/profiles.py's own allreduce model, so the fit and the prediction agree), the
summary and the profile it writes, option errors, and a real 2-rank run under torchrun.
The 2-node run on a throttled link is in test_slurm_multinode.py."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from lartpc.analysis.profiles import allreduce_s, load_profile_file, load_profiles
from train_helpers import BIN, clean_env, run

from lartpc.bench.allreduce import fit_ring, message_sizes, parse_bytes, profile, summarise
from lartpc.dist.world import first_host
from lartpc.errors import LartpcError

SIZES = message_sizes(4, 64 << 20, 4)


def _link(alpha_us: float, beta_gbps: float, n: int):
    """A one-link profile (every rank on its own node) for analysis's allreduce_s."""
    return replace(load_profiles()["summitdev"], gpus_per_node=1, alpha_intra_us=alpha_us,
                   alpha_inter_us=alpha_us, beta_intra_GBps=beta_gbps,
                   beta_inter_GBps=beta_gbps)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_fit_recovers_the_prediction_models_alpha_and_beta(n):
    prof = _link(150.0, 0.025, n)
    times = [allreduce_s(n, s, prof) for s in SIZES]
    fit = fit_ring(n, SIZES, times)
    assert fit["alpha_s"] == pytest.approx(150e-6, rel=1e-6)
    assert fit["beta_Bps"] == pytest.approx(0.025e9, rel=1e-6)
    assert fit["rel_rms"] < 1e-9


def test_fit_keeps_the_bandwidth_when_small_messages_are_delayed():
    """A busy host delays some small allreduces by a scheduler tick (4 ms): the
    bandwidth still comes from the messages it dominates (this happened on the 2-core
    VM; a fit on relative residuals gave 170-225 Mbit/s for a 188 Mbit/s link)."""
    prof = _link(150.0, 0.025, 2)
    rng = np.random.default_rng(0)
    for _ in range(20):
        times = [allreduce_s(2, s, prof) * rng.uniform(0.97, 1.03) for s in SIZES]
        for i in rng.choice(7, size=4, replace=False):  # sizes 4 B .. 16 KiB
            times[i] += 4e-3
        fit = fit_ring(2, SIZES, times)
        assert fit["beta_Bps"] == pytest.approx(0.025e9, rel=0.05)


def test_a_negative_latency_is_held_at_zero():
    """Times a free fit explains with alpha < 0 (here exactly -5 us): alpha 0, and the
    bandwidth refitted through the origin."""
    sizes = SIZES[7:]  # 64 KiB .. 64 MiB
    times = [s / 1e9 - 1e-5 for s in sizes]
    (a, inv_b), *_ = np.linalg.lstsq(np.column_stack([np.full(len(sizes), 2.0), sizes]),
                                     times, rcond=None)
    assert a == pytest.approx(-5e-6)
    fit = fit_ring(2, sizes, times)
    assert fit["alpha_s"] == 0.0 and fit["beta_Bps"] == pytest.approx(1e9, rel=0.01)


@pytest.mark.parametrize("n,sizes,times,message", [
    (1, [4, 16], [1e-3, 2e-3], "2 or more ranks"),
    (2, [4], [1e-3], "two or more message sizes"),
    (2, [4, 16], [1e-3, 0.0], "positive times"),
    (2, [4, 1 << 20, 4 << 20], [3e-3, 2e-3, 1e-3], "does not grow with the message size"),
])
def test_fit_refuses_what_it_cannot_fit(n, sizes, times, message):
    with pytest.raises(LartpcError, match=message):
        fit_ring(n, sizes, times)


def test_sizes_and_byte_counts():
    assert SIZES[:3] == [4, 16, 64] and SIZES[-1] == 64 << 20 and len(SIZES) == 13
    assert message_sizes(4, 32, 4) == [4, 16, 32]
    assert message_sizes(4, 32, 2) == [4, 8, 16, 32]
    assert parse_bytes("64MiB", "--max-bytes") == 64 << 20
    assert parse_bytes("16k", "--x") == 16384 and parse_bytes("8", "--x") == 8
    for bad in ("3", "0", "6", "1.5MiB", "12 parsecs", ""):
        with pytest.raises(LartpcError, match="--max-bytes"):
            parse_bytes(bad, "--max-bytes")


def test_summary_takes_each_repeats_slowest_rank():
    # rank r, size i, repeat k: rank 1 is slower in repeats 0 and 2 of size 0
    per_rank = [[[1.0, 2.0, 3.0], [10.0, 10.0, 10.0]],
                [[1.5, 1.0, 3.5], [10.0, 11.0, 9.0]]]
    s = summarise(2, [4, 1 << 20], per_rank)
    assert s["median_s"] == [2.0, 10.0] and s["min_s"] == [1.5, 10.0]
    assert s["max_s"] == [3.5, 11.0] and s["repeats"] == [3, 3]
    assert s["p25_s"][0] == pytest.approx(1.75) and s["p75_s"][0] == pytest.approx(2.75)
    assert s["bus_GBps"][1] == pytest.approx((1 << 20) / 10.0 / 1e9, rel=1e-5)


@pytest.mark.parametrize("hosts,link", [(["a", "b", "a", "b"], "inter"),
                                        (["a", "a", "a", "a"], "intra")])
def test_profile_is_one_analysis_predicts_with(tmp_path, hosts, link):
    prof_in = _link(80.0, 2.0, 4)
    per_rank = [[[allreduce_s(4, s, prof_in)] * 3 for s in SIZES] for _ in hosts]
    summary = summarise(4, SIZES, per_rank)
    p = profile("mine", summary, hosts, 4, hosts.count("a"), "torch", "CPU (torch backend)",
                ["lartpc", "bench", "allreduce"], date="2026-11-24T10:00:00+00:00")
    assert p["measured"]["link"] == link and p["measured"]["nodes"] == len(set(hosts))
    assert p["measured"]["median_s"] == summary["median_s"]
    assert any(s.startswith(f"alpha_{link}, beta_{link}: measured") for s in p["sources"])
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(p))
    got = load_profile_file(f)
    assert got.name == "mine" and got.compute == "runs" and got.gpus_per_node == p[
        "gpus_per_node"]
    for n in (2, 4, 16):  # the prediction from the file is the model the timings came from
        assert allreduce_s(n, 5e6, got) == pytest.approx(allreduce_s(n, 5e6, prof_in),
                                                         rel=1e-4)


def test_first_host_of_a_slurm_node_list():
    assert first_host("lartpc-n[1-2]") == "lartpc-n1"
    assert first_host("n[07-09,12],m1") == "n07"
    assert first_host("gpu3,gpu[1-2]") == "gpu3"
    assert first_host("rack[2-3]-n[4-5]") == "rack2-n4"
    with pytest.raises(LartpcError):
        first_host(",")


def test_plain_srun_meets_at_the_steps_first_node(monkeypatch):
    """srun without MASTER_ADDR (a job step the sbatch script did not prepare): the
    step's first node and common.sh's per-job port, as lartpc_master would export."""
    from lartpc.dist.world import _torch_env

    # _torch_env fills os.environ: a copy, so nothing it sets outlives the test (a RANK
    # left in the test process once reached a later SLURM job through sbatch)
    monkeypatch.setattr(os, "environ", clean_env())
    os.environ.update({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                       "SLURM_JOB_ID": "123456", "SLURM_STEP_NODELIST": "lartpc-n[1-2]",
                       "SLURM_JOB_NODELIST": "lartpc-n[1-3]"})
    assert _torch_env() == (1, 0, 2)
    assert os.environ["MASTER_ADDR"] == "lartpc-n1"
    assert os.environ["MASTER_PORT"] == _common_sh_port("123456")


def _common_sh_port(job_id: str) -> str:
    """The MASTER_PORT jobs/slurm/common.sh's lartpc_master exports for a job (its
    lartpc_job_port)."""
    common = Path(__file__).resolve().parents[1] / "jobs" / "slurm" / "common.sh"
    env = {**clean_env(), "SLURM_JOB_ID": job_id}
    r = subprocess.run(["bash", "-c", f'source "{common}"; lartpc_job_port'],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[-1]


@pytest.mark.parametrize("job_id", [0, 12767, 19999, 20000, 123456, 7654321])
def test_the_rendezvous_port_is_one_per_job_and_below_the_ephemeral_ports(job_id):
    """Python's and the job script's port agree, and lie below 32768, where Linux's
    outgoing connections take their ports (a busy node could hold the port otherwise)."""
    from lartpc.dist.world import job_port

    assert str(job_port(job_id)) == _common_sh_port(str(job_id))
    assert 1024 < job_port(job_id) < 32768


@pytest.mark.parametrize("stale", [{"RANK": "1", "WORLD_SIZE": "2"}, {"RANK": "0"},
                                   {"LOCAL_RANK": "3"}])
def test_plain_srun_task_ignores_a_rank_inherited_from_the_submitting_shell(
        monkeypatch, caplog, stale):
    """sbatch exports the submitting environment: a RANK set there reaches every task of
    the job's srun steps alike, and with it no task would host the rendezvous (both
    ranks waited on a server no one started). SLURM's task variables decide."""
    from lartpc.dist.world import _torch_env

    monkeypatch.setattr(os, "environ", clean_env())
    for task, expect in (("0", (0, 0, 2)), ("1", (1, 1, 2))):
        os.environ.clear()
        os.environ.update({**clean_env(), **stale, "SLURM_PROCID": task, "SLURM_NTASKS": "2",
                           "SLURM_LOCALID": task, "SLURM_STEP_ID": "0",
                           "MASTER_ADDR": "lartpc-n1", "MASTER_PORT": "20046"})
        with caplog.at_level("WARNING", logger="lartpc.dist.world"):
            assert _torch_env() == expect
        assert all(os.environ[k] == v for k, v in zip(
            ("RANK", "LOCAL_RANK", "WORLD_SIZE"), map(str, expect), strict=True))
    assert "from the submitting environment ignored" in caplog.text


def test_torchrun_worker_keeps_its_rank_under_srun(monkeypatch):
    """torchrun started by srun (torchrun.sbatch): its workers' RANK is torchrun's, not
    the srun task's (one task per node starts several ranks)."""
    from lartpc.dist.world import _torch_env

    monkeypatch.setattr(os, "environ", clean_env())
    os.environ.update({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
                       "TORCHELASTIC_RUN_ID": "42", "RANK": "3", "LOCAL_RANK": "1",
                       "WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "29400"})
    assert _torch_env() == (3, 1, 4)


def test_slurm_procid_without_ntasks_is_a_config_error(monkeypatch):
    """dist.backend=torch forced in a batch script that sets SLURM_PROCID but not
    SLURM_NTASKS: a KeyError traceback, not a message."""
    from lartpc.dist.world import _torch_env

    monkeypatch.setattr(os, "environ", clean_env())
    os.environ.update({"SLURM_PROCID": "0", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"})
    with pytest.raises(LartpcError, match="needs SLURM_NTASKS in the environment"):
        _torch_env()


@pytest.mark.parametrize("argv,message", [
    (["--max-bytes", "6"], "--max-bytes '6': expected a multiple of 4 bytes"),
    (["--min-bytes", "1MiB", "--max-bytes", "1KiB"], "--max-bytes 1KiB: must exceed"),
    (["--repeats", "2"], "--repeats 2: expected >= 3"),
    (["--seconds-per-size", "0"], "--seconds-per-size 0.0: expected a positive"),
    ([], "allreduce needs 2 or more ranks"),  # no launcher: one process
])
def test_bad_input_is_one_line_exit_2(argv, message):
    r = run([str(BIN / "lartpc"), "bench", "allreduce", *argv], timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.slow
def test_two_ranks_under_torchrun_write_an_intra_node_profile(tmp_path):
    # Up to 16 MiB: on a busy 2-core host a delayed small message can take longer than a
    # 256 KiB one (CI saw no growth up to 256 KiB once); 16 MiB takes ~10 ms over Gloo's
    # loopback TCP, far above any scheduling delay, so the bandwidth is always resolved.
    out = tmp_path / "profile.json"
    r = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "lartpc",
             "bench", "allreduce", "--max-bytes", "16MiB", "--warmup", "1", "--repeats",
             "5", "--out", str(out)], timeout=300, OMP_NUM_THREADS="1")
    assert r.returncode == 0, r.stderr[-3000:]
    printed = json.loads(r.stdout)
    written = json.loads(out.read_text())
    assert printed["out"] == str(out) and printed["measured"] == written["measured"]
    m = written["measured"]
    assert m["world_size"] == 2 and m["nodes"] == 1 and m["link"] == "intra"
    assert m["backend"] == "torch" and written["gpus_per_node"] == 2
    assert m["sizes_bytes"] == message_sizes(4, 16 << 20, 4) and m["repeats"] == [5] * 12
    assert all(a <= b <= c for a, b, c in zip(m["min_s"], m["median_s"], m["max_s"],
                                              strict=True))
    assert written["beta_intra_GBps"] > 0 and written["alpha_intra_us"] >= 0
    assert load_profile_file(out).beta_intra_GBps == written["beta_intra_GBps"]


def test_a_folder_as_out_is_refused_by_every_rank(tmp_path):
    r = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "lartpc",
             "bench", "allreduce", "--max-bytes", "64", "--out", str(tmp_path)],
            timeout=300)
    assert r.returncode != 0
    assert f"--out {tmp_path}: is a folder" in r.stderr
    assert not list(tmp_path.iterdir())
