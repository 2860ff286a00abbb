"""The start-finding stage: each event turned so its shower or track starts at one corner.

``data.orient = "start"`` (and ``python -m lartpc.jobs.local.orient_store`` for a whole
store). In beam events every particle enters from the same side, so the start of a
shower sits at its upstream end, always in the same place relative to the rest of the
image. In isotropic events the start is either end of a track pointing anywhere, and a
network trained on them as they are does not find it (docs/fidelity.md, "Isotropic events").
This stage finds each event's start and projected direction from the image alone
(:func:`find_start`; no truth) and mirrors the event on the wire axis when that
direction points to lower wires and on the time axis when it points to earlier times,
so that the start the rule finds lies at the low-wire, early end and the track leaves
it towards higher wires and later times.

Applied identically to training and evaluation events, it is part of the classifier: a
fixed first stage before the network, which then sees every event as it would see a
beam event. It departs from the paper's protocol, which fed the images as they are.
Mirroring moves the event in the image (into wire and time ranges the detector may
leave empty); charge and truth are kept as they are (the truth direction is not
mirrored). It needs full-resolution events: the rule's lengths (``LINK_CM`` and the
others) are a few pixels at downsample 1 and less than one above it.

Cost: about 5 ms per event on one CPU core (a k-d tree of its pixels), paid once when a
loader reads its shard (``Loader.orient_s``), not per batch.
"""

from __future__ import annotations

import numpy as np

from lartpc.errors import LartpcError

LINK_CM = 1.0  #: pixels closer than this belong to one cluster (find_start)
END_CM = 5.0  #: length of a cluster's end whose transverse spread is compared
CORE_CM = 1.0  #: half-width about that end's median line where the start is looked for
DIRECTION_CM = 6.0  #: radius about the start whose charge gives the direction


def _principal_axis(p: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted mean of points ``p`` (N, 2) and the unit vector of their largest spread."""
    mean = np.average(p, axis=0, weights=w)
    return mean, np.linalg.eigh(np.cov((p - mean).T, aweights=w))[1][:, -1]


def find_start(geom, rows, cols, charge) -> tuple[np.ndarray, np.ndarray]:
    """The start of a shower in one image, without truth: (x, z) in cm and the unit
    direction (d_x, d_z) of the track leaving it, projected onto the plane.

    Pixels closer than ``LINK_CM`` are linked into clusters; the cluster holding the
    most charge is the shower's trunk (photons radiated from it make detached blobs).
    Of the trunk's two ends along its principal axis, the start is the one whose first
    ``END_CM`` spread least across the axis (one or two tracks, not a shower), and the
    start point its outermost pixel within ``CORE_CM`` of that end's median line; the
    direction is the principal axis of the charge within ``DIRECTION_CM`` of it.
    """
    p = np.c_[(rows - geom.pretrigger_ticks / geom.tick_group) * geom.time_pixel_cm,
              cols * geom.wire_pitch_cm]
    w = np.clip(charge, 1e-6, None)
    if len(p) == 0:  # nothing visible: any start, no charge after it
        return np.zeros(2), np.array([0.0, 1.0])
    # scipy here, not at the top: every loader imports this module, few runs orient their
    # events, and scipy's import costs ~0.4 s in each training process
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    pairs = cKDTree(p).query_pairs(LINK_CM, output_type="ndarray")
    links = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])),
                       shape=(len(p), len(p)))
    _, cluster = connected_components(links, directed=False)
    trunk = cluster == np.argmax(np.bincount(cluster, weights=w))
    p, w = p[trunk], w[trunk]
    if len(p) < 3:
        return p[0], np.array([0.0, 1.0])
    mean, axis = _principal_axis(p, w)
    s, t = (p - mean) @ axis, (p - mean) @ np.array([-axis[1], axis[0]])

    def end(sign: float) -> np.ndarray:
        return sign * s < (sign * s).min() + END_CM

    def spread(sign: float) -> float:
        near = end(sign)
        return float(np.cov(t[near], aweights=w[near])) if near.sum() > 1 else 0.0

    sign = min((1.0, -1.0), key=spread)
    core = np.abs(t - np.median(t[end(sign)])) < CORE_CM
    start = p[np.flatnonzero(core)[np.argmin(sign * s[core])]]
    near = np.hypot(*(p - start).T) < DIRECTION_CM
    if near.sum() < 3:
        return start, sign * axis
    _, d = _principal_axis(p[near], w[near])
    return start, (d if np.average((p[near] - start) @ d, weights=w[near]) >= 0 else -d)


def orient(ev, geom) -> tuple[bool, bool, bool]:
    """Mirror ``ev`` (an :class:`~lartpc.data.store.Event`) in place as the module
    docstring says; (mirrored on the wire axis, on the time axis, the found direction's
    wire component has the sign of the truth direction's, when the event has one)."""
    if len(ev.charge) == 0:
        return False, False, False
    _, (dx, dz) = find_start(geom, ev.row.astype(float), ev.col.astype(float), ev.charge)
    flip_wire, flip_time = bool(dz < 0), bool(dx < 0)
    if flip_wire:
        ev.col = (geom.width - 1 - ev.col).astype(np.int16)
    if flip_time:
        ev.row = (geom.height - 1 - ev.row).astype(np.int16)
    truth_dz = float(np.asarray(ev.truth.get("direction", (0.0, 0.0, 0.0)))[2])
    return flip_wire, flip_time, bool(np.sign(dz) == np.sign(truth_dz))


def check_resolution(geom, where: str) -> None:
    """Refuse events the rule was not made for (``where`` names the store or option)."""
    if geom.downsample != 1:
        raise LartpcError(f"{where}: downsample {geom.downsample}; finding the start needs "
                          "full-resolution events (downsample 1)")
