"""Detector and image geometry of the MicroBooNE collection plane.

The study's image is the collection plane: 3456 wires at 0.3 cm pitch (columns)
by 3200 time pixels (9600 readout ticks at 2 MHz grouped by 3, rows), zero-padded
to 3600 x 3600.  ``downsample`` bins that image by K in both axes for quick runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Active volume (cm): x is the drift coordinate, z runs along the beam (wire number).
ACTIVE_X_CM = (0.0, 256.0)
ACTIVE_Y_CM = (-116.5, 116.5)
ACTIVE_Z_CM = (0.0, 1037.0)
#: MicroBooNE electron drift velocity at 273 V/cm: 1.098 mm/us, the value Wire-Cell's
#: MicroBooNE configuration uses because it reproduces the maximum drift time measured
#: in data (2.560 m / 1.101 mm/us; wire-cell-toolkit cfg/pgrapher/experiment/uboone/
#: params.jsonnet). The readout window of 4.8 ms is then 2.06 full drift times.
DRIFT_VELOCITY_CM_PER_US = 0.1098


@dataclass(frozen=True, slots=True, kw_only=True)
class Geometry:
    """Image geometry; every derived size follows from these fields.

    Attributes
    ----------
    full_size : padded full-resolution image side (pixels).
    n_wires : collection-plane wires (image columns before padding).
    wire_pitch_cm : wire spacing.
    n_ticks : readout ticks per event (2 MHz, 4.8 ms).
    tick_group : ticks summed into one time pixel.
    tick_us : sampling period.
    drift_length_cm : full drift distance (the readout spans ~2 drift times).
    pretrigger_ticks : ticks recorded before the trigger (t0 of the particle).
    downsample : bin factor K applied in both axes (1 = full resolution).
    """

    full_size: int = 3600
    n_wires: int = 3456
    wire_pitch_cm: float = 0.3
    n_ticks: int = 9600
    tick_group: int = 3
    tick_us: float = 0.5
    drift_length_cm: float = 256.0
    pretrigger_ticks: int = 3200
    downsample: int = 1

    def __post_init__(self) -> None:
        if self.downsample < 1 or self.full_size % self.downsample:
            raise ValueError(
                f"downsample={self.downsample}: must be a positive divisor of {self.full_size}"
            )

    @property
    def n_time_pixels(self) -> int:
        """Time pixels in the readout window at full resolution (3200)."""
        return self.n_ticks // self.tick_group

    @property
    def drift_velocity_cm_per_us(self) -> float:
        """Measured MicroBooNE drift velocity (:data:`DRIFT_VELOCITY_CM_PER_US`)."""
        return DRIFT_VELOCITY_CM_PER_US

    @property
    def time_pixel_cm(self) -> float:
        """Drift distance covered by one full-resolution time pixel."""
        return self.drift_velocity_cm_per_us * self.tick_us * self.tick_group

    @property
    def height(self) -> int:
        """Image rows (time) after downsampling."""
        return self.full_size // self.downsample

    @property
    def width(self) -> int:
        """Image columns (wires) after downsampling."""
        return self.full_size // self.downsample

    @property
    def shape(self) -> tuple[int, int]:
        return (self.height, self.width)

    def to_attrs(self) -> dict[str, float | int]:
        """Flat dict for HDF5 attributes / JSON."""
        d = dataclasses.asdict(self)
        d["height"], d["width"] = self.shape
        return d

    def wire_of(self, z_cm):
        """Fractional full-resolution wire coordinate of position z."""
        return z_cm / self.wire_pitch_cm

    def time_pixel_of(self, x_cm):
        """Fractional full-resolution time pixel of a charge at drift distance x."""
        return self.pretrigger_ticks / self.tick_group + x_cm / self.time_pixel_cm


def pooled_size(size: int, kernel: int, padding: int = 0, stride: int | None = None) -> int:
    """Output size of a conv/pool with floor mode (PyTorch's convention)."""
    stride = stride or kernel
    return math.floor((size + 2 * padding - kernel) / stride) + 1
