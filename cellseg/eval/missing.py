"""What a label missing from a submission costs under each era, from the test crops alone (no truth needed).

For one (crop, label) of the test manifest that a submission lacks:

- 2025: the pair scores 0 in every metric and enters the class's mean with its weight, the crop's physical
  volume (nm³). If the crop holds a share `s` of the class's weight over the test crops, the class scores at
  most `1 − s`. An empty array scores what an empty prediction does: IoU 1 where the crop has none of the
  class (else 0, as when missing); for an instance label `sqrt(background fraction)` (no object predicted,
  so the Hausdorff distance is 0), near 1 for sparse objects.
- 2026, semantic: every voxel of the crop counts as a false negative in the class's pooled IoU, so the class
  IoU is at most `1 − s` (`s`: the crop's share of the class's voxels over the test crops) whatever the
  other crops score. An empty array adds only the crop's true foreground voxels.
- 2026, instance: every truth object of the crop counts as missed, each with a normalised Hausdorff entry
  of 0. An empty array misses them too, but each entry is `1.01^(−cap/‖vs‖)` (`cap`: half the crop's
  smallest physical side), e.g. 0.871 for a 48³ crop of 8 nm voxels.

How far the class score actually falls depends on the truth (how much of the class this crop and the others
hold); `cellseg evaluate` against the truth gives the number (docs/scoring.md, "Missing and empty labels").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cellseg.data.crops import Crop, Geometry
from cellseg.eval.rules import is_scored_as_instance, max_distance_2026, normalized_distances_2026


@dataclass(frozen=True)
class MissingCost:
    """What leaving one (crop, label) out of a submission costs, per era (module docstring).

    Attributes:
        label: the class.
        num_voxels: the crop's voxels on the label's grid.
        volume_share: the crop's share of the class's physical volume (nm³) over the test crops, i.e. the
            2025 weight of the pair in the class's mean.
        voxel_share: the crop's share of the class's voxels over the test crops (2026 semantic pooling).
        empty_hausdorff: the 2026 normalised Hausdorff entry of a truth object that an empty array misses.
    """

    label: str
    num_voxels: int
    volume_share: float
    voxel_share: float
    empty_hausdorff: float

    @property
    def instance(self) -> bool:
        """True when the label is scored by the instance branch."""
        return is_scored_as_instance(self.label)

    def describe(self) -> str:
        """The cost in both eras, in one sentence per era."""
        label = self.label
        old = (f"2025: scores 0 on a crop holding {_percent(self.volume_share)} of {label}'s volume weight (nm³), "
               f"so {label} scores at most {1 - self.volume_share:.3f}")
        if self.instance:
            old += " (an empty array scores sqrt(background fraction) there, near 1 for sparse objects)"
            new = (f"2026: every true {label} object of the crop is missed with a Hausdorff entry of 0 (how many "
                   f"depends on the truth); an empty array misses them with entries of {self.empty_hausdorff:.3f}")
        else:
            old += f" (an empty array scores 1 there if the crop has no {label}, else 0 too)"
            new = (f"2026: all {self.num_voxels:,} voxels of the crop become false negatives of {label} "
                   f"({_percent(self.voxel_share)} of its voxels over the test crops: its pooled IoU is at most "
                   f"{1 - self.voxel_share:.3f}); an empty array adds only the crop's true {label} voxels (how "
                   "many depends on the truth)")
        return f"{old}; {new}"


def _percent(share: float) -> str:
    return "<0.1%" if 0 < share < 1e-3 else f"{share:.1%}"


def _volume_nm3(geometry: Geometry) -> float:
    return math.prod(geometry.voxel_size_nm) * geometry.num_voxels


def missing_costs(crops: Mapping[int, Crop]) -> dict[str, MissingCost]:
    """The cost of leaving out each (crop, label) of `crops` (the test crops a submission is scored on),
    keyed `crop<N>/<label>`."""
    volume: defaultdict[str, float] = defaultdict(float)
    voxels: defaultdict[str, int] = defaultdict(int)
    for crop in crops.values():
        for label, geometry in crop.labels.items():
            volume[label] += _volume_nm3(geometry)
            voxels[label] += geometry.num_voxels
    costs = {}
    for crop in crops.values():
        for label, g in crop.labels.items():
            cap_nm = max_distance_2026(g.voxel_size_nm, g.shape_vox)  # float32, as the distances are
            costs[f"{crop.name}/{label}"] = MissingCost(
                label=label, num_voxels=g.num_voxels, volume_share=_volume_nm3(g) / volume[label],
                voxel_share=g.num_voxels / voxels[label],
                empty_hausdorff=float(normalized_distances_2026(np.float32([cap_nm]), g.voxel_size_nm)[0]))
    return costs
