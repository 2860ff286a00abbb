"""`lartpc bench minibatch` and `lartpc bench train`: real short
trainings, their table, plot and the summary's censoring rules."""

from __future__ import annotations

import json
import math

import pytest
from train_helpers import BIN, run

from lartpc.bench.minibatch import _write_outputs, markdown, scaled_lr, summarise


@pytest.mark.slow
def test_minibatch_scan_trains_each_size_and_writes_table_and_plot(train_events_dir, tmp_path):
    out = tmp_path / "scan"
    r = run([str(BIN / "lartpc"), "bench", "minibatch", "--data", str(train_events_dir),
             "--downsample", "9", "--batch-per-rank", "4,16", "--seeds", "0",
             # a fixed number of epochs, not seconds: a loaded machine takes the same steps
             "--set", "train.epochs=2", "--seconds", "600",
             "--bare-steps", "3", "--out", str(out)], timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [row["batch_per_rank"] for row in res["rows"]] == [4, 16]
    assert [row["lr"] for row in res["rows"]] == pytest.approx(
        [1e-3 * math.sqrt(4 / 7), 1e-3 * math.sqrt(16 / 7)])
    for p in res["points"]:
        folder = out / "runs" / f"b{p['batch_per_rank']:03d}-s0"
        info = json.loads((folder / "run.json").read_text())
        # each point really trained at its size and learning rate
        assert info["config"]["train"]["batch_per_rank"] == p["batch_per_rank"]
        assert info["config"]["train"]["lr"] == pytest.approx(p["lr"])
        assert info["loader"] == "sparse" and p["steps"] > 1
        assert p["images_per_s_steps"] == pytest.approx(p["batch_per_rank"] / p["step_s_median"])
        assert 0.0 <= p["data_wait_fraction"] < 1.0
        assert p["ttl_censored"] == (p["ttl_s"] is None)
        # the bare step of the same batches beside the loop's step (lartpc bench train's)
        assert p["loop_overhead"] == pytest.approx(p["step_s_median"] / p["bare_step_s_median"]
                                                   - 1)
    assert "| loop overhead |" in (out / "minibatch.md").read_text()
    for name in ("minibatch.csv", "minibatch.md", "minibatch.json"):
        assert (out / name).stat().st_size > 0
    assert (out / "minibatch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the outputs replace links planted at their names, never write through them
    victim, planted = tmp_path / "victim.txt", tmp_path / "planted"
    victim.write_text("precious data\n")
    planted.mkdir()
    names = ("minibatch.csv", "minibatch.md", "minibatch.json", "minibatch.png")
    for name in names:
        (planted / name).symlink_to(victim)
    _write_outputs(res, planted, out)
    assert victim.read_text() == "precious data\n"
    for name in names[:3]:  # the same table, text and JSON as the scan's own
        assert (planted / name).read_text() == (out / name).read_text()
    assert (planted / "minibatch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any((planted / name).is_symlink() for name in names)
    # measured again without training: the paper's loss lies in [0.905, 1.905], so every
    # run is below 2.0 from its first smoothed step and none ever gets below 0.9
    for threshold, censored in (("2.0", False), ("0.9", True)):
        again = tmp_path / f"again-{threshold}"
        r = run([str(BIN / "lartpc"), "bench", "minibatch", "--from", str(out),
                 "--threshold", threshold, "--out", str(again)], timeout=120)
        assert r.returncode == 0, r.stderr
        res2 = json.loads(r.stdout)
        assert res2["threshold"] == float(threshold)
        assert {p["ttl_censored"] for p in res2["points"]} == {censored}
        assert [p["images_per_s_steps"] for p in res2["points"]] == \
            [p["images_per_s_steps"] for p in res["points"]]
        assert [p["loop_overhead"] for p in res2["points"]] == \
            [p["loop_overhead"] for p in res["points"]]
        assert (again / "minibatch.png").exists() and not (again / "runs").exists()
    r = run([str(BIN / "lartpc"), "bench", "minibatch", "--from", str(tmp_path)], timeout=60)
    assert r.returncode == 2 and "not a finished `lartpc bench minibatch --out`" in r.stderr
    # a second scan never writes into the first one's folder
    r = run([str(BIN / "lartpc"), "bench", "minibatch", "--data", str(train_events_dir),
             "--downsample", "9", "--batch-per-rank", "4", "--out", str(out)], timeout=120)
    assert r.returncode == 2 and f"--out {out}: exists" in r.stderr


def _point(batch, seed, ttl, bound=None, rate=100.0):
    return {"batch_per_rank": batch, "seed": seed, "lr": 1e-3, "images_per_s_steps": rate,
            "images_per_s": rate * 0.9, "step_s_median": batch / rate,
            "data_wait_fraction": 0.01, "ttl_s": ttl, "ttl_censored": ttl is None,
            "ttl_lower_bound_s": bound, "final_loss_smoothed": 1.3, "accuracy": 0.4}


def test_summary_gives_a_median_ttl_only_when_every_seed_got_there():
    rows = summarise([_point(7, 0, 50.0), _point(7, 1, 70.0), _point(7, 2, 60.0),
                      _point(64, 0, 40.0), _point(64, 1, None, bound=120.0),
                      _point(256, 0, None, bound=118.0), _point(256, 1, None, bound=119.0)])
    by = {r["batch_per_rank"]: r for r in rows}
    assert by[7]["ttl_s"] == 60.0 and by[7]["ttl_reached"] == 3
    assert by[64]["ttl_s"] is None and by[64]["ttl_reached"] == 1
    assert by[64]["ttl_censored_bound_s"] == 120.0
    assert by[256]["ttl_reached"] == 0 and by[256]["ttl_censored_bound_s"] == 118.0
    table = markdown({"model": "scnet", "device": "cpu", "image_size": 900,
                      "seconds_per_run": 120, "base_batch": 7, "lr_scaling": "sqrt",
                      "threshold": 1.2, "rows": rows})
    assert "| 7 |" in table and "1/2 reached" in table and "> 118 (censored)" in table
    # a scan's --set options head its table: two scans side by side stay told apart
    head = markdown({"model": "scnet", "device": "cpu", "image_size": 900,
                     "seconds_per_run": 120, "base_batch": 7, "lr_scaling": "sqrt",
                     "threshold": 1.2, "rows": rows,
                     "overrides": ["model.sparse=torch"]}).splitlines()[0]
    assert head.endswith("TTL threshold 1.2), model.sparse=torch")


def test_what_a_run_did_not_measure_is_null_never_nan_or_zero():
    """A point whose run was too short to time a step (bench train's measure_run gives
    None) is left out of its row's medians; a row no run measured says null, its table
    cell "–", and the JSON stays strict (no NaN)."""
    short = {**_point(7, 1, None, bound=9.0), "images_per_s_steps": None,
             "images_per_s": None, "step_s_median": None, "data_wait_fraction": None}
    rows = summarise([_point(7, 0, None, bound=8.0, rate=50.0), short,
                      {**short, "batch_per_rank": 14, "seed": 0}])
    by = {r["batch_per_rank"]: r for r in rows}
    assert by[7]["images_per_s"] == 50.0 and by[7]["images_per_s_epochs"] == 45.0
    assert by[14]["images_per_s"] is None and by[14]["data_wait_fraction"] is None
    json.dumps(rows, allow_nan=False)
    table = markdown({"model": "scnet", "device": "cpu", "image_size": 400,
                      "seconds_per_run": 1, "base_batch": 7, "lr_scaling": "sqrt",
                      "threshold": 1.2, "rows": rows})
    assert "| 14 | 0.001 | – | – | – | – |" in table and "nan" not in table


def test_repeated_sizes_seeds_or_ranks_are_refused():
    """Two points of one size and seed (or two of one rank count) would train into one
    folder, the second resuming the first and counted as another run."""
    for argv, message in ((["minibatch", "--batch-per-rank", "4,4"], "--batch-per-rank '4,4'"),
                          (["minibatch", "--seeds", "0,0"], "--seeds '0,0'"),
                          (["train", "--model", "scnet", "--ranks", "1,1"], "--ranks '1,1'")):
        r = run([str(BIN / "lartpc"), "bench", *argv], timeout=60)
        assert r.returncode == 2 and message in r.stderr and "repeated value" in r.stderr, \
            r.stderr


def test_a_bench_group_without_its_kind_exits_2():
    r = run([str(BIN / "lartpc"), "bench"], timeout=60)
    assert r.returncode == 2 and "minibatch" in r.stdout


def test_a_scan_that_fails_leaves_no_out(train_events_dir, tmp_path, monkeypatch, capsys):
    """The runs are trained beside --out and moved there at the end: a scan that fails
    in its second point leaves no --out (it could be neither redone nor remeasured)."""
    import lartpc.bench.train as bench_train
    from lartpc.cli import main
    from lartpc.errors import LartpcError

    done = []

    def _fails_second(args, data, out, *_, **__):
        out.mkdir(parents=True)
        (out / "run.json").write_text("{}")
        done.append(out)
        if len(done) == 2:
            raise LartpcError("stood-in failure of the second point")
        return {"step_s_median": 0.1}

    monkeypatch.setattr(bench_train, "train_point", _fails_second)
    out = tmp_path / "scan"
    assert main(["bench", "minibatch", "--data", str(train_events_dir), "--downsample", "9",
                 "--batch-per-rank", "4,8", "--bare-steps", "0", "--out", str(out)]) == 2
    assert "stood-in failure" in capsys.readouterr().err
    assert len(done) == 2 and not out.exists() and list(tmp_path.iterdir()) == []


def test_learning_rate_scaling_rules():
    assert scaled_lr(1e-3, 28, 7, "none") == 1e-3
    assert scaled_lr(1e-3, 28, 7, "linear") == pytest.approx(4e-3)
    assert scaled_lr(1e-3, 28, 7, "sqrt") == pytest.approx(2e-3)


def test_bad_batch_list_is_one_clear_error():
    for option in ("--batch-per-rank", "--batches"):  # the old spelling is still read
        r = run([str(BIN / "lartpc"), "bench", "minibatch", option, "7,x"], timeout=60)
        assert r.returncode == 2 and "--batch-per-rank '7,x'" in r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("argv,message", [
    (["--backend", "none", "--ranks", "1,2"], "only 1 with --backend none"),
    (["--ranks", "1,two"], "--ranks '1,two'"),
    (["--ranks", "0"], "--ranks '0': every value must be at least 1"),
])
def test_bench_train_rank_list_errors_before_any_work(argv, message):
    r = run([str(BIN / "lartpc"), "bench", "train", "--model", "scnet", *argv], timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_bench_noise_takes_the_image_size_of_its_data(events_dir):
    """--size is for generated events: with --data (here 900 x 900) the store's size is
    used (the default of 400 was checked against it and refused)."""
    r = run([str(BIN / "lartpc"), "bench", "noise", "--model", "scnet", "--data",
             str(events_dir), "--batch-per-rank", "2", "--steps", "1", "--every", "1"],
            timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["shape"] == [900, 900]
    r = run([str(BIN / "lartpc"), "bench", "noise", "--model", "scnet", "--data",
             str(events_dir), "--size", "400"], timeout=60)
    assert r.returncode == 2 and "--size 400 disagrees with --data" in r.stderr
