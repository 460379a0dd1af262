"""The grid a class of a training crop is scored on: its truth's own, the `s0` level of its label array.

The evaluators score every (crop, label) on the grid of its truth (voxel size, shape, translation of the
label's `s0`), and normalise Hausdorff distances by that voxel size: ‖(2, 2, 2)‖ nm for a 2 nm crop, not
the model's ‖(8, 8, 8)‖. Validation, tuning and weight fitting read the truth on this grid
(`cellseg.eval.truth.read_class_truth`) and bring the probabilities onto it (linear resampling,
`cellseg.postprocess.native` / `cellseg.infer.members.read_on_grid`) so that their decisions are made the way
the leaderboard scores.

A class read as the union of several arrays (a group given by its atoms) takes the finest of their grids.
"""

from __future__ import annotations

import numpy as np

from cellseg.data.grid import Grid
from cellseg.data.targets import CropSource


def annotation_grid(crop: CropSource, class_name: str) -> Grid | None:
    """The `s0` grid of the class's truth in `crop` (z, y, x; nm); None where the crop does not annotate it.

    Raises:
        ValueError: `crop` was opened without `class_name`.
    """
    plans = {p.name: p for p in crop.plans}
    if class_name not in plans:
        raise ValueError(f"{crop.name}: opened for {list(crop.classes)}, not for {class_name!r}")
    grids = []
    for name in plans[class_name].read:
        level = crop.image(name).levels[0]
        grids.append(Grid.of(translation_nm=level.translation_nm, shape_vox=level.shape_vox,
                             voxel_size_nm=level.voxel_size_nm))
    if not grids:
        return None
    return min(grids, key=lambda g: float(np.prod(g.voxel_size_nm)))  # min keeps the first of equals
