"""`python -m lartpc.jobs.local.pik_limit`: how well interacting pions and kaons can be
told apart, from the generator's truth and parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lartpc.jobs.local.pik_limit import (
    TYPES,
    category_probabilities,
    features,
    main,
    type_probabilities,
)

from lartpc import CLASSES
from lartpc.data import EventStore
from lartpc.sim.hadrons import HADRONIC
from lartpc.sim.limits import event_masks, truth_limits


@pytest.fixture(scope="module")
def hadrons(tmp_path_factory):
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("pik")
    write_dataset(d, 240, seed=21, classes="pion,kaon", source_geometry="isotropic",
                  downsample=9, shard_size=120)
    return d


def test_interaction_types_are_the_generators():
    p = type_probabilities()
    for c in ("pion", "kaon"):
        assert p[c].sum() == pytest.approx(1) and np.all(p[c] >= 0)
        assert category_probabilities()[c].sum() == pytest.approx(1)
    i = TYPES.index
    assert p["pion"][i("kink")] == HADRONIC.pion_mix[0]
    assert p["kaon"][i("kink")] == HADRONIC.kaon_mix[0]
    assert p["pion"][i("pi0_only")] == HADRONIC.pion_mix[1]  # pi+ n -> pi0 p
    assert p["kaon"][i("one_proton")] == HADRONIC.kaon_mix[1]  # K+ n -> K0 p, K0 unseen
    assert p["kaon"][i("star_no_lead")] == pytest.approx(
        (1 - sum(HADRONIC.kaon_mix)) * (1 - HADRONIC.inel_kaon_keeps_lead))


def test_features_of_the_classifiable_hadrons(hadrons):
    store = EventStore(hadrons)
    f = features(store, 0.0, seed=3)
    labels = np.asarray(store.labels)
    keep = np.isin(labels, [CLASSES.index("pion"), CLASSES.index("kaon")]) \
        & ~event_masks(store)["indistinguishable"]
    assert len(f["label"]) == keep.sum() > 50
    pion, kaon = f["label"] == 0, f["label"] == 1
    # on the relativistic rise a pion's charge per projected cm starts where a kaon's
    # (near minimum ionising) ends: compare the lowest, where the projection adds least
    assert np.quantile(f["log_charge"][pion], 0.1) > np.quantile(f["log_charge"][kaon], 0.1)
    assert not f["hard_delta"][kaon].any()  # no kaon reaches past the kaons' T_max
    assert set(np.unique(f["type"])) <= set(range(2 * len(TYPES) + 1))


def test_classifier_and_reference_rule(hadrons, tmp_path, capsys):
    out = tmp_path / "pik.json"
    assert main([str(hadrons), "--wire-resolution", "0.2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == res
    rec = res["recall"]
    for r in rec.values():
        assert 0 <= r["pion"] <= 1 and 0 <= r["kaon"] <= 1
    assert rec["all"]["balanced"] > 0.6  # more than a coin
    # the type alone, scored on drawn events, near what the parameters give exactly
    assert rec["type"]["balanced"] == pytest.approx(
        res["type_only_from_the_parameters"]["balanced"], abs=0.1)
    lim = truth_limits(EventStore(hadrons))["classes"]
    for c in ("pion", "kaon"):
        ref = res["reference_rule_recall"][c]
        assert ref["reference_rule"] == lim[c]["reference_rule_recall"]
        assert ref["with_physics_feature_classifier"] == pytest.approx(
            lim[c]["reference_rule_recall"] * rec["all"][c])


def test_refusals(events_dir, tmp_path, capsys):
    gamma_e = tmp_path / "ge"
    from lartpc.sim import write_dataset

    write_dataset(gamma_e, 10, seed=2, classes="gamma,electron", downsample=9)
    assert main([str(gamma_e)]) == 2
    assert str(gamma_e) in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(gamma_e), "--wire-resolution", "-1"])
    assert e.value.code == 2 and "--wire-resolution" in capsys.readouterr().err
