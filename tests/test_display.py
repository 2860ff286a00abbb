"""Event displays written by ``lartpc display``."""

from __future__ import annotations

from lartpc.cli import main


def test_display_full_resolution(full_res_events_dir, tmp_path):
    out = tmp_path / "ev.png"
    assert main(["display", str(full_res_events_dir), "--event", "2", "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_display_bad_event(full_res_events_dir, tmp_path, capsys):
    out = tmp_path / "ev.png"
    assert main(["display", str(full_res_events_dir), "--event", "99", "--out", str(out)]) == 2
    assert "--event 99" in capsys.readouterr().err
    assert not out.exists()
