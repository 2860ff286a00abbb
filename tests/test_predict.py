"""``python -m lartpc.analysis predict``: the noise scale read back, the S(B) and allreduce
models, the JSON, and one-line errors for bad input (torch-free)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from lartpc.analysis.__main__ import main
from lartpc.analysis.metrics import run_metrics
from lartpc.analysis.noise import (
    NOISE_COLUMNS,
    NoiseAtLoss,
    b_noise_at_loss,
    ema,
    pooled_b_noise,
    read_noise,
)
from lartpc.analysis.profiles import PARAMETERS, allreduce_s, load_profiles
from lartpc.analysis.runs import load_runs
from synthetic_runs import requeue, write_synthetic_run

B_NOISE = 56.0  # N_crit = 8 at 7 images per GPU


def _write_noise(run, b_noise: float, rows: int = 200, seed: int = 0,
                 g2_noise: float = 0.2) -> None:
    """noise.csv whose smoothed estimates give ``b_noise``: |G|^2 = 2 with noise."""
    rng = np.random.default_rng(seed)
    loss = np.linspace(1.6, 1.0, rows)
    g2 = 2.0 + rng.normal(0, g2_noise, rows)
    trace = 2.0 * b_noise + rng.normal(0, 0.2 * b_noise, rows)
    with open(run / "noise.csv", "w") as f:
        f.write(",".join(NOISE_COLUMNS) + "\n")
        for i in range(rows):
            f.write(f"{5 * i},0,{loss[i]},7.0,14.0,1.0,1.0,{g2[i]},{trace[i]},"
                    f"{trace[i] / g2[i]}\n")


@pytest.fixture
def runs(tmp_path):
    base = write_synthetic_run(tmp_path / "jishnet-n1", model="jishnet", world_size=1,
                               epoch_rate_per_min=0.5, ttl_s=300, dlt_s=20,
                               time_limit_s=600, train_events=700, loss_noise=0.0)
    _write_noise(base, B_NOISE)
    write_synthetic_run(tmp_path / "jishnet-n2", model="jishnet", world_size=2,
                        epoch_rate_per_min=1.0, ttl_s=200, dlt_s=10, time_limit_s=400,
                        train_events=700)
    return tmp_path


def _predict_json(capsys, *args: str) -> dict:
    assert main(["predict", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_noise_scale_read_back_at_threshold(runs):
    df = read_noise(runs / "jishnet-n1")
    at = b_noise_at_loss("n1", df, threshold=1.2)
    assert at.reached and at.loss == pytest.approx(1.2, abs=0.05) and not at.lower_bound
    assert at.b_noise == pytest.approx(B_NOISE, rel=0.10)
    assert 0 < at.b_noise_se < 0.1 * B_NOISE
    assert ema(np.array([3.0, 3.0, 3.0]), 5) == pytest.approx([3.0] * 3)  # no bias to 0


def test_allreduce_ring_and_tree():
    prof = load_profiles()["summitdev"]
    nbytes = 4 * PARAMETERS["jishnet"]
    assert allreduce_s(1, nbytes, prof) == 0.0
    # 2 GPUs share a node: NVLink; 8 GPUs cross nodes: EDR at 12.5 GB/s, 5 us
    assert allreduce_s(2, nbytes, prof) == pytest.approx(nbytes / 20e9 + 2 * 5e-6)
    assert allreduce_s(8, nbytes, prof) == pytest.approx(2 * 7 / 8 * nbytes / 12.5e9
                                                         + 14 * 5e-6)
    assert allreduce_s(8, nbytes, prof, "tree") == pytest.approx(6 * 5e-6 + 2 * nbytes
                                                                 / 12.5e9)


def test_predict_local_follows_the_noise_scale_law(runs, capsys):
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1,2,8,64")
    assert out["b_noise"] == pytest.approx(B_NOISE, rel=0.10)
    assert out["n_crit"] == pytest.approx(out["b_noise"] / 7)
    pts = {p["gpus"]: p for p in out["predicted"]}
    assert sorted(pts) == [1, 2, 8, 64]
    # S(B) = S_min (1 + B_noise/B): steps at 64 GPUs vs 1 GPU
    ratio = pts[64]["steps_to_loss"] / pts[1]["steps_to_loss"]
    b = out["b_noise"]
    assert ratio == pytest.approx((1 + b / 448) / (1 + b / 7))
    # measured step on 1 GPU: data_s + compute_s + comm_s, the whole synthetic interval
    steps_per_epoch = math.ceil(700 / 7)
    assert out["compute_s_per_step"] == pytest.approx(60 / (0.5 * steps_per_epoch), rel=1e-3)
    assert pts[1]["epochs_per_min"] == pytest.approx(0.5, rel=1e-3)
    assert pts[1]["efficiency"] == pytest.approx(1.0)
    assert 0 < pts[64]["efficiency"] < pts[2]["efficiency"] < 1
    assert {m["gpus"] for m in out["measured_runs"]} == {1, 2}
    assert out["b_noise_is_lower_bound"] is False
    assert "measured" in out and "assumed" in out


def test_paper_profile_exponents(runs, capsys, tmp_path):
    out = _predict_json(capsys, str(runs), "--cluster", "summitdev", "--train-events",
                        "15000", "--out", str(tmp_path / "fig"))
    assert out["compute_s_per_step"] == pytest.approx(7 / 2.3)
    # compute-bound, N >> N_crit = 8: epoch rate ~N^1, TTL nearly flat
    assert out["epoch_rate_exponent"] == pytest.approx(1.0, abs=0.1)
    b = out["b_noise"]
    s = [1 + b / (7 * n) for n in (32, 192)]
    assert out["ttl_exponent"] == pytest.approx(math.log(s[1] / s[0]) / math.log(6), abs=0.03)
    assert (tmp_path / "fig" / "predict-summitdev.png").stat().st_size > 0
    assert out["measured_runs"] == []  # this machine's runs are not SummitDev points


def test_hand_profile(runs, capsys):
    out = _predict_json(capsys, str(runs), "--alpha-us", "10", "--beta-gbps", "1",
                        "--compute-ms", "100", "--gpus", "4")
    p = out["predicted"][0]
    nbytes = 4 * PARAMETERS["jishnet"]
    assert p["allreduce_s"] == pytest.approx(1.5 * nbytes / 1e9 + 6 * 10e-6)
    assert p["step_s"] == pytest.approx(0.1 + p["allreduce_s"])


@pytest.mark.parametrize("args,message", [
    (["--cluster", "frontier"], "unknown cluster 'frontier'"),
    (["--cluster", "summit", "--gpus", "0,8"], "--gpus '0,8': every value must be at least 1"),
    (["--cluster", "summit", "--gpus", "a"], "expected comma-separated integers"),
    (["--alpha-us", "5"], "give --cluster NAME"),
    (["--cluster", "summit", "--beta-gbps", "-1"], "--beta-gbps must be a positive"),
])
def test_bad_input_is_one_line_error(runs, capsys, args, message):
    assert main(["predict", str(runs), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


MEASURED = {"name": "two-nodes", "gpu": "CPU (torch backend)", "gpus_per_node": 1,
            "alpha_intra_us": 250.0, "beta_intra_GBps": 0.0237,
            "alpha_inter_us": 250.0, "beta_inter_GBps": 0.0237, "compute": "runs",
            "sources": ["measured by lartpc bench allreduce"],
            "measured": {"date": "2026-11-24", "hosts": ["n1", "n2"], "world_size": 2}}


def test_cluster_file_profile_is_used(runs, capsys, tmp_path):
    f = tmp_path / "net.json"
    f.write_text(json.dumps(MEASURED))
    out = _predict_json(capsys, str(runs), "--cluster-file", str(f), "--gpus", "1,2,4")
    assert out["cluster"] == "two-nodes"
    pts = {p["gpus"]: p for p in out["predicted"]}
    nbytes = 4 * PARAMETERS["jishnet"]
    assert pts[2]["allreduce_s"] == pytest.approx(nbytes / 0.0237e9 + 2 * 250e-6)
    assert pts[4]["allreduce_s"] == pytest.approx(1.5 * nbytes / 0.0237e9 + 6 * 250e-6)
    # compute 'runs': the measured points stand beside the prediction
    assert {m["gpus"] for m in out["measured_runs"]} == {1, 2}
    assert f"profile read from {f}" in out["assumed"]["allreduce"]


def _without(key):
    return {k: v for k, v in MEASURED.items() if k != key}


@pytest.mark.parametrize("content,message", [
    (None, "cannot read"),
    ("{not json", "not JSON"),
    ([], "expected one JSON object"),
    (_without("beta_inter_GBps"), "missing field 'beta_inter_GBps'"),
    ({**MEASURED, "beta_intra_GBps": -1}, "field 'beta_intra_GBps' must be a positive number"),
    ({**MEASURED, "beta_inter_GBps": 0}, "field 'beta_inter_GBps' must be a positive number"),
    ({**MEASURED, "alpha_inter_us": "5"}, "field 'alpha_inter_us' must be a non-negative"),
    ({**MEASURED, "gpus_per_node": 0}, "field 'gpus_per_node' must be a whole number >= 1"),
    ({**MEASURED, "beta_inter_gbps": 1}, "unknown field 'beta_inter_gbps'"),
    ({**MEASURED, "compute": "fp32_scaled"}, "missing field 'fp32_tflops'"),
    ({**MEASURED, "compute": "magic"}, "field 'compute' must be one of"),
])
def test_bad_cluster_file_is_one_line_error_naming_file_and_field(runs, capsys, tmp_path,
                                                                  content, message):
    f = tmp_path / "net.json"
    if content is not None:
        f.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["predict", str(runs), "--cluster-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"--cluster-file {f}: {message}" in err and err.count("\n") == 1, err


def test_cluster_and_cluster_file_together_are_refused(runs, capsys, tmp_path):
    f = tmp_path / "net.json"
    f.write_text(json.dumps(MEASURED))
    assert main(["predict", str(runs), "--cluster", "summit", "--cluster-file", str(f)]) == 2
    err = capsys.readouterr().err
    assert "give --cluster NAME or --cluster-file FILE, not both" in err
    assert err.count("\n") == 1


def test_missing_noise_data_is_an_error(runs, capsys):
    (runs / "jishnet-n1" / "noise.csv").unlink()
    assert main(["predict", str(runs), "--cluster", "summit"]) == 2
    assert "no jishnet run has a noise.csv" in capsys.readouterr().err


def test_noise_csv_without_positive_estimates_is_an_error(runs, capsys):
    path = runs / "jishnet-n1" / "noise.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *["0,0,1.5,7.0,14.0,1.0,1.0,2.0,-3.0,-1.5"] * 5])
                    + "\n")
    assert main(["predict", str(runs), "--cluster", "summit"]) == 2
    assert "no positive noise-scale estimate" in capsys.readouterr().err


def test_noise_scale_is_taken_at_the_threshold_not_a_smoothing_lag_after_it():
    """A falling loss that crosses 1.2 at row 200 and a noise scale equal to the row
    number: the rows read are centred on row 200 (an exponential average's lag of ~10
    rows put them at ~210 before)."""
    rng = np.random.default_rng(4)
    step = np.arange(400)
    loss = 2.0 - step * (0.8 / 200) + rng.normal(0, 0.02, 400)
    df = pd.DataFrame({"step": step, "loss": loss, "g2_est": np.ones(400),
                       "trace_est": step.astype(float)})
    at = b_noise_at_loss("run", df, 1.2)
    assert at.rows == 80 and at.reached
    assert at.b_noise == pytest.approx(200, abs=3)


def test_unresolved_gradient_gives_a_lower_bound(tmp_path):
    """|G|^2 estimates averaging below 0: B_noise > mean tr / (mean g2 + 2 SE)."""
    rng = np.random.default_rng(1)
    g2 = np.tile([-1.05, 0.95], 50)  # mean -0.05, standard error 0.1
    tr = rng.normal(50.0, 5.0, 100)
    df = pd.DataFrame({"step": np.arange(100), "loss": np.full(100, 1.5), "g2_est": g2,
                       "trace_est": tr})
    at = b_noise_at_loss("run", df, 1.5, rows=100)
    assert at.lower_bound
    assert at.b_noise == pytest.approx(tr.mean() / (g2.mean() + 2 * g2.std(ddof=1) / 10))


def test_report_shows_noise_scale_and_prediction(runs, tmp_path):
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Gradient noise scale and predicted scaling" in page and "N_crit" in page
    assert (tmp_path / "rep" / "noise_scale.png").stat().st_size > 0
    assert (tmp_path / "rep" / "predict-local-cpu.png").stat().st_size > 0


def test_text_table_names_its_sources_and_missing_values(runs, capsys):
    """Text output: columns stay aligned where a value is missing, and every source line
    says what it is and whether it was measured or assumed."""
    assert main(["predict", str(runs), "--cluster", "h100-ndr", "--gpus", "1,8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("GPUs"))
    rows = lines[head + 1:head + 3]
    assert [r.split()[0] for r in rows] == ["1", "8"]
    assert all(len(r) == len(lines[head]) for r in rows)  # '-' padded to the column width
    src = [ln.strip() for ln in lines[head + 3:] if ln.strip()
           and not ln.startswith("figure: ")]
    assert "assumed, step time: summitdev's published step time scaled by FP32 peak" \
        in "\n".join(src)
    assert "assumed, data-loading time: not modelled (0)" in src
    assert all(s.split(",")[0] in ("measured", "assumed") for s in src)
    # the base runs' steps are measured at their own rank count, not at 1 GPU; S_min
    # is derived from them
    steps = next(s for s in src if s.startswith("measured, steps to the threshold: "))
    assert "S_min (steps at an unbounded batch) derived from them through B_noise" in steps
    assert "at 1 GPU" not in "\n".join(src)


def test_a_published_throughput_is_not_called_measured(runs, capsys):
    """summitdev's step time is the paper's per-GPU throughput: taken, not measured."""
    assert main(["predict", str(runs), "--cluster", "summitdev", "--gpus", "1,8"]) == 0
    out = capsys.readouterr().out
    assert "assumed, step time: summitdev's published" in out
    assert "measured, step time" not in out


def test_step_time_and_steps_come_from_every_base_run(runs, capsys):
    """A 1-rank run without noise.csv still gives its step time and steps; the noise
    scale only comes from the run that measured it."""
    one = _predict_json(capsys, str(runs / "jishnet-n1"), "--cluster", "local-cpu",
                        "--gpus", "1")
    write_synthetic_run(runs / "jishnet-n1-off", model="jishnet", world_size=1,
                        epoch_rate_per_min=0.25, ttl_s=300, dlt_s=20, time_limit_s=600,
                        train_events=700, loss_noise=0.0)
    both = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1")
    assert both["b_noise"] == pytest.approx(one["b_noise"])
    # steps of 0.5 and 0.25 epochs/min: step times 1.2 s and 2.4 s
    assert both["compute_s_per_step"] == pytest.approx(1.5 * one["compute_s_per_step"],
                                                       rel=1e-3)


def test_noise_runs_of_two_minibatches_are_refused(runs, capsys):
    b14 = write_synthetic_run(runs / "jishnet-n1-b14", model="jishnet", world_size=1,
                              batch_per_rank=14, epoch_rate_per_min=0.5, ttl_s=300,
                              dlt_s=20, time_limit_s=600, train_events=700)
    _write_noise(b14, B_NOISE)
    assert main(["predict", str(runs), "--cluster", "summit"]) == 2
    assert "differ in minibatch" in capsys.readouterr().err


def test_predict_draws_its_figure_without_out(runs, capsys):
    """No --out: the figure goes to 'report' beside the runs folder, and is named."""
    assert main(["predict", str(runs), "--cluster", "summit", "--gpus", "1,8"]) == 0
    fig = Path(runs).resolve().parent / "report" / "predict-summit.png"
    assert fig.stat().st_size > 0
    assert f"figure: {fig}" in capsys.readouterr().out


def test_predict_skips_an_unusable_run_as_fit_does(runs, capsys):
    """one dead job in a sweep (run.json, no steps) made predict fail; fit skipped it."""
    dead = runs / "jishnet-n4-dead"
    dead.mkdir()
    meta = json.loads((runs / "jishnet-n2" / "run.json").read_text())
    meta.update(world_size=4, status="failed")
    meta.pop("steps_per_epoch")
    (dead / "run.json").write_text(json.dumps(meta))
    assert main(["predict", str(runs), "--cluster", "summit", "--gpus", "1,8"]) == 0
    assert f"skipped: {dead / 'run.json'}" in capsys.readouterr().err
    assert main(["predict", str(runs), "--cluster", "summit", "--strict"]) == 2


def test_predict_json_has_no_bare_nan(runs, capsys, monkeypatch):
    """a quantity that cannot be predicted was printed as NaN (not JSON)."""
    import lartpc.analysis.predict as predict

    real = predict.run_predict

    def with_nan(*a, **k):
        results, measured = real(*a, **k)
        results[0]["ttl_exponent"] = float("nan")
        return results, measured

    monkeypatch.setattr(predict, "run_predict", with_nan)
    assert main(["predict", str(runs), "--cluster", "summit", "--json"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out and json.loads(out)["ttl_exponent"] is None


def test_runs_that_never_reach_the_threshold_still_draw(runs, tmp_path, capsys):
    """TTL cannot be predicted when no run reaches the threshold; the figure still draws
    (a log axis with nothing on it made matplotlib raise inside predict and report)."""
    assert main(["predict", str(runs), "--cluster", "summit", "--threshold", "0.5",
                 "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "predict-summit.png").stat().st_size > 0
    assert main(["report", str(runs), "--threshold", "0.5", "--out", str(tmp_path / "r")]) == 0


def test_report_stands_when_the_noise_scale_cannot_be_resolved(runs, tmp_path):
    """Short runs measure |G|^2 <= 0 near the threshold (noise dominates): the report
    says there is no prediction instead of failing (the quick demo's report did)."""
    noise = runs / "jishnet-n1" / "noise.csv"
    lines = noise.read_text().splitlines()
    cells = [ln.split(",") for ln in lines[1:]]
    for c in cells:
        c[7] = "-1.0"  # g2_est
    noise.write_text("\n".join([lines[0], *(",".join(c) for c in cells)]) + "\n")
    assert main(["report", str(runs), "--out", str(tmp_path / "r")]) == 0
    assert "No prediction: " in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.parametrize("name", ["x/../../T", "../T", ".hidden", "a\\b"])
def test_cluster_name_that_is_a_path_is_refused_and_nothing_written(runs, capsys, tmp_path,
                                                                     name):
    """N10 (issue 38): the figure is predict-<name>.png in --out; a name 'x/../../T' wrote
    T.png two folders above it."""
    f = tmp_path / "net.json"
    f.write_text(json.dumps({**MEASURED, "name": name}))
    out = tmp_path / "deep" / "er" / "out"
    first = out / f"predict-{name.split('/')[0]}"  # what lets the kernel walk the '..'
    first.mkdir(parents=True)
    assert main(["predict", str(runs), "--cluster-file", str(f), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--cluster-file {f}: field 'name' {name!r}: names a file to write" in err
    assert err.count("\n") == 1, err
    assert not list(tmp_path.rglob("*.png")) and os.listdir(out) == [first.name]


def _noise_frame(g2: np.ndarray, trace: np.ndarray) -> pd.DataFrame:
    """A noise.csv table at one loss (1.5): every row is near the threshold."""
    return pd.DataFrame({"step": np.arange(len(g2)), "loss": np.full(len(g2), 1.5),
                         "g2_est": g2, "trace_est": trace})


def test_a_gradient_under_two_standard_errors_is_a_lower_bound_not_a_measurement():
    """Review 6, A: mean |G|^2 = +0.05 with SE 0.10 gave B_noise ~ 1000 +- 3000 flagged
    measured, and -0.05 a lower bound: the sign of a noise-dominated mean decided. Now
    under 2 SE is a lower bound; 2.5 SE is a measurement with its SE."""
    tr = np.random.default_rng(1).normal(50.0, 5.0, 100)
    g2 = np.tile([-0.95, 1.05], 50)  # mean 0.05, standard error 0.10
    at = b_noise_at_loss("run", _noise_frame(g2, tr), 1.5, rows=100)
    assert at.lower_bound and math.isnan(at.b_noise_se)
    assert at.b_noise == pytest.approx(tr.mean() / (g2.mean() + 2 * g2.std(ddof=1) / 10))
    g2 = np.tile([-0.75, 1.25], 50)  # mean 0.25: 2.5 standard errors
    at = b_noise_at_loss("run", _noise_frame(g2, tr), 1.5, rows=100)
    assert not at.lower_bound and at.b_noise == pytest.approx(tr.mean() / 0.25)
    assert 0 < at.b_noise_se < math.inf


def test_pooled_noise_scale_keeps_its_uncertainty():
    """The geometric mean of two runs keeps a log-space SE (the larger of the runs' own
    and their scatter's) and a 95 % interval; a lower bound among them keeps no upper end."""
    a = NoiseAtLoss("a", 40.0, 4.0, 1.2, 50, True)
    b = NoiseAtLoss("b", 90.0, 9.0, 1.2, 50, True)
    p = pooled_b_noise([a, b])
    assert p.b_noise == pytest.approx(60.0) and not p.lower_bound
    assert p.log_se == pytest.approx(np.std(np.log([40, 90]), ddof=1) / math.sqrt(2))
    lo, hi = p.interval()
    assert lo * hi == pytest.approx(60.0**2) and hi / lo == pytest.approx(
        math.exp(2 * 1.959964 * p.log_se))
    one = pooled_b_noise([a])
    assert one.log_se == pytest.approx(0.1)  # SE / B of the one run
    bound = pooled_b_noise([a, NoiseAtLoss("c", 90.0, math.nan, 1.2, 50, True, True)])
    assert bound.lower_bound and bound.interval() == (pytest.approx(60.0), math.inf)


def test_predict_carries_the_noise_scale_interval_to_n_crit_steps_and_ttl(runs, capsys):
    """Review 6, A: the interval of B_noise is in the JSON and the text, for N_crit and
    for each predicted step count and TTL (S(B) is monotone in B_noise: its ends)."""
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1,8,64")
    lo, hi = out["b_noise_range"]
    assert lo < out["b_noise"] < hi and hi / lo < 1.5  # |G|^2 = 2 +- 0.014: resolved
    assert out["n_crit_range"] == pytest.approx([lo / 7, hi / 7])
    s1 = {p["gpus"]: p for p in out["predicted"]}[1]["steps_to_loss"]
    for p in out["predicted"]:
        ends = sorted(s1 * (1 + b / (7 * p["gpus"])) / (1 + b / 7) for b in (lo, hi))
        assert p["steps_to_loss_range"] == pytest.approx(ends)
        assert p["ttl_s_range"][0] <= p["ttl_s"] <= p["ttl_s_range"][1]
    assert "95 %" in out["measured"]["b_noise"] and "2 standard errors" in \
        out["measured"]["b_noise"]
    assert main(["predict", str(runs), "--cluster", "local-cpu", "--no-figures"]) == 0
    text = capsys.readouterr().out
    assert f"B_noise {out['b_noise']:.3g} (95 % {lo:.3g} to {hi:.3g}) at loss 1.2" in text
    assert f"N_crit {out['n_crit']:.3g} (95 % {lo / 7:.3g} to {hi / 7:.3g})" in text


def test_an_unresolved_noise_scale_bounds_the_steps_from_b_noise_to_infinity(runs, capsys):
    """|G|^2 = 2 +- 50 per row: its mean is under 2 SE, so B_noise is a lower bound and
    the steps at 64 GPUs lie between S(bound) and S_base / 64 (B_noise -> inf)."""
    _write_noise(runs / "jishnet-n1", B_NOISE, g2_noise=50.0)
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1,64")
    assert out["b_noise_is_lower_bound"] is True
    assert out["b_noise_range"] == [pytest.approx(out["b_noise"]), None]
    pts = {p["gpus"]: p for p in out["predicted"]}
    assert pts[64]["steps_to_loss_range"] == pytest.approx(
        [pts[1]["steps_to_loss"] / 64, pts[64]["steps_to_loss"]])
    assert "a 2-sigma lower bound" in out["measured"]["b_noise"]


def _set_meta(run, **fields) -> None:
    meta = json.loads((run / "run.json").read_text())
    meta.update(fields)
    (run / "run.json").write_text(json.dumps(meta))


def _never_reaches(folder, world_size: int = 1):
    """A run like the fixture's whose loss never gets below 1.2 in its 600 s."""
    return write_synthetic_run(folder, model="jishnet", world_size=world_size,
                               epoch_rate_per_min=0.5, ttl_s=900, dlt_s=20,
                               time_limit_s=600, train_events=700, loss_noise=0.0)


def test_no_steps_to_loss_unless_every_base_run_reached_it(runs, capsys):
    """Review 6, B: with 1 of 3 base runs at the threshold S_min came from that run alone
    (the fastest), and the text said it came from all three."""
    for k in (1, 2):
        _never_reaches(runs / f"jishnet-n1-slow{k}")
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1,8")
    assert out["s_min"] is None
    assert all(p["ttl_s"] is None and p["ttl_s_range"] is None for p in out["predicted"])
    assert out["measured"]["s_min"] == (
        "not available: only 1 of 3 base runs reached the threshold within their budget "
        "(jishnet-n1; not jishnet-n1-slow1, jishnet-n1-slow2), and a mean over those that "
        "did would be biased low")


def test_a_base_run_past_its_budget_is_censored_in_predict_as_in_fit(runs, capsys):
    """Review 6, B: predict ignored run.json's budget_s, so a run that fit censors (below
    the threshold only after its budget) gave predict its steps."""
    _set_meta(runs / "jishnet-n1", budget_s=100.0)  # it reaches 1.2 after ~280 s
    run = next(r for r in load_runs([str(runs)]) if r.name == "jishnet-n1")
    assert run_metrics(run, 1.2).ttl_censored
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1")
    assert out["s_min"] is None and out["predicted"][0]["ttl_s"] is None
    assert out["measured"]["s_min"] == ("not available: no base run reached the threshold "
                                        "within its budget")


def test_measured_ttl_with_a_censored_run_is_a_lower_bound(runs, capsys):
    """Review 6, B: the measured TTL at an N was the mean of the runs that reached the
    threshold; with one censored run it is only a lower bound of the mean, and says so."""
    _never_reaches(runs / "jishnet-n2-slow", world_size=2)
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1,2")
    two = next(m for m in out["measured_runs"] if m["gpus"] == 2)
    assert two["ttl_s"] is None and two["runs"] == 2 and two["ttl_censored"] == 1
    fast = run_metrics(next(r for r in load_runs([str(runs)]) if r.name == "jishnet-n2"),
                       1.2)
    assert fast.ttl_s < two["ttl_lower_bound_s"] < 600  # the slow run's bound is ~600 s
    assert main(["predict", str(runs), "--cluster", "local-cpu", "--gpus", "1,2",
                 "--no-figures"]) == 0
    text = capsys.readouterr().out
    row = next(ln for ln in text.splitlines() if ln.split()[:1] == ["2"])
    assert f">{two['ttl_lower_bound_s']:.1f}" in row
    assert "measured, TTL at 2 GPU(s): a lower bound, 1 of 2 runs censored" in text
    # a censored run that diverged bounds nothing (it would not have got there): no
    # measured TTL at that N, as analyze fit's scaling table says
    slow = runs / "jishnet-n2-slow" / "run.json"
    slow.write_text(json.dumps({**json.loads(slow.read_text()), "status": "diverged"}))
    out = _predict_json(capsys, str(runs), "--cluster", "local-cpu", "--gpus", "1,2")
    two = next(m for m in out["measured_runs"] if m["gpus"] == 2)
    assert two["ttl_s"] is None and two["ttl_lower_bound_s"] is None


def test_wall_clock_pauses_leave_out_a_requeued_runs_queue_wait(runs, capsys):
    """Review 6, C: with --clock wall the pause per epoch summed every gap between steps,
    so a resumed run's hours in the queue became evaluation time at every N."""
    args = (str(runs), "--cluster", "local-cpu", "--gpus", "1,2", "--clock", "wall")
    before = _predict_json(capsys, *args)
    requeue(runs / "jishnet-n1", after=200, wait_s=5000.0, restart_s=3.0, skew_s=0.4)
    after = _predict_json(capsys, *args)
    # the synthetic steps fill their intervals: no pause, with or without the restart
    assert before["pause_s_per_epoch"] == pytest.approx(0.0, abs=0.01)
    assert after["pause_s_per_epoch"] == pytest.approx(0.0, abs=0.01)
