"""The exact quantities both implementations share, decided once on the host.

The CPU path (`instances.py`, `semantic.py`: numpy, cc3d, scipy) and the torch path (`gpu.py`: CPU or CUDA
tensors) must give the same segmentation bit for bit. Everything that could round differently on two
devices is therefore fixed here, in Python integers or float32 values, before either path runs:

- thresholds are float32 numbers; both paths compare float32 probabilities with them (`p > t`);
- distances use an integer metric: one voxel step along axis a (z, y, x) is `w_a` units long, with
  `w_a = round(RESOLUTION · v_a / min(v))` for voxel size v (nm), so the unit is `min(v) / RESOLUTION` nm
  and squared distances are exact integers `Σ (w_a Δ_a)²` (anisotropy ratios kept to within 1/64);
- a seed distance s (nm) becomes the integer `T = floor((s / unit)²)`; a voxel is a seed candidate when
  its squared distance to the nearest non-core voxel is `> T`;
- a minimum object size (nm³) becomes a voxel count `ceil(size / (v_z v_y v_x))`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESOLUTION = 32  # distance units per finest voxel edge: anisotropy ratios round to within 1/64
MAX_THRESHOLD_SQ = 2**30 - 1  # squared-distance sums stay below 2**31 (int32 on both paths)


@dataclass(frozen=True)
class DistanceMetric:
    """The integer metric of one voxel size: `weights` units per step along (z, y, x), `unit_nm` nm per unit.

    Example:
        >>> m = DistanceMetric.of((2.62, 2.0, 2.0))
        >>> m.weights, m.threshold_sq(4.0)
        ((42, 32, 32), 4096)
    """

    weights: tuple[int, int, int]
    unit_nm: float

    @classmethod
    def of(cls, voxel_size_nm: Sequence[float]) -> DistanceMetric:
        """The metric of a (z, y, x) voxel size in nm.

        Raises:
            ValueError: not three positive finite sizes.
        """
        vs = [float(v) for v in voxel_size_nm]
        if len(vs) != 3 or not all(math.isfinite(v) and v > 0 for v in vs):
            raise ValueError(f"voxel size must be three positive numbers (z, y, x; nm), got {list(voxel_size_nm)}")
        finest = min(vs)
        weights = tuple(max(1, round(RESOLUTION * v / finest)) for v in vs)
        return cls(weights=weights, unit_nm=finest / RESOLUTION)  # type: ignore[arg-type]

    def threshold_sq(self, distance_nm: float) -> int:
        """`floor((distance / unit)²)`: squared distances above it are farther than `distance_nm`.

        Raises:
            ValueError: a negative distance, or one too long for int32 sums (over ~1000 finest voxels).
        """
        if not distance_nm >= 0:
            raise ValueError(f"seed distance must be ≥ 0 nm, got {distance_nm}")
        t = math.floor((float(distance_nm) / self.unit_nm) ** 2)
        if t > MAX_THRESHOLD_SQ:
            limit = math.sqrt(MAX_THRESHOLD_SQ) * self.unit_nm
            raise ValueError(f"seed distance {distance_nm} nm exceeds the supported {limit:.0f} nm at this voxel size")
        return t

    def windows(self, threshold_sq: int) -> tuple[int, int, int]:
        """Per axis, the largest step count k with `(w k)² ≤ threshold_sq` (how far a pass must look)."""
        root = math.isqrt(threshold_sq)
        return tuple(root // w for w in self.weights)  # type: ignore[return-value]

    @property
    def line_axis(self) -> int:
        """The axis done by the exact line scan (the finest one: it would need the widest window)."""
        return int(np.argmin(self.weights))


def float32_threshold(value: float, *, name: str = "threshold") -> float:
    """`value` rounded to float32 (returned as a Python float, exactly representable in float32).

    Raises:
        ValueError: outside [0, 1].
    """
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return float(np.float32(value))


def min_voxels(min_size_nm3: float, voxel_size_nm: Sequence[float]) -> int:
    """Smallest voxel count of a kept object: `ceil(min_size_nm3 / voxel volume)` (0 keeps everything)."""
    if not min_size_nm3 >= 0:
        raise ValueError(f"minimum size must be ≥ 0 nm³, got {min_size_nm3}")
    volume = float(np.prod([float(v) for v in voxel_size_nm]))
    return math.ceil(float(min_size_nm3) / volume)
