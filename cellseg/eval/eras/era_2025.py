"""The 2025 challenge-era metric: CSC `evaluate.py` as it stood 2025-04 to 2025-11.

- Loader: reads crop folders at the archive's root only (no repairs), compares voxel sizes exactly, fails on
  bool masks that need resampling, and drops the tail of a prediction that starts inside the crop
  (`cellseg.eval.resample.align_2025`).
- Semantic, per crop: IoU and Dice, 1 when both are empty (`cellseg.eval.semantic.semantic_counts_2025`).
- Instance, per crop: Hungarian matching, accuracy over all voxels, mean Hausdorff distance
  (`cellseg.eval.instance_2025`).
- Missing label: every metric 0, weighted in.
- Combining: means over crops weighted by physical volume (`cellseg.eval.aggregate.combine_2025`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from cellseg.eval.aggregate import combine_2025
from cellseg.eval.eras import CropScores, Scores, ScoringEra
from cellseg.eval.instance_2025 import score_relabelled_2025
from cellseg.eval.resample import Aligned, Target, align_2025
from cellseg.eval.semantic import semantic_counts_2025

INSTANCE_KEYS = ("combined_score", "accuracy", "normalized_hausdorff_distance", "hausdorff_distance")


class Era2025(ScoringEra):
    """The 2025 rules (module docstring)."""

    name = "2025"
    title = "2025 challenge-era metric"
    repairs_layout = False
    copy_length_bug = True
    test_manifest = "2025"  # the 420-row manifest the challenge was scored on (`cellseg.data.crops.TEST_MANIFESTS`)
    class_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {"instance": INSTANCE_KEYS,
                                                              "semantic": ("iou", "dice_score")}
    crop_columns = class_columns

    def align(self, array: Any, attrs: dict[str, Any], *, instance: bool, target: Target) -> Aligned:
        """The 2025 loader (`align_2025`)."""
        return align_2025(array, attrs, instance=instance, target=target)

    def semantic_from_counts(self, tp: int, fp: int, fn: int) -> Scores:
        """iou, dice_score."""
        return semantic_counts_2025(tp, fp, fn)

    def score_instance(self, pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                       voxel_size_nm: Sequence[float], *, max_bytes: int | None = None) -> Scores:
        """accuracy, hausdorff_distance, normalized_hausdorff_distance, combined_score."""
        return score_relabelled_2025(pred_cc, num_pred, truth, voxel_size_nm, max_matrix_bytes=max_bytes)

    def score_missing(self, *, instance: bool, num_voxels: int,
                      truth: Callable[[], np.ndarray] | None) -> Scores:
        """Every metric 0 (the truth is not needed)."""
        if instance:
            return {"accuracy": 0, "hausdorff_distance": 0, "normalized_hausdorff_distance": 0, "combined_score": 0}
        return {"iou": 0, "dice_score": 0}

    def combine(self, crop_scores: CropScores) -> Scores:
        """Volume-weighted means per class; overall NaN when a kind has no class."""
        return combine_2025(crop_scores)


ERA = Era2025()
