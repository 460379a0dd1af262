"""The 2026 current metric: CSC `utils/eval_utils/*` + `utils/matched_crop.py` of 2026.

- Loader: repairs a store zipped inside a folder, bare crop numbers and missing `.zgroup` files, compares
  voxel sizes with `np.allclose`, refuses sources over 16³ times the crop and resamples large ones in
  blocks (`cellseg.eval.resample.align_2026`).
- Semantic, per crop: raw counts TP, FP, FN (`cellseg.eval.semantic.semantic_counts_2026`).
- Instance, per crop: maximum-weight matching, TP/FP/FN and normalised Hausdorff entries
  (`cellseg.eval.instance_2026`).
- Missing label: semantic FN = every voxel; instance FN = the truth ids, with that many Hausdorff entries
  of 0.
- Combining: IoU and F1 of counts pooled over crops (`cellseg.eval.aggregate.combine_2026`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from cellseg.eval.aggregate import combine_2026
from cellseg.eval.eras import CropScores, Scores, ScoringEra
from cellseg.eval.instance_2026 import score_relabelled_2026
from cellseg.eval.resample import Aligned, Target, align_2026
from cellseg.eval.semantic import semantic_counts_2026


class Era2026(ScoringEra):
    """The 2026 rules (module docstring)."""

    name = "2026"
    title = "2026 current metric"
    repairs_layout = True
    copy_length_bug = False
    class_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "instance": ("combined_score", "f1", "normalized_hausdorff_distance", "tp", "fp", "fn"),
        "semantic": ("iou", "tp", "fp", "fn")}
    crop_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "instance": ("tp", "fp", "fn", "n_hausdorff", "hausdorff_norm_sum", "status"),
        "semantic": ("tp", "fp", "fn", "status")}

    def align(self, array: Any, attrs: dict[str, Any], *, instance: bool, target: Target) -> Aligned:
        """The 2026 loader (`align_2026`)."""
        return align_2026(array, attrs, instance=instance, target=target)

    def semantic_from_counts(self, tp: int, fp: int, fn: int) -> Scores:
        """tp, fp, fn, status."""
        return semantic_counts_2026(tp, fp, fn)

    def score_instance(self, pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                       voxel_size_nm: Sequence[float], *, max_bytes: int | None = None) -> Scores:
        """tp, fp, fn, hausdorff_norm_sum, n_hausdorff, status (no memory limit of its own)."""
        return score_relabelled_2026(pred_cc, num_pred, truth, voxel_size_nm)

    def truth_failure(self, truth: np.ndarray) -> str | None:
        """A truth id ≥ the crop's voxel count breaks the official `cc3d.statistics` call."""
        if truth.size and int(np.max(truth)) >= truth.size:
            return "a truth id is ≥ the crop's voxel count; the 2026 evaluator's cc3d.statistics call fails on it"
        return None

    def score_missing(self, *, instance: bool, num_voxels: int,
                      truth: Callable[[], np.ndarray] | None) -> Scores:
        """Semantic: every voxel a false negative; instance: every truth object, each with a Hausdorff entry 0."""
        if not instance:
            return {"tp": 0, "fp": 0, "fn": num_voxels, "status": "missing"}
        import fastremap

        ids = fastremap.unique(truth()) if truth is not None else np.zeros(0)
        count = int(np.count_nonzero(ids))
        return {"tp": 0, "fp": 0, "fn": count, "hausdorff_norm_sum": 0.0, "n_hausdorff": count, "status": "missing"}

    def combine(self, crop_scores: CropScores) -> Scores:
        """Pooled IoU / F1 per class; overall 0 for a kind with no class."""
        return combine_2026(crop_scores)


ERA = Era2026()
