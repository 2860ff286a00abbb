"""`lartpc evaluate`: a committed run's held-out events made again by index and rescored
from its compact weights reproduce its confusion matrix event for event (issue 39)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lartpc.analysis.csvread import read_confusion
from train_helpers import HEAVY_TIMEOUT_S, clean_env

from lartpc import CLASSES
from lartpc.data import EventStore

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs/results/fidelity-runs"
TINY = RUNS / "run-tiny-scnet-beam-ds9"  #: a 45 s CPU run of 300 events at 400x400


def _evaluate(*argv, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lartpc", "evaluate", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=clean_env(),
                          cwd=ROOT)


def _one_line_exit_2(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_tiny_run_rescored_from_weights_reproduces_its_confusion(tmp_path):
    out = tmp_path / "eval.json"
    r = _evaluate(TINY, "--regenerate", tmp_path / "events", "--json", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    recorded = read_confusion(TINY / "confusion.csv", CLASSES)
    assert res["matches_run_confusion"] is True
    assert res["confusion"] == recorded.tolist() and res["events"] == recorded.sum() == 60
    assert res["dtype"] == "float16" and res["held_out"] is True
    # the regenerated store holds exactly the run's held-out events, by their indices
    store = EventStore(tmp_path / "events")
    assert len(store) == 60 and len(set(res["event_ids"])) == 60
    assert (np.asarray(res["event_ids"]) % len(CLASSES) == np.asarray(store.labels)).all()
    # each event's true label beside its prediction; the matrix's orientation; the
    # accuracy's binomial SE and 95 % Wilson interval
    labels, predicted = np.asarray(res["labels"]), np.asarray(res["predicted"])
    assert (labels == np.asarray(res["event_ids"]) % len(CLASSES)).all()
    assert res["accuracy"] == float(np.mean(labels == predicted))
    conf = np.zeros((len(CLASSES), len(CLASSES)), int)
    np.add.at(conf, (labels, predicted), 1)
    assert res["confusion"] == conf.tolist()
    assert (res["confusion_rows"], res["confusion_columns"]) == ("true class",
                                                                "predicted class")
    p = res["accuracy"]
    assert res["accuracy_se"] == pytest.approx((p * (1 - p) / 60) ** 0.5)
    lo, hi = res["accuracy_wilson95"]
    assert 0 <= lo < p < hi <= 1


def test_torch_layers_rescore_the_tiny_run_to_the_same_predictions(tmp_path):
    """``--sparse torch``: SCNet's layers in torch operations (tables built in the
    loader's thread) give every one of the 60 held-out events spconv's prediction."""
    out = tmp_path / "eval.json"
    r = _evaluate(TINY, "--regenerate", tmp_path / "events", "--sparse", "torch",
                  "--json", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["matches_run_confusion"] is True and res["events"] == 60
    again = tmp_path / "spconv.json"
    r = _evaluate(TINY, "--store", tmp_path / "events", "--indices", "all", "--json", again)
    assert r.returncode == 0, r.stderr
    assert json.loads(again.read_text())["predicted"] == res["predicted"]


def _same_events(a: EventStore, b: EventStore, indices) -> bool:
    """Event ``indices[j]`` of ``a`` is event ``j`` of ``b``, label and pixels."""
    for j, i in enumerate(indices):
        x, y = a[int(i)], b[j]
        if x.label != y.label or len(x) != len(y) or not (
                (x.row == y.row).all() and (x.col == y.col).all()
                and (x.charge == y.charge).all()):
            return False
    return True


def test_events_made_by_index_are_the_full_stores_events(tmp_path):
    from lartpc.sim import write_dataset
    from lartpc.sim.subset import write_events

    write_dataset(tmp_path / "full", 12, seed=4, downsample=9, source_geometry="beam")
    write_events(tmp_path / "some", [9, 2, 7], seed=4, downsample=9, source_geometry="beam")
    full, some = EventStore(tmp_path / "full"), EventStore(tmp_path / "some")
    assert all(len(full[i]) > 0 for i in (9, 2, 7))
    assert _same_events(full, some, (9, 2, 7))



def test_held_out_events_are_made_again_as_the_store_made_them(tmp_path):
    """A store made with other classes, momenta and dead wires than ``lartpc
    simulate``'s defaults records them, compact weights read them from it
    (``compact_weights --store``), and the held-out events made again are the store's,
    label and pixel. They used to be made with the defaults whatever the store: other
    events, and with other classes other labels, scored without a word."""
    from lartpc.jobs.local.compact_weights import made_from

    from lartpc.config import load_config
    from lartpc.errors import LartpcError
    from lartpc.sim import write_dataset
    from lartpc.sim.readout import ReadoutConfig
    from lartpc.train.evaluate import regenerate_held_out
    from lartpc.train.segments import store_identity

    write_dataset(tmp_path / "full", 24, seed=6, downsample=9, classes="muon,pion",
                  momentum_gev=(0.3, 0.5), readout=ReadoutConfig(dead_wire_fraction=0.2))
    full = EventStore(tmp_path / "full")
    record = store_identity(full, 0)
    events = made_from(tmp_path / "full", record)
    assert events == {"seed": 6, "events": 24, "geometry": "isotropic", "downsample": 9,
                      "classes": "muon,pion", "momentum_gev": [0.3, 0.5],
                      "dead_wire_fraction": 0.2, "physics": "sim4"}
    cfg = load_config("tiny-scnet", ["data.downsample=9", "data.eval_fraction=0.25"])
    network = {"config": cfg.to_dict(), "events": events, "path": "w"}
    indices = regenerate_held_out(network, tmp_path / "again")
    assert len(indices) == 6
    assert _same_events(full, EventStore(tmp_path / "again"), indices)
    # the defaults' way: not the store's events
    plain = {k: v for k, v in events.items() if k not in ("classes", "momentum_gev",
                                                          "dead_wire_fraction")}
    indices = regenerate_held_out({**network, "events": plain}, tmp_path / "plain")
    assert not _same_events(full, EventStore(tmp_path / "plain"), indices)
    with pytest.raises(LartpcError, match="not the store the run trained on"):
        made_from(tmp_path / "full", {**record, "events": 23})
    # a record without physics was made with sim3 (before versions): not these events
    unversioned = {k: v for k, v in events.items() if k != "physics"}
    indices = regenerate_held_out({**network, "events": unversioned}, tmp_path / "sim3")
    assert EventStore(tmp_path / "sim3").attrs["generator_version"].endswith("+sim3")
    assert not _same_events(full, EventStore(tmp_path / "sim3"), indices)

@pytest.mark.parametrize("name", sorted(p.parent.name for p in RUNS.glob("*/weights.pt")))
def test_committed_weights_load_with_their_record(name):
    from lartpc.train import weights

    net = weights.load(RUNS / name)
    # float32 where float16 changed a prediction (stage 2 on beam events: one of 1,500)
    assert net["config"]["model"]["name"] == "scnet" and net["dtype"] in ("float16", "float32")
    assert net["global_step"] > 0 and net["train_time_s"] > 0
    assert {"seed", "events", "geometry", "downsample"} <= set(net["events"])
    assert all(v.dtype.is_floating_point and v.abs().sum() > 0
               for v in net["model"].values())
    assert not (RUNS / name / "checkpoint.pt").exists()  # the 20 MB file is not kept


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "eval.json"
    _one_line_exit_2(_evaluate(tmp_path / "nowhere", "--store", TINY, "--json", out),
                     "nowhere", "no such file or run folder")
    bad = tmp_path / "weights.pt"
    data = bytearray((TINY / "weights.pt").read_bytes())
    data[len(data) // 2] ^= 0x10
    bad.write_bytes(bytes(data))
    _one_line_exit_2(_evaluate(bad, "--regenerate", tmp_path / "ev", "--json", out),
                     str(bad), "CRC-32")
    _one_line_exit_2(_evaluate(TINY, "--regenerate", tmp_path / "ev", "--indices", "0:3"),
                     "--indices")
    _one_line_exit_2(_evaluate(TINY, "--regenerate", tmp_path / "ev", "--split", "test"),
                     "--split test", "no test split")
    assert not out.exists() and not (tmp_path / "ev").exists()


def test_regenerate_from_a_plain_checkpoint_says_how_to_record_its_events(tmp_path):
    """A training's own checkpoint.pt does not record how its events were made: the
    refusal names the command that writes weights which do (README, run-folder.md)."""
    from lartpc.errors import LartpcError
    from lartpc.train.evaluate import regenerate_held_out

    run = tmp_path / "run"
    network = {"path": str(run / "checkpoint.pt"), "events": {}, "config": {}}
    with pytest.raises(LartpcError) as e:
        regenerate_held_out(network, tmp_path / "events")
    assert "does not record how its events were made" in str(e.value)
    assert str(e.value).endswith("write weights that record it: python -m "
                                 f"lartpc.jobs.local.compact_weights {run} --store STORE")
    assert not (tmp_path / "events").exists()


def test_nothing_a_user_made_is_replaced(tmp_path):
    """--regenerate into a folder holding a store refuses without --overwrite (it
    replaced a 3,000-event store with the 60 held-out events before), and --json
    replaces only an evaluation's own JSON, never a checkpoint or a user's file; with
    --overwrite, and over its own JSON, it goes ahead."""
    store, out = tmp_path / "events", tmp_path / "eval.json"
    r = subprocess.run([sys.executable, "-m", "lartpc", "simulate", "--out", str(store),
                        "--events", "12", "--seed", "3", "--downsample", "9"],
                       capture_output=True, text=True, timeout=300, env=clean_env())
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in store.iterdir()}
    _one_line_exit_2(_evaluate(TINY, "--regenerate", store, "--json", out),
                     f"--regenerate {store}", "1 event shard", "--overwrite")
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": 1}\n')
    _one_line_exit_2(_evaluate(TINY, "--store", store, "--indices", "all", "--json", mine),
                     f"--json {mine}", "not a lartpc evaluate result")
    assert {p.name: p.read_bytes() for p in store.iterdir()} == before
    assert mine.read_text() == '{"mine": 1}\n' and not out.exists()
    _one_line_exit_2(_evaluate(TINY, "--store", store, "--overwrite"), "--overwrite",
                     "only with --regenerate")
    r = _evaluate(TINY, "--regenerate", store, "--overwrite", "--json", out)
    assert r.returncode == 0, r.stderr
    assert len(EventStore(store)) == 60 and json.loads(out.read_text())["events"] == 60
    r = _evaluate(TINY, "--regenerate", tmp_path / "again", "--json", out)  # its own JSON
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.timeout(HEAVY_TIMEOUT_S)
def test_beam_headline_reproduces_from_committed_weights(tmp_path):
    """README's 83.1 %: SCNet's stage 2 on beam events, 1,500 held-out events of seed 1
    made again at full resolution (a few minutes on 2 cores)."""
    run = RUNS / "run-scnet-beam-finetuned"
    out = tmp_path / "eval.json"
    r = _evaluate(run, "--regenerate", tmp_path / "events", "--workers", "2", "--json", out,
                  timeout=1800)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["matches_run_confusion"] is True
    assert res["events"] == 1500 and round(100 * res["accuracy"], 1) == 83.1


def test_a_class_with_no_held_out_events_has_no_accuracy(tmp_path):
    """A store of muons and pions names all five classes: eval.csv gives gamma,
    electron and kaon nan (0 of 0 is no accuracy), not 0.0, and analysis reads it."""
    from lartpc.analysis.runs import load_run
    from train_helpers import rows, run, train_cmd

    from lartpc.sim import write_dataset
    from lartpc.train.evaluate import EvalResult

    write_dataset(tmp_path / "data", 20, seed=5, downsample=9, classes="muon,pion")
    r = run(train_cmd(tmp_path / "data", tmp_path / "run", "train.epochs=1"))
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = rows(tmp_path / "run" / "eval.csv")
    assert [row[f"acc_{c}"] for c in ("gamma", "electron", "kaon")] == ["nan"] * 3
    assert all(0 <= float(row[f"acc_{c}"]) <= 1 for c in ("muon", "pion"))
    evals = load_run(tmp_path / "run").evals
    assert evals["acc_gamma"].isna().all() and evals["acc_muon"].notna().all()
    conf = np.array([[0, 0], [1, 3]])
    got = EvalResult(0.5, 4, conf, ("muon", "pion")).row()
    assert np.isnan(got["acc_muon"]) and got["acc_pion"] == 0.75 and got["accuracy"] == 0.75
