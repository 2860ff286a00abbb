"""Two torchrun (DistributedDataParallel) ranks resumed: the same numbers as one
uninterrupted run, noise.csv included."""

from __future__ import annotations

import pytest
import torch
from train_helpers import rows, run, torchrun_train_cmd

pytestmark = pytest.mark.slow


def _torchrun(data, out, *sets: str) -> list[str]:
    return torchrun_train_cmd(data, out, "train.noise_every_steps=1", *sets)


def test_split_run_matches_uninterrupted_noise_rows_too(train_events_dir, tmp_path):
    """DDP rebuilds its gradient buckets after a process's first step, so the first
    step of a resumed segment saw other buckets than the uninterrupted run; the noise
    meter summed its local |g|^2 per bucket and that row differed in the 7th
    significant digit (issue 38 N11). It now sums per parameter, in parameter order."""
    ref, split = tmp_path / "ref", tmp_path / "split"
    for out, sets in ((ref, ()), (split, ("train.epochs=1",)), (split, ())):
        r = run(_torchrun(train_events_dir, out, *sets), timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = rows(ref / "noise.csv"), rows(split / "noise.csv")
    spe = len(rows(ref / "rank-000.csv")) // 2
    assert [int(x["step"]) for x in a] == list(range(2 * spe))
    assert a == b  # every column, as written: the resumed segment's first row too
    for rank in ("000", "001"):
        assert [x["local_loss"] for x in rows(ref / f"rank-{rank}.csv")] == \
               [x["local_loss"] for x in rows(split / f"rank-{rank}.csv")]
    pa = torch.load(ref / "checkpoint.pt", weights_only=True)["model"]
    pb = torch.load(split / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
