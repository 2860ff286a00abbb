"""The analysis report shows truth limits (from `lartpc inspect --truth-limits`) beside
the measured confusion matrix."""

from __future__ import annotations

import json

from lartpc.analysis.__main__ import main as analysis_main
from lartpc.analysis.paper import PAPER
from lartpc.analysis.truth_limits import load_truth_limits
from synthetic_runs import write_synthetic_run

from lartpc.cli import main as lartpc_main


def _run(tmp_path):
    return write_synthetic_run(tmp_path / "run", model="jishnet", world_size=2,
                               epoch_rate_per_min=0.5, ttl_s=200, dlt_s=20,
                               time_limit_s=300, train_events=500,
                               confusion_percent=PAPER["jishnet"]["confusion_percent"])


def test_report_shows_truth_limits(tmp_path, capsys):
    data = tmp_path / "data"
    assert lartpc_main(["simulate", "--out", str(data), "--events", "45", "--seed", "5",
                        "--downsample", "12", "--classes", "muon,pion,kaon"]) == 0
    capsys.readouterr()
    assert lartpc_main(["inspect", str(data), "--truth-limits", "--json"]) == 0
    run = _run(tmp_path)
    (run / "truth_limits.json").write_text(capsys.readouterr().out)
    lim = load_truth_limits(run)
    pion = lim["classes"]["pion"]
    assert pion["events"] == 15 and 0 < pion["exit_without_interaction"] < 1
    assert analysis_main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Truth limits of the evaluation data (source geometry isotropic" in html
    assert f"<td>{100 * pion['exit_without_interaction']:.1f}</td>" in html
    assert f"{100 * lim['reference_rule_muon_purity']:.1f} %" in html
    # the reference rule beside the confusion matrix, named as one: per class and overall
    assert pion["reference_rule_recall"] == 1 - pion["indistinguishable"]
    assert f"<td>{100 * pion['reference_rule_recall']:.1f}</td></tr>" in html
    assert (f"Reference rule, overall (class-balanced mean of its recall per class; "
            f"a reference, not a bound): {100 * lim['reference_rule_overall']:.1f} %") in html
    assert 0 < lim["reference_rule_overall"] <= 1 and "ceiling" not in html


def test_truth_limits_file_with_the_old_ceiling_names_reads(tmp_path):
    """written before issue 39, when the reference rule's recall was called a ceiling"""
    run = _run(tmp_path)
    old = {"source_geometry": "beam", "muon_purity_ceiling": 0.95,
           "overall_accuracy_ceiling": 0.9,
           "classes": {"pion": {"events": 10, "indistinguishable": 0.3,
                                "accuracy_ceiling": 0.65}}}
    (run / "truth_limits.json").write_text(json.dumps(old))
    lim = load_truth_limits(run)
    assert lim["classes"]["pion"]["reference_rule_recall"] == 0.65
    assert (lim["reference_rule_overall"], lim["reference_rule_muon_purity"]) == (0.9, 0.95)


def test_old_truth_limits_file_gets_the_reference_rule(tmp_path):
    """a truth_limits.json written before the rule's recall was stored: derived"""
    run = _run(tmp_path)
    old = {"source_geometry": "isotropic", "muon_purity_ceiling": 0.7,
           "classes": {"muon": {"events": 10, "indistinguishable": 0.0},
                       "pion": {"events": 10, "indistinguishable": 0.3},
                       "kaon": {"events": 0, "indistinguishable": 0.0}}}
    (run / "truth_limits.json").write_text(json.dumps(old))
    lim = load_truth_limits(run)
    assert lim["classes"]["pion"]["reference_rule_recall"] == 0.7
    assert lim["reference_rule_overall"] == 0.85  # kaon has no events


def test_bad_truth_limits_file_is_ignored(tmp_path, caplog):
    run = _run(tmp_path)
    (run / "truth_limits.json").write_text(json.dumps({"events": 3}))
    assert load_truth_limits(run) is None
    assert "not a truth-limits file" in caplog.text
    assert analysis_main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert "Truth limits" not in (tmp_path / "rep" / "report.html").read_text()


def test_truth_limits_cannot_inject_markup(tmp_path, capsys):
    """a value of truth_limits.json went into report.html unescaped (a script ran
    when the report was opened); a value of the wrong type crashed the report."""
    run = _run(tmp_path)
    evil = "<script>alert(1)</script>"
    good = {"source_geometry": evil, "muon_purity_ceiling": 0.9,
            "classes": {evil: {"events": 3, "exit_without_interaction": 0.5}}}
    (run / "truth_limits.json").write_text(json.dumps(good))
    assert analysis_main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for bad in ({"classes": {"pion": {"events": evil}}},
                {"classes": {"pion": {"events": 3, "low_visible_energy": "0.5"}}},
                {"classes": {"pion": [1, 2]}}, {"classes": "pion"}, [1, 2]):
        (run / "truth_limits.json").write_text(json.dumps(bad))
        assert analysis_main(["report", str(run), "--out", str(tmp_path / "rep2")]) == 0
        html = (tmp_path / "rep2" / "report.html").read_text()
        assert "<script>" not in html and "Truth limits of the evaluation data" not in html
        assert "not a truth-limits file" in capsys.readouterr().err
