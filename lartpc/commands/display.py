"""``lartpc display PATH --event I --out event.png``: one event as wire vs time."""

from __future__ import annotations

import argparse
from pathlib import Path

from lartpc.errors import LartpcError
from lartpc.fsutil import atomic_write, check_replaceable, output_file

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="event file or folder of events-*.h5 shards")
    p.add_argument("--event", type=int, default=0,
                   help="event index (default 0; negative counts from the end)")
    p.add_argument("--out", required=True, help="PNG file to write (an existing file is "
                                                "replaced only when it is a PNG)")
    p.add_argument("--margin", type=int, default=40,
                   help="full-resolution pixels of margin around the charge (default 40)")
    p.add_argument("--no-crop", action="store_true", help="draw the whole image")


def _charge_range(pos, charge, tail: float = 0.001) -> tuple[int, int]:
    """(low, high) positions leaving out ``tail`` of the charge on each side."""
    import numpy as np

    order = np.argsort(pos, kind="stable")
    cum = np.cumsum(charge[order], dtype=float)
    cum /= cum[-1] if cum[-1] > 0 else 1.0
    lo = int(np.searchsorted(cum, tail))
    hi = int(np.searchsorted(cum, 1 - tail))
    return int(pos[order][lo]), int(pos[order][min(hi, len(pos) - 1)])


def _view(event, geometry, margin: int) -> tuple[int, int, int, int]:
    """(row0, row1, col0, col1): the box holding 99.8 % of the charge, with ``margin``
    full-resolution pixels around it and its short side padded to a third of the long."""
    k = geometry.downsample
    h, w = geometry.shape
    m = max(1, margin // k)
    (lo_r, hi_r), (lo_c, hi_c) = (_charge_range(v, event.charge)
                                  for v in (event.row, event.col))
    r0, r1 = max(0, lo_r - m), min(h, hi_r + m + 1)
    c0, c1 = max(0, lo_c - m), min(w, hi_c + m + 1)
    # keep the aspect sane: pad the short side to at least a third of the long one
    side = max(r1 - r0, c1 - c0) // 3
    if r1 - r0 < side:
        pad = (side - (r1 - r0)) // 2
        r0, r1 = max(0, r0 - pad), min(h, r1 + pad)
    if c1 - c0 < side:
        pad = (side - (c1 - c0)) // 2
        c0, c1 = max(0, c0 - pad), min(w, c1 + pad)
    return r0, r1, c0, c1


def charge_unit(attrs: dict) -> str:
    """What a store's charges are, from its shards' attributes: the generator's 10^3
    electrons, a converted file's summed ADC (times its --charge-scale), or a larcv3
    file's voxel values as they were."""
    if attrs.get("source_format") == "larcv3":
        return "the larcv3 file's voxel values"
    if attrs.get("generator") == "lartpc.data.convert":
        scale = float(attrs.get("charge_scale", 1.0))
        return "summed ADC" if scale == 1.0 else f"summed ADC x {scale:g}"
    return "10$^3$ electrons"


def render(event, geometry, out: str | Path, *, title: str, margin: int = 40,
           crop: bool = True, unit: str = "10$^3$ electrons") -> Path:
    """Draw ``event`` to a PNG: wire (x) vs time pixel (y), log colour scale.

    Parameters
    ----------
    event : :class:`lartpc.data.Event`.
    geometry : its :class:`lartpc.geometry.Geometry`.
    out : PNG path (written atomically).
    title : figure title.
    margin : margin around the charge, in full-resolution pixels.
    crop : crop to the box holding 99.8 % of the charge (a track is invisible at
        3600 x 3600; the few noise-only ROIs scattered over the plane are left out).
    unit : what the charges are (:func:`charge_unit`), for the colour bar.
    """

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    k = geometry.downsample
    r0, r1, c0, c1 = _view(event, geometry, margin) if crop and len(event) else \
        (0, geometry.shape[0], 0, geometry.shape[1])
    img = np.full((r1 - r0, c1 - c0), np.nan, np.float32)
    sel = (event.row >= r0) & (event.row < r1) & (event.col >= c0) & (event.col < c1)
    img[event.row[sel] - r0, event.col[sel] - c0] = event.charge[sel]
    fig, ax = plt.subplots(figsize=(8, 7), dpi=110)
    ax.set_facecolor("white")
    vals = event.charge[sel]
    vmin = float(np.percentile(vals, 2)) if len(vals) else 1.0
    vmax = float(vals.max()) if len(vals) else 10.0
    im = ax.imshow(img, origin="lower", cmap="viridis", interpolation="nearest",
                   norm=LogNorm(vmin=max(vmin, 1e-3), vmax=max(vmax, vmin * 10)),
                   extent=(c0 * k, c1 * k, r0 * k, r1 * k), aspect="auto")
    fig.colorbar(im, ax=ax, label=f"charge ({unit}, log scale)")
    ax.set_xlabel(f"wire (0.3 cm pitch){'' if k == 1 else f', binned by {k}'}")
    ax.set_ylabel("time pixel (3 ticks = 1.5 us)")
    ax.set_title(title)
    fig.tight_layout()
    out = Path(out)
    try:
        atomic_write(out, lambda f: fig.savefig(f, format="png"))
    finally:
        plt.close(fig)
    return out


def event_title(event, index: int, classes: tuple[str, ...] | None = None) -> str:
    """'<class>, p = X GeV/c, event I' (+ how the primary ended, when known); ``classes``:
    the store's (default the study's five)."""
    from lartpc import CLASSES

    t = event.truth or {}
    parts = [(classes or CLASSES)[event.label]]
    if t.get("momentum_mev"):
        parts.append(f"p = {t['momentum_mev'] / 1000:.2f} GeV/c")
    parts.append(f"event {index}")
    if t.get("end_process"):
        parts.append(f"primary: {t['end_process']}")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    if args.margin < 0:
        raise LartpcError(f"--margin {args.margin}: pixels, 0 or more")
    out = output_file(args.out)  # a link the user made to the folder: followed here only
    check_replaceable(out, "--out", "PNG image", lambda data: data.startswith(PNG_SIGNATURE))
    from lartpc.data import EventStore  # torch, after the options' checks

    store = EventStore(args.path)
    if not -len(store) <= args.event < len(store):
        raise LartpcError(f"--event {args.event}: {args.path} holds {len(store)} events")
    if not out.parent.is_dir():
        raise LartpcError(f"--out {out}: folder {out.parent} does not exist")
    ev = store[args.event]
    render(ev, store.geometry, out,
           title=event_title(ev, args.event % len(store), store.classes),
           margin=args.margin, crop=not args.no_crop, unit=charge_unit(store.attrs))
    print(out)
    return 0
