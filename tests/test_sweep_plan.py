"""The sweep as a library (lartpc.jobs.plan): a request, its plan, then render or write;
`lartpc sweep` is a shell over the same calls, so both print the same scripts."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from lartpc.jobs.plan import SweepRequest, plan, render, write

from lartpc.errors import LartpcError


def _request(tmp_path: Path, **kw) -> SweepRequest:
    return SweepRequest(**{"site": "perlmutter", "account": "m0000", "models": "jishnet",
                           "gpus": "4,8", "data": "$SCRATCH/events",
                           "out_dir": tmp_path / "runs", "check_data": False, **kw})


def test_plan_renders_what_the_command_prints(tmp_path):
    req = _request(tmp_path)
    p = plan(req)
    assert [pt.name for pt in p.points] == ["jishnet-n4-s0", "jishnet-n8-s0"]
    assert p.request.scheduler == "slurm" and p.shape.cores_per_rank == 32  # the site's
    assert req.scheduler is None and req.sbatch_args == []  # the request is left as given
    out = io.StringIO()
    render(p, out)
    cli = subprocess.run([sys.executable, "-m", "lartpc", "sweep", "--site", "perlmutter",
                          "--account", "m0000", "--models", "jishnet", "--gpus", "4,8",
                          "--data", "$SCRATCH/events", "--out-dir", str(tmp_path / "runs"),
                          "--dry-run"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert out.getvalue() == cli.stdout
    assert "#SBATCH --nodes=2" in p.scripts["jishnet-n8-s0"]
    assert not (tmp_path / "runs").exists()  # planning and rendering write nothing


def test_write_puts_the_planned_scripts_and_manifest(tmp_path):
    p = plan(_request(tmp_path))
    result = write(p)
    assert result.manifest == p.out_dir / "manifest.json" and result.skipped == []
    for pt in p.points:
        assert Path(pt.script).read_text() == p.scripts[pt.name]
        assert pt.job_id is None
    doc = json.loads(result.manifest.read_text())
    assert [e["name"] for e in doc["points"]] == ["jishnet-n4-s0", "jishnet-n8-s0"]
    assert doc["site"] == "perlmutter" and doc["cores_per_rank"] == 32
    assert (p.jobs_dir / "prelude.sh").is_file() and p.logs_dir.is_dir()


def test_plan_refuses_with_the_option_named(tmp_path):
    with pytest.raises(LartpcError, match="--max-requeues -1: must be 0 or more"):
        plan(_request(tmp_path, max_requeues=-1))
    with pytest.raises(LartpcError, match="--gpus '0': every value must be at least 1"):
        plan(_request(tmp_path, gpus="0"))
