"""Job segments of a run (``run.json`` ``segments``): restarts and the waits between them.

A run resumed by later jobs (a time limit, a preemption, a SLURM ``--requeue``) has one
segment per job. Its own wall time is the time its jobs ran; the wait in the queue between
one segment's end and the next one's start is not. Segment start times may come from a
different clock than the step times (psutil's process start is rounded to the boot time's
whole second), so nothing here relies on them to better than :data:`CLOCK_TOL_S`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from lartpc.analysis.runcheck import CLOCK_TOL_S


@dataclass
class Restarts:
    """Where a run's later segments begin, relative to its step times.

    Attributes
    ----------
    intervals : list[int]
        Index ``i`` of each step interval ``t[i] -> t[i+1]`` that holds a restart.
    waits : list[tuple[float, float]]
        (at, seconds): each queue wait, at the start time of the segment that ended it.
    notes : list[str]
        What could not be known (a segment with neither an end time nor steps).
    """

    intervals: list[int] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def wait_s(self) -> float:
        """Total time spent waiting between segments."""
        return float(sum(w for _, w in self.waits))

    def own_time(self, t: float, start: float) -> float:
        """Seconds of the run's own wall time from ``start`` to ``t`` (waits excluded)."""
        return t - start - sum(w for at, w in self.waits if at <= t)


def _restart_interval(t: np.ndarray, start: float) -> int | None:
    """The step interval holding a restart at ``start`` (within the clock tolerance).

    A restart interval spans a whole process start-up, so of the intervals that touch
    ``start +/- CLOCK_TOL_S`` it is the longest; trusting the exact start time instead
    picks a normal step when the clocks differ by a fraction of a second.
    """
    if len(t) < 2:
        return None
    near = np.flatnonzero((t[:-1] <= start + CLOCK_TOL_S) & (t[1:] >= start - CLOCK_TOL_S))
    if near.size == 0:
        return None
    return int(near[np.argmax(np.diff(t)[near])])


def find_restarts(t: np.ndarray, segments: list[dict]) -> Restarts:
    """Restart intervals and queue waits of a run with step times ``t`` (sorted).

    The wait before segment k is its start time minus the previous segment's end time;
    a segment killed without recording its end is taken to end at its last step.
    """
    out = Restarts()
    for k in range(1, len(segments)):
        begin = float(segments[k]["start_time"])
        i = _restart_interval(t, begin)
        if i is not None:
            out.intervals.append(i)
        end = segments[k - 1].get("end_time")
        if end is None:
            before = t[t <= begin + CLOCK_TOL_S]
            if i is not None:
                end = float(t[i])
            elif before.size:
                end = float(before[-1])
            else:
                out.notes.append(f"segment {k - 1} has no end_time and no steps: the time "
                                 f"before segment {k} is counted as run time")
                continue
        out.waits.append((begin, max(0.0, begin - float(end))))
    return out
