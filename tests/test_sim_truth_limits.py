"""--source-geometry beam|isotropic and `lartpc inspect --truth-limits` on both."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lartpc.cli import main
from lartpc.data import EventStore
from lartpc.sim.generate import BEAM_VERTEX_BOX_CM


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    out = {}
    for geo in ("isotropic", "beam"):
        d = tmp_path_factory.mktemp(geo)
        assert main(["simulate", "--out", str(d), "--events", "100", "--seed", "3",
                     "--downsample", "12", "--classes", "muon,pion,kaon,gamma",
                     "--source-geometry", geo]) == 0
        out[geo] = d
    return out


def _limits(path, capsys):
    capsys.readouterr()
    assert main(["inspect", str(path), "--truth-limits", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["truth_limits"]


def test_beam_geometry_truth(samples):
    s = EventStore(samples["beam"])
    assert s.attrs["source_geometry"] == "beam"
    ev = s.read_many(range(len(s)))
    v = np.array([e.truth["vertex_cm"] for e in ev])
    d = np.array([e.truth["direction"] for e in ev])
    lo, hi = np.array(BEAM_VERTEX_BOX_CM).T
    assert ((v >= lo) & (v <= hi)).all()
    assert (v.max(0) - v.min(0) > 0.8 * (hi - lo)).all()  # spread over the box
    angle = np.degrees(np.arccos(np.clip(d[:, 2], -1, 1)))
    assert angle.max() <= 5.0 + 1e-3 and angle.mean() > 2.0  # filled cone, not a line
    iso = EventStore(samples["isotropic"]).read_many(range(30))
    assert np.array([e.truth["direction"][2] for e in iso]).min() < -0.3


def test_truth_limits_isotropic_vs_beam(samples, capsys):
    iso, beam = _limits(samples["isotropic"], capsys), _limits(samples["beam"], capsys)
    for c in ("pion", "kaon"):
        # isotropic: ~25-40 % of pions/kaons leave as clean MIP stubs, like muons
        assert iso["classes"][c]["exit_without_interaction"] > 0.15
        assert iso["classes"][c]["indistinguishable"] >= iso["classes"][c][
            "exit_without_interaction"]
        # beam: 10 m of argon ahead (~9 interaction lengths): they interact or decay
        assert beam["classes"][c]["exit_without_interaction"] < 0.05
    assert iso["classes"]["muon"]["indistinguishable"] == 0.0
    assert iso["classes"]["muon"]["events"] == 25 and iso["classes"]["electron"]["events"] == 0
    assert iso["reference_rule_muon_purity"] < 0.8 < 0.95 < beam["reference_rule_muon_purity"]
    # reference rule: 1 - indistinguishable per class, muons 1.0 (the stub pool is called muon),
    # overall the class-balanced mean over the classes present
    for lim in (iso, beam):
        got = {c: v["reference_rule_recall"] for c, v in lim["classes"].items()}
        assert got["muon"] == 1.0 and got["electron"] is None
        for c in ("gamma", "pion", "kaon"):
            assert got[c] == pytest.approx(1 - lim["classes"][c]["indistinguishable"])
        assert lim["reference_rule_overall"] == pytest.approx(
            np.mean([got[c] for c in ("gamma", "muon", "pion", "kaon")]))
    assert iso["classes"]["pion"]["reference_rule_recall"] < 0.85  # the stubs cost pions
    assert beam["classes"]["pion"]["reference_rule_recall"] > 0.9
    assert iso["reference_rule_overall"] < beam["reference_rule_overall"]
    assert iso["source_geometry"] == "isotropic" and beam["source_geometry"] == "beam"


def test_truth_limits_text_and_old_or_converted_stores(samples, tmp_path, capsys):
    capsys.readouterr()
    assert main(["inspect", str(samples["isotropic"]), "--truth-limits"]) == 0
    text = capsys.readouterr().out
    assert "truth limits (source geometry isotropic)" in text
    assert "reference rule's muon purity" in text
    assert "reference rule, overall" in text and "not a bound" in text
    header = next(line for line in text.splitlines() if line.startswith("class "))
    assert header.split()[-1] == "rule"
    import shutil

    import h5py

    old = tmp_path / "old"
    shutil.copytree(samples["beam"], old)
    for p in old.glob("events-*.h5"):
        with h5py.File(p, "a") as f:  # as a v1 store: no visible energy recorded
            f.attrs["schema_version"] = 1
            del f["truth/visible_energy_mev"]
    assert main(["inspect", str(old)]) == 0  # still loads
    capsys.readouterr()
    assert main(["inspect", str(old), "--truth-limits"]) == 2
    assert "truth/visible_energy_mev" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--source-geometry", "pencil"], "--source-geometry"),
    (["--geometry", "pencil"], "--source-geometry"),  # its old name, still read
    (["--dead-wire-fraction", "1.5"], "--dead-wire-fraction"),
])
def test_simulate_rejects_bad_geometry_options(tmp_path, capsys, argv, needle):
    out = tmp_path / "o"
    assert main(["simulate", "--out", str(out), "--events", "2", "--downsample", "12",
                 *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not list(out.glob("events-*.h5")) if out.exists() else True
