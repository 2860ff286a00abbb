"""jobs/local/dedx_check: the first centimetres of a converted photon carry two
minimum-ionising particles' charge per wire, an electron's one (the dE/dx that tells
them apart once the beam vertex does not), measured on generated beam events."""

from __future__ import annotations

import json
import sys

import pytest
from lartpc.jobs.local.dedx_check import main
from train_helpers import run


@pytest.fixture(scope="module")
def e_gamma_beam(tmp_path_factory):
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("e_gamma_beam")
    write_dataset(d, 60, seed=11, classes="gamma,electron", source_geometry="beam")
    return d


@pytest.fixture(scope="module")
def e_gamma_isotropic(tmp_path_factory):
    from lartpc.sim import write_dataset

    d = tmp_path_factory.mktemp("e_gamma_isotropic")
    write_dataset(d, 120, seed=12, classes="gamma,electron", source_geometry="isotropic")
    return d


def test_photon_starts_carry_two_mips_per_wire(e_gamma_beam, capsys):
    assert main([str(e_gamma_beam), "--events", "60", "--lengths", "2,4"]) == 0
    got = json.loads(capsys.readouterr().out)
    for cut in got.values():
        assert cut["events_gamma"] == cut["events_electron"] == 30
        # a pair is two MIPs (Bethe-Bloch: each e+- near 2.1 MeV/cm on the Fermi plateau)
        assert 1.6 < cut["median_gamma"] / cut["median_electron"] < 2.5, cut
    assert got["2cm"]["balanced_accuracy"] >= 0.8, got
    # beam directions are within 5 degrees of the wire-number axis: all in the last bin
    bins = got["2cm"]["by_wire_cosine"]
    assert [b["events_gamma"] + b["events_electron"] for b in bins] == [0, 0, 0, 60], bins


def test_charge_per_cm_does_not_depend_on_the_direction(e_gamma_beam, e_gamma_isotropic,
                                                        capsys):
    """Charge per wire times |cos| / pitch is dQ/dx: an isotropic electron's start gives
    the beam electron's (one MIP), whatever its angle to the wires; and the per-angle
    bins hold every event, with |cos| of isotropic directions spread over all of them."""
    assert main([str(e_gamma_beam), "--events", "60", "--lengths", "4"]) == 0
    beam = json.loads(capsys.readouterr().out)["4cm"]
    assert main([str(e_gamma_isotropic), "--events", "120", "--lengths", "4"]) == 0
    iso = json.loads(capsys.readouterr().out)["4cm"]
    assert 0.75 < iso["median_electron"] / beam["median_electron"] < 1.33, (iso, beam)
    bins = iso["by_wire_cosine"]
    assert sum(b["events_gamma"] for b in bins) == iso["events_gamma"] == 60, bins
    assert sum(b["events_electron"] for b in bins) == iso["events_electron"] == 60, bins
    assert all(b["events_gamma"] + b["events_electron"] >= 15 for b in bins), bins


def test_one_plane_cannot_see_how_far_a_track_leans_along_the_wires(
        e_gamma_beam, e_gamma_isotropic, capsys):
    """``seen``: charge per cm of the track's projection onto the plane, what an image
    shows. Beam tracks lie in the plane (|d_y| < 0.09), so it is their dQ/dx; an
    isotropic electron leaning along the wires (|d_y| > 0.75: its projection is under
    2/3 of its length) looks like 1.5 MIPs or more, so the cut takes it for a photon."""
    assert main([str(e_gamma_beam), "--events", "60", "--lengths", "4"]) == 0
    beam = json.loads(capsys.readouterr().out)["4cm"]
    assert 1.0 <= beam["seen"]["median_electron"] / beam["median_electron"] < 1.01, beam
    assert [b["events_gamma"] + b["events_electron"]
            for b in beam["seen"]["by_along_wires"]] == [60, 0, 0, 0], beam
    assert main([str(e_gamma_isotropic), "--events", "120", "--lengths", "4"]) == 0
    iso = json.loads(capsys.readouterr().out)["4cm"]
    flat, leaning = iso["seen"]["by_along_wires"][0], iso["seen"]["by_along_wires"][-1]
    assert min(flat["events_electron"], leaning["events_electron"]) >= 8, iso
    assert leaning["electron_accuracy"] < flat["electron_accuracy"] - 0.3, iso
    assert iso["seen"]["balanced_accuracy"] < iso["balanced_accuracy"], iso


def test_the_start_found_in_the_image_alone_still_separates_e_from_gamma(
        e_gamma_beam, e_gamma_isotropic, capsys):
    """``from_image``: no truth at all. The trunk cluster's narrow end is the true start
    (within 2 cm) in most events of both geometries, and the charge per projected cm
    there separates e from gamma well above chance: what a network can learn is in the
    image."""
    for store, n, found, accuracy in ((e_gamma_beam, 60, 0.9, 0.85),
                                      (e_gamma_isotropic, 120, 0.8, 0.75)):
        assert main([str(store), "--events", str(n), "--lengths", "2"]) == 0
        got = json.loads(capsys.readouterr().out)["2cm"]["from_image"]
        assert got["start_found"] >= found and got["balanced_accuracy"] >= accuracy, got
        assert got["median_gamma"] > 1.5 * got["median_electron"], got


def test_brightest_pixel_at_the_found_start_tells_fewer_apart_where_directions_vary(
        e_gamma_beam, e_gamma_isotropic, capsys):
    """``brightest_pixel``: the charge of a wire's brightest pixel, not divided by the
    path, at the start found in the image. Beam tracks cross the wires at one angle, so
    the pixel keeps two MIPs against one; isotropic ones spread or pile a wire's charge
    by their angle, and the pixel tells e from gamma less often than the charge per cm."""
    got = {}
    for name, store, n in (("beam", e_gamma_beam, 60), ("isotropic", e_gamma_isotropic, 120)):
        assert main([str(store), "--events", str(n), "--lengths", "2"]) == 0
        got[name] = json.loads(capsys.readouterr().out)["2cm"]["from_image"]
        pixel = got[name]["brightest_pixel"]
        assert pixel["median_gamma"] > 1.3 * pixel["median_electron"], pixel
    assert got["beam"]["brightest_pixel"]["balanced_accuracy"] >= 0.85, got["beam"]
    iso = got["isotropic"]
    assert 0.6 <= iso["brightest_pixel"]["balanced_accuracy"] \
        <= iso["balanced_accuracy"] + 0.02, iso


def test_find_start_of_an_event_with_next_to_nothing_visible(e_gamma_isotropic):
    """A shower below threshold leaves no pixel, or a few: a start is still returned (the
    charge after it is then what there is), not an error."""
    import numpy as np

    from lartpc.data.orient import find_start
    from lartpc.data.store import EventStore

    store = EventStore(e_gamma_isotropic)
    ev = store.read_many([0])[0]
    for n in (0, 1, 2):
        start, d = find_start(store.geometry, ev.row[:n].astype(float),
                              ev.col[:n].astype(float), ev.charge[:n])
        assert start.shape == (2,) and np.isfinite(start).all()
        assert abs(np.hypot(*d) - 1) < 1e-9


def test_downsampled_store_is_refused_in_one_line(events_dir):
    r = run([sys.executable, "-m", "lartpc.jobs.local.dedx_check", str(events_dir)],
            timeout=120)
    assert r.returncode == 2 and "full-resolution events" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
