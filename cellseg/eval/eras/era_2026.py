"""The 2026 metric (official code at 6b9ad68): CSC `utils/eval_utils/*` + `utils/matched_crop.py` of 2026.

- Loader: repairs a store zipped inside a folder, bare crop numbers and missing `.zgroup` files, compares
  voxel sizes with `np.allclose`, refuses sources over 16³ times the crop and resamples large ones in
  blocks (`cellseg.eval.resample.align_2026`).
- Semantic, per crop: raw counts TP, FP, FN (`cellseg.eval.semantic.semantic_counts_2026`).
- Instance, per crop: maximum-weight matching, TP/FP/FN and normalised Hausdorff entries
  (`cellseg.eval.instance_2026`).
- Missing label: semantic FN = every voxel; instance FN = the truth ids, with that many Hausdorff entries
  of 0.
- Combining: IoU and F1 of counts pooled over crops (`cellseg.eval.aggregate.combine_2026`). An instance
  crop over the object-count cutoff is skipped (it adds nothing); its scores also carry the number of truth
  and predicted objects (`num_truth_objects`, `num_pred_objects`, not official keys), so that a decision can
  count it as its worst case: tp 0, every predicted object a false positive, every truth object a false
  negative with a Hausdorff entry of 0 (as a missing label).
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
    title = "2026 metric (official code at 6b9ad68)"
    repairs_layout = True
    copy_length_bug = False
    class_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "instance": ("combined_score", "f1", "normalized_hausdorff_distance", "tp", "fp", "fn"),
        "semantic": ("iou", "tp", "fp", "fn")}
    crop_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "instance": ("tp", "fp", "fn", "n_hausdorff", "hausdorff_norm_sum", "status"),
        "semantic": ("tp", "fp", "fn", "status")}
    skip_statuses = frozenset({"skipped_too_many_instances", "matching_failed"})

    def align(self, array: Any, attrs: dict[str, Any], *, instance: bool, target: Target) -> Aligned:
        """The 2026 loader (`align_2026`)."""
        return align_2026(array, attrs, instance=instance, target=target)

    def semantic_from_counts(self, tp: int, fp: int, fn: int) -> Scores:
        """tp, fp, fn, status."""
        return semantic_counts_2026(tp, fp, fn)

    def score_instance(self, pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                       voxel_size_nm: Sequence[float], *, max_bytes: int | None = None) -> Scores:
        """tp, fp, fn, hausdorff_norm_sum, n_hausdorff, status (no memory limit of its own); a skipped crop
        also records its numbers of truth and predicted objects (module docstring)."""
        scores = self.score_components(pred_cc, num_pred, truth, voxel_size_nm)
        if self.is_skipped(scores):
            scores.update(num_truth_objects=_num_objects(truth), num_pred_objects=int(num_pred))
        return scores

    def score_components(self, pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                         voxel_size_nm: Sequence[float]) -> Scores:
        """The per-crop scores of `score_instance` before a skipped crop's object counts are added (the 2026
        instance scorer; an era that changes only how a matched crop is scored overrides this)."""
        return score_relabelled_2026(pred_cc, num_pred, truth, voxel_size_nm)

    def worst_case(self, scores: Mapping[str, Any]) -> Scores:
        """A skipped crop as a decision counts it (module docstring); `num_voxels`/`voxel_size` are kept.

        Raises:
            ValueError: scores without the object counts (not made by `score_instance`).
        """
        if "num_truth_objects" not in scores:
            raise ValueError(f"skipped crop scores {dict(scores)} lack num_truth_objects: score them with "
                             "cellseg.eval.crop_score.score_class to count them in a decision")
        truth, pred = int(scores["num_truth_objects"]), int(scores.get("num_pred_objects", 0))
        extra = {k: scores[k] for k in ("num_voxels", "voxel_size", "is_missing") if k in scores}
        return {"tp": 0, "fp": pred, "fn": truth, "hausdorff_norm_sum": 0.0, "n_hausdorff": truth,
                "status": "skipped_counted_as_worst", **extra}

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
        count = _num_objects(truth()) if truth is not None else 0
        return {"tp": 0, "fp": 0, "fn": count, "hausdorff_norm_sum": 0.0, "n_hausdorff": count, "status": "missing"}

    def combine(self, crop_scores: CropScores) -> Scores:
        """Pooled IoU / F1 per class; overall 0 for a kind with no class."""
        return combine_2026(crop_scores)


def _num_objects(truth: np.ndarray) -> int:
    """Distinct non-zero ids of a truth array."""
    import fastremap

    return int(np.count_nonzero(fastremap.unique(truth)))


ERA = Era2026()
