"""Run-folder validation errors, the CLI (exit codes, JSON), the report and plots, and the
promise that the analysis never needs torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lartpc.analysis.__main__ import main
from lartpc.analysis.paper import PAPER
from lartpc.analysis.runs import CLASSES, RunFolderError, load_run
from lartpc.analysis.tables import analyse
from synthetic_runs import write_synthetic_run, write_synthetic_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for model, b in (("jishnet", -0.7), ("scnet", -0.6)):
        write_synthetic_study(root / model, model=model, gpus=[1, 2, 4], seeds=1,
                              rate_c=0.3, rate_b=0.9, ttl_a=400.0, ttl_b=b, dlt_a=30.0,
                              time_limit_s=500.0, train_events=700, seed=3,
                              confusion_percent=PAPER[model]["confusion_percent"])
    return root


@pytest.fixture
def one_run(tmp_path):
    return write_synthetic_run(tmp_path / "run", model="jishnet", world_size=2,
                               epoch_rate_per_min=0.5, ttl_s=200, dlt_s=20,
                               time_limit_s=300, train_events=500)


def _corrupt(path: Path, lineno: int, column: int, value: str) -> None:
    lines = path.read_text().splitlines()
    cells = lines[lineno - 1].split(",")
    cells[column] = value
    lines[lineno - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def test_non_numeric_value_names_file_and_line(one_run, capsys):
    _corrupt(one_run / "rank-001.csv", 7, 6, "oops")
    with pytest.raises(RunFolderError, match=r"rank-001\.csv:7: column 'global_loss': 'oops'"):
        load_run(one_run)
    assert main(["fit", str(one_run)]) == 2
    assert re.search(r"rank-001\.csv:7: .*not a number", capsys.readouterr().err)


@pytest.mark.parametrize("edit, pattern", [
    (lambda p: p.write_text(p.read_text().replace("global_loss", "loss", 1)),
     r"rank-000\.csv:1: header is"),
    (lambda p: _corrupt(p, 4, 0, "1,2"), r"rank-000\.csv:4: expected 12 fields, found 13"),
    (lambda p: _corrupt(p, 5, 1, "1.5"), r"rank-000\.csv:5: column 'epoch'.*whole number"),
    (lambda p: _corrupt(p, 3, 2, "1"), r"rank-000\.csv:3: column 'rank' is 1"),
    (lambda p: _corrupt(p, 6, 3, ""), r"rank-000\.csv:6: column 'batchno': ''"),
])
def test_malformed_step_csv(one_run, edit, pattern):
    edit(one_run / "rank-000.csv")
    with pytest.raises(RunFolderError, match=pattern):
        load_run(one_run)


def test_bad_run_json(one_run):
    meta = one_run / "run.json"
    meta.write_text(meta.read_text().replace('"world_size": 2', '"world_size": "2"'))
    with pytest.raises(RunFolderError, match=r"run\.json: field 'world_size'"):
        load_run(one_run)
    meta.write_text("{\n  \"model\": \"jishnet\",\n  oops\n}")
    with pytest.raises(RunFolderError, match=r"run\.json: not valid JSON \(line 3, column 3"):
        load_run(one_run)


def test_confusion_row_order_checked(one_run):
    conf = one_run / "confusion.csv"
    conf.write_text(conf.read_text().replace("\nmuon,", "\nmu,", 1))
    with pytest.raises(RunFolderError, match=r"confusion\.csv:4: row label 'mu'"):
        load_run(one_run)


def test_missing_run_json_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["fit", str(tmp_path / "empty")]) == 2
    assert "run.json" in capsys.readouterr().err
    assert main(["fit", str(tmp_path / "nowhere")]) == 2


def test_classes_match_training_package():
    import lartpc

    assert CLASSES == lartpc.CLASSES


def test_fit_json_without_torch(runs_root):
    """`python -m lartpc.analysis fit --json` with torch, spconv and horovod unimportable (it
    may import lartpc's torch-free run-folder package, nothing else of lartpc)."""
    code = ("import sys, runpy\n"
            "for m in ('torch', 'spconv', 'horovod', 'lartpc.train', 'lartpc.data', "
            "'lartpc.models', 'lartpc.dist'): sys.modules[m] = None\n"
            f"sys.argv = ['analysis', 'fit', {str(runs_root)!r}, '--json']\n"
            "runpy.run_module('analysis', run_name='__main__')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    for model in ("jishnet", "scnet"):
        m = doc["models"][model]
        for key in ("ttl_exponent", "ttl_exponent_err", "epoch_rate_exponent",
                    "epoch_rate_exponent_err"):
            assert isinstance(m[key], float), (model, key)
        assert [row["gpus"] for row in m["scaling"]] == [1, 2, 4]
    assert len(doc["runs"]) == 6


def test_single_n_json_says_no_fit(one_run, capsys):
    assert main(["fit", str(one_run), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["models"]["jishnet"]
    assert m["ttl_exponent"] is None and m["epoch_rate_exponent_err"] is None
    assert "TTL: only one GPU count (N=2): no fit possible" in m["notes"]


def test_report_is_self_contained(runs_root, tmp_path):
    assert main(["report", str(runs_root), "--out", str(tmp_path / "rep")]) == 0
    html = (tmp_path / "rep" / "report.html").read_text()
    # 2 models x (loss, epoch rate, speedup/efficiency, TTL vs N) + 6 confusion images
    assert html.count('src="data:image/png;base64,') == 14
    assert not re.search(r'src="(?!data:)', html)
    for number in ("78.8 % ± 3.8 %", "76.8 % ± 3.3 %", "66.7%", "57.8%", "67.1%",
                   "1.5 at 192 GPUs", "2.5 at 128 GPUs"):
        assert number in html, number
    models = analyse([runs_root]).models
    sections = html.split("<h2>")
    for model, truth, label in (("jishnet", -0.7, "JishNet"), ("scnet", -0.6, "SCNet")):
        s = models[model]
        (sec,) = [x for x in sections if x.startswith(PAPER[model]["label"])]
        assert label in sec
        # the fit recovers the injected exponent, and the report shows it beside the paper's
        b, err = s["ttl_exponent"], s["ttl_exponent_err"]
        assert abs(b - truth) < 2 * err < 0.3, (model, b, err)
        lo, hi = s["ttl_exponent_ci95"]  # b +/- t(0.975, n - 2) err
        assert s["ttl_ci_method"] == "t" and lo < b < hi
        assert (f'<td class="l">TTL(1.2) exponent b</td><td class="">{b:+.2f} ± {err:.2f}'
                f' (95% CI, t {lo:+.2f} … {hi:+.2f})</td>'
                f'<td class="">{truth:+.1f} (threshold 1.2)</td>') in sec
        rate, rerr = s["epoch_rate_exponent"], s["epoch_rate_exponent_err"]
        lo, hi = s["epoch_rate_exponent_ci95"]
        assert abs(rate - 0.9) < 2 * rerr, (model, rate, rerr)
        assert (f'<td class="l">epoch-rate exponent b</td><td class="">{rate:+.2f} ± '
                f'{rerr:.2f} (95% CI, t {lo:+.2f} … {hi:+.2f})</td><td class="">+0.9</td>'
                ) in sec


def test_a_report_that_fails_halfway_leaves_its_folder_as_it_was(runs_root, tmp_path,
                                                                 monkeypatch):
    """Every figure is made aside and moved in at the end, the page last: a report that
    fails after its figures (here its confusion section) adds and replaces nothing, in
    an empty folder or over an earlier report, and leaves no folder it made; so does
    one stopped by Ctrl-C."""
    from lartpc.analysis import report

    def _fails(*_):
        raise RunFolderError("confusion.csv: stood-in failure")

    first = tmp_path / "fresh"
    monkeypatch.setattr(report, "_confusion_section", _fails)
    assert main(["report", str(runs_root), "--out", str(first / "deeper")]) == 2
    assert not first.exists()
    first.mkdir()
    assert main(["report", str(runs_root), "--out", str(first)]) == 2
    assert first.is_dir() and list(first.iterdir()) == []  # the user's folder stays

    def _stopped(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "_confusion_section", _stopped)
    with pytest.raises(KeyboardInterrupt):
        main(["report", str(runs_root), "--out", str(tmp_path / "stopped")])
    assert not (tmp_path / "stopped").exists()
    monkeypatch.undo()
    done = tmp_path / "done"
    assert main(["report", str(runs_root / "scnet"), "--out", str(done)]) == 0
    before = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
    assert len(before) > 5
    monkeypatch.setattr(report, "_confusion_section", _fails)
    assert main(["report", str(runs_root), "--out", str(done)]) == 2
    assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file()} == before


def test_curves_and_confusion_files(runs_root, tmp_path, capsys):
    assert main(["curves", str(runs_root), "--out", str(tmp_path / "c")]) == 0
    pngs = sorted(p.name for p in (tmp_path / "c").glob("*.png"))
    assert pngs == ["epoch_rate_jishnet.png", "epoch_rate_scnet.png", "loss_jishnet.png",
                    "loss_scnet.png", "speedup_jishnet.png", "speedup_scnet.png",
                    "ttl_jishnet.png", "ttl_scnet.png"]
    for p in (tmp_path / "c").glob("*.png"):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert main(["confusion", str(runs_root / "scnet"), "--out", str(tmp_path / "m")]) == 0
    md = capsys.readouterr().out
    assert "| true \\ predicted | gamma | electron | muon | pion | kaon | n |" in md
    assert "binomial SE" in md and "Wilson" in md
    pct = (tmp_path / "m" / "scnet-n004-s0_confusion_percent.csv").read_text().splitlines()
    assert pct[0] == "true," + ",".join(CLASSES)
    for line, cls in zip(pct[1:], CLASSES, strict=True):
        name, *vals = line.split(",")
        assert name == cls and sum(map(float, vals)) == pytest.approx(100, abs=0.05)


def test_fit_writes_its_figures_by_default(runs_root, tmp_path):
    """`fit` draws beside its text without extra flags: into 'report' next to RUNS."""
    import shutil

    runs = tmp_path / "study" / "runs"
    shutil.copytree(runs_root, runs)
    assert main(["fit", str(runs)]) == 0
    made = sorted(p.name for p in (tmp_path / "study" / "report").glob("*.png"))
    assert {"speedup_jishnet.png", "ttl_jishnet.png", "speedup_scnet.png",
            "ttl_scnet.png"} <= set(made)
    assert main(["fit", str(runs), "--no-figures", "--out", str(tmp_path / "none")]) == 0
    assert not (tmp_path / "none").exists()


def test_runs_with_the_same_folder_name_keep_their_own_confusion(tmp_path):
    """a/run-1 and b/run-1 used to write the same confusion files; the report showed one."""
    for parent, n in (("a", 1), ("b", 2)):
        write_synthetic_run(tmp_path / "study" / parent / "run-1", model="jishnet",
                            world_size=n, epoch_rate_per_min=0.5, ttl_s=200, dlt_s=20,
                            time_limit_s=300, train_events=500, seed=n)
    out = tmp_path / "m"
    assert main(["confusion", str(tmp_path / "study"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.md")) == ["a_run-1_confusion.md",
                                                         "b_run-1_confusion.md"]
    assert (out / "a_run-1_confusion.md").read_text() != \
        (out / "b_run-1_confusion.md").read_text()
    assert main(["report", str(tmp_path / "study"), "--out", str(tmp_path / "rep")]) == 0
    assert len(list((tmp_path / "rep" / "confusion").glob("*.png"))) == 2


def test_a_report_written_again_removes_only_its_own_earlier_files(runs_root, tmp_path):
    """A report written again into the same --out with fewer runs removes the files the
    earlier report wrote that it does not (here JishNet's curves and confusion files),
    keeps everything else a user put there, and lists what it wrote."""
    out = tmp_path / "rep"
    assert main(["report", str(runs_root), "--out", str(out)]) == 0
    both = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    jish = {n for n in both if "jishnet" in n}
    assert "loss_jishnet.png" in jish and any(n.startswith("confusion/") for n in jish)
    (out / "my-notes.txt").write_text("mine")
    (out / "confusion" / "jishnet-by-hand.csv").write_text("mine")
    assert main(["report", str(runs_root / "scnet"), "--out", str(out)]) == 0
    left = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert left == (both - jish) | {"my-notes.txt", "confusion/jishnet-by-hand.csv"}
    listed = (out / ".report-files").read_text().splitlines()
    assert set(listed) == left - {".report-files", "my-notes.txt",
                                  "confusion/jishnet-by-hand.csv"}
    assert listed[-1] == "report.html"
