"""``jobs/local/sparse_ab.py``: two versions of the torch sparse layers timed against
each other, with their gradients compared."""

from __future__ import annotations

import json
from pathlib import Path

from lartpc.jobs.local import sparse_ab

from lartpc.models import sparse_torch


def test_the_same_layers_give_the_same_gradients_and_both_are_timed(train_events_dir,
                                                                     capsys):
    assert sparse_ab.main(["--before", sparse_torch.__file__, "--data", str(train_events_dir),
                           "--repeats", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_weight_grad_difference"] == 0.0
    assert out["events"] == 7 and out["sites"] > 1000 and out["image_size"] == [400, 400]
    tables = out["tables"]
    assert tables["same"] is True
    for k in ("before", "after"):
        assert 0 < out[k]["q1_ms"] <= out[k]["median_ms"] <= out[k]["q3_ms"]
        assert 0 < tables[k]["q1_ms"] <= tables[k]["median_ms"] <= tables[k]["q3_ms"]
        assert tables[k]["operations"] == tables["before"]["operations"] > 20
        assert tables[k]["computing"] == tables["before"]["computing"] > 10
        assert tables[k]["computing"] < tables[k]["operations"]  # views compute nothing


def test_a_changed_layer_shows_as_a_gradient_difference(train_events_dir, tmp_path, capsys):
    """The comparison can fail: a 'before' whose convolution is scaled by 2."""
    text = Path(sparse_torch.__file__).read_text()
    marker = "    return _SubmConv.apply(features, neighbours, weight, mirrored)"
    assert marker in text
    before = tmp_path / "before.py"
    before.write_text(text.replace(marker, marker.replace("return ", "return 2 * ")))
    assert sparse_ab.main(["--before", str(before), "--data", str(train_events_dir),
                           "--repeats", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["max_weight_grad_difference"] > 0.1


def test_other_tables_are_told(train_events_dir, tmp_path, capsys):
    """A 'before' whose neighbour table misses the window's last offset: the tables
    differ (and so do the gradients)."""
    text = Path(sparse_torch.__file__).read_text()
    marker = "    table += shift\n"
    assert text.count(marker) == 1
    before = tmp_path / "before.py"
    before.write_text(text.replace(marker, marker + "    table[:, -1] = n\n"))
    assert sparse_ab.main(["--before", str(before), "--data", str(train_events_dir),
                           "--repeats", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tables"]["same"] is False and out["max_weight_grad_difference"] > 0


def test_a_missing_file_is_named(tmp_path, capsys):
    missing = tmp_path / "nope.py"
    assert sparse_ab.main(["--before", str(missing), "--data", str(tmp_path)]) == 2
    assert f"--before {missing}: not a Python file" in capsys.readouterr().err
