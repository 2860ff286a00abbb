"""run.json's ``network``: the collective library, NCCL's version, plugin and the
transport it chose (from its INFO set-up lines), and a loud warning for sockets
between nodes; the job scripts' NCCL log file and a site's network settings."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lartpc.dist import transport
from lartpc.dist.world import LocalWorld

ROOT = Path(__file__).resolve().parents[1]
#: Set-up lines as NCCL 2.x writes them with NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET.
SOCKET_LINES = """\
nid001:12345:12345 [0] NCCL INFO Bootstrap : Using hsn0:10.100.0.1<0>
nid001:12345:12345 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.
nid001:12345:12345 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.100.0.1<0>
nid001:12345:12345 [0] NCCL INFO Using network Socket
"""
IB_LINES = """\
gpu01:777:777 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
gpu01:777:777 [0] NCCL INFO Using network IB
"""


def _nccl_log(tmp_path: Path, monkeypatch, text: str | None) -> None:
    pattern = tmp_path / "nccl.%h.%p.log"
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(pattern))
    if text is not None:  # this process's own file, as NCCL names it
        transport.debug_file().write_text(text)


def test_gloo_is_recorded_as_tcp():
    net = transport.describe("gloo", 2)
    assert net["library"] == "gloo" and net["transport"] == "TCP" and net["nodes"] == 2
    assert net["sockets_across_nodes"] is False  # Gloo has no other path: no warning


#: an NCCL without the "Using network" summary line: the NET/<name> : Using line says it,
#: not the plugin line before it
NO_SUMMARY = "\n".join(SOCKET_LINES.splitlines()[:3]) + "\n"


@pytest.mark.parametrize("text,nodes,chosen,warn", [
    (SOCKET_LINES, 2, "Socket", True), (SOCKET_LINES, 1, "Socket", False),
    (IB_LINES, 4, "IB", False), (None, 2, None, False), (NO_SUMMARY, 2, "Socket", True)])
def test_nccl_transport_from_its_info_lines(tmp_path, monkeypatch, text, nodes, chosen, warn):
    _nccl_log(tmp_path, monkeypatch, text)
    monkeypatch.setenv("NCCL_NET_PLUGIN", "ofi-lartpc-test")
    net = transport.describe("nccl", nodes)
    assert net["transport"] == chosen and net["sockets_across_nodes"] is warn
    assert net["net_plugin"] == "ofi-lartpc-test"
    assert net["net_plugin_library"] == "libnccl-net-ofi-lartpc-test.so"
    assert net["net_plugin_loadable"] is False
    if chosen is None:
        assert net["transport_source"].startswith("unknown: no NCCL_DEBUG=INFO file")
    else:
        assert net["transport_source"].endswith(f".{os.getpid()}.log")


@dataclass(frozen=True)
class _NcclWorld(LocalWorld):
    def collectives(self) -> str:
        return "nccl"


def test_sockets_between_nodes_warn_loudly_and_are_recorded(tmp_path, monkeypatch, caplog):
    from lartpc.runfolder.folder import RunFolder
    from lartpc.train import run

    _nccl_log(tmp_path, monkeypatch, SOCKET_LINES)
    out = tmp_path / "run"
    out.mkdir()
    folder = RunFolder(out)
    folder.info = {"nodes": ["nid001", "nid002"]}
    with caplog.at_level(logging.WARNING):
        run._record_network(folder, _NcclWorld())
    assert "2 nodes talk through NCCL over TCP SOCKETS" in caplog.text
    net = json.loads((out / "run.json").read_text())["network"]
    assert net["transport"] == "Socket" and net["sockets_across_nodes"] is True
    caplog.clear()
    folder.info = {"nodes": ["nid001"]}
    run._record_network(folder, LocalWorld())
    assert "SOCKETS" not in caplog.text
    assert json.loads((out / "run.json").read_text())["network"]["library"] == "none"


def _env_after(setup: str, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "LARTPC_", "NCCL_"))}
    probe = f'{setup}; source {ROOT}/jobs/slurm/common.sh; lartpc_env 4; env'
    out = subprocess.run(["bash", "-c", probe], env={**base, **env}, capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_job_scripts_send_nccl_setup_lines_to_a_file_beside_the_logs():
    env = _env_after(":", LARTPC_RUN="/lus/runs/jishnet-n8-s0", SLURM_JOB_ID="4242")
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == "/lus/runs/logs/nccl-jishnet-n8-s0-4242.%h.%p.log"
    env = _env_after(":", LARTPC_RUN="/lus/runs/p", NCCL_DEBUG="WARN")
    assert env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in env  # the user's


def test_perlmutter_sets_its_network_and_srun_mpi(tmp_path):
    stub = "module() { :; }"  # NERSC's module command is not here
    env = _env_after(f"{stub}; source {ROOT}/jobs/sites/perlmutter-prelude.sh",
                     LARTPC_RUN="/r/p")
    assert env["NCCL_SOCKET_IFNAME"] == "hsn" and env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert _env_after(":", LARTPC_RUN="/r/p")["LARTPC_SRUN_MPI"] == "pmix"  # no site
    res = subprocess.run([sys.executable, "-m", "lartpc", "sweep", "--site", "perlmutter",
                          "--account", "m1_g", "--launcher", "horovod", "--models",
                          "jishnet", "--gpus", "8", "--data", str(tmp_path), "--dry-run"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "export LARTPC_SRUN_MPI=cray_shasta\n" in res.stdout
    assert "### launch: srun --mpi=cray_shasta --ntasks=8" in res.stdout
    site = tmp_path / "bad.toml"
    site.write_text('scheduler = "slurm"\nlauncher = "horovod"\nsrun_mpi = "pmix; id"\n')
    res = subprocess.run([sys.executable, "-m", "lartpc", "sweep", "--site", str(site),
                          "--data", str(tmp_path), "--dry-run"], capture_output=True, text=True)
    assert res.returncode == 2 and f"site {site}: srun_mpi 'pmix; id'" in res.stderr
