"""The generator's physics versions: what each changed, so that a store or a network made
with an older one is made again event for event (``lartpc simulate --physics``, and the
``physics`` a network's record of its events carries; docs/event-store.md).

A version names the physics, not the code: ``sim3`` events are the same with this code as
with the code that introduced ``sim3``. Records from before versions were selectable
carry no ``physics`` and were all made with ``sim3``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lartpc.errors import LartpcError


@dataclass(frozen=True, slots=True)
class Physics:
    """The switches that differ between generator versions."""

    name: str
    #: e+- ranges (and the energy along a followed electron's tail) from the electrons'
    #: own total collision stopping power (Berger-Seltzer), and the collision loss
    #: between two bremsstrahlung emissions booked at the energy after the last one;
    #: else (sim3) the muon's Bethe range scaled to the electron mass (11-14 % more loss
    #: per cm at 5-10 MeV, the excess deposited nowhere) and the loss booked at the
    #: electron's starting energy
    electron_stopping: bool
    #: protons interact as nucleons (no pion below the production threshold, a pion's
    #: mass paid out of the energy); else (sim3) with the pions' final states
    nucleon_interactions: bool
    #: a positron that stops annihilates into two back-to-back 511 keV photons
    annihilation: bool


PHYSICS = {
    "sim3": Physics("sim3", electron_stopping=False, nucleon_interactions=False,
                    annihilation=False),
    "sim4": Physics("sim4", electron_stopping=True, nucleon_interactions=True,
                    annihilation=True),
}
LATEST = "sim4"  #: what ``lartpc simulate`` makes unless told otherwise
UNRECORDED = "sim3"  #: the version of a record that names none (made before sim4)


def physics(name: str | None = None) -> Physics:
    """The :class:`Physics` of version ``name`` (None: :data:`LATEST`); a clear error
    for an unknown one."""
    name = LATEST if name is None else str(name)
    if name not in PHYSICS:
        raise LartpcError(f"--physics {name!r}: one of {', '.join(PHYSICS)}")
    return PHYSICS[name]


def of_store(generator_version: str) -> str | None:
    """The physics version a store's ``generator_version`` attribute names (``0.1.0+sim4``
    -> ``sim4``), None when it names none of :data:`PHYSICS`."""
    tail = str(generator_version).rpartition("+")[2]
    return tail if tail in PHYSICS else None
