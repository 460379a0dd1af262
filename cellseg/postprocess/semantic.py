"""Semantic classes on the CPU: `probability > threshold` (float32), then optionally hole filling (6-connected
background pockets that do not touch the border) and removal of 26-connected components smaller than
`ceil(min_size_nm3 / voxel volume)` voxels, in that order. `gpu.segment_semantic_torch` is the same on
torch tensors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellseg.postprocess.instances import check_probability
from cellseg.postprocess.morphology import components, fill_holes
from cellseg.postprocess.params import SemanticParams
from cellseg.postprocess.spec import float32_threshold, min_voxels


def segment_semantic(prob: np.ndarray, *, voxel_size_nm: Sequence[float], params: SemanticParams) -> np.ndarray:
    """The class mask (bool, z, y, x)."""
    check_probability(prob)
    mask = prob > np.float32(float32_threshold(params.threshold))
    if params.fill_holes:
        mask = fill_holes(mask)
    smallest = min_voxels(params.min_size_nm3, voxel_size_nm)
    if smallest > 1:
        labels, n = components(mask, 26)
        keep = np.bincount(labels.ravel(), minlength=n + 1) >= smallest
        keep[0] = False
        mask = keep[labels]
    return mask
