"""Event displays written by ``lartpc display``."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np

from lartpc.cli import main

FIGURE_PX = (770, 880)  # 8 x 7 inches at 110 dpi


def _charge_pixels(png) -> np.ndarray:
    """Coloured (viridis, not grey/black/white) pixels of the plot area, left of the
    colour bar."""
    rgb = mpimg.imread(png)[..., :3]
    coloured = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.15
    return coloured[:, : int(0.75 * rgb.shape[1])]


def test_display_full_resolution(full_res_events_dir, tmp_path):
    pngs = {}
    for name, extra in (("ev2", []), ("ev3", []), ("ev2_full", ["--no-crop"])):
        out = tmp_path / f"{name}.png"
        event = name[2]
        assert main(["display", str(full_res_events_dir), "--event", event, "--out",
                     str(out), *extra]) == 0
        img = mpimg.imread(out)
        assert img.shape == (*FIGURE_PX, 4)
        pngs[name] = _charge_pixels(out)
    # the event's charge is drawn; cropped to it, it covers far more of the plot than in
    # the whole 3600 x 3600 frame, and another event draws other pixels
    assert pngs["ev2"].sum() > 500
    assert pngs["ev2"].sum() > 3 * pngs["ev2_full"].sum()
    assert (pngs["ev2"] != pngs["ev3"]).sum() > 500


def test_a_simulated_stores_charge_is_in_thousands_of_electrons(full_res_events_dir):
    from lartpc.commands.display import charge_unit
    from lartpc.data import EventStore

    assert charge_unit(EventStore(full_res_events_dir).attrs) == "10$^3$ electrons"


def test_display_bad_event(full_res_events_dir, tmp_path, capsys):
    out = tmp_path / "ev.png"
    assert main(["display", str(full_res_events_dir), "--event", "99", "--out", str(out)]) == 2
    assert "--event 99" in capsys.readouterr().err
    assert not out.exists()


def test_display_replaces_only_a_png_and_checks_its_margin(full_res_events_dir, tmp_path,
                                                           capsys):
    """--out over a file that is not a PNG (an event shard, named by mistake) is refused,
    over an earlier display it is drawn again; a negative --margin is refused."""
    shard = tmp_path / "events-00000.h5"
    shard.write_bytes(b"\x89HDF\r\n\x1a\n and the rest")
    assert main(["display", str(full_res_events_dir), "--out", str(shard)]) == 2
    assert "not a PNG image; refusing to replace it" in capsys.readouterr().err
    assert shard.read_bytes().startswith(b"\x89HDF")
    png = tmp_path / "ev.png"
    for _ in range(2):
        assert main(["display", str(full_res_events_dir), "--out", str(png)]) == 0
    assert main(["display", str(full_res_events_dir), "--out", str(tmp_path / "m.png"),
                 "--margin=-5"]) == 2
    assert "--margin -5" in capsys.readouterr().err and not (tmp_path / "m.png").exists()
