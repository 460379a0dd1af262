"""2026-era instance scoring of one crop (official `eval_utils.scoring.score_instance` at `6b9ad68`).

1. Relabel the prediction with `cc3d.connected_components` (26-connected): nP components.
2. nG is the **largest truth id** (not the number of ids; missing ids are phantom nodes). nG = 0 or
   nP = 0 means no matching; otherwise nP/nG > 10 + 50·exp(−nG/5) skips the crop (it contributes
   nothing, status `skipped_too_many_instances`), as do more than 5,000,000 overlapping pairs.
3. Matching: the official min-cost flow over overlapping pairs, IoU rounded to float32, with OR-Tools on the
   official network (`matching.flow_matching`: its ties fall as the official evaluator's do); a solver that
   reports no optimum skips the crop (status `matching_failed`).
4. Matched components take their truth id; **unmatched components keep their component number**, so an
   unmatched component numbered like a truth object is compared with it below (quirk of the official
   re-mapping with `preserve_missing_labels`).
5. One Hausdorff distance per truth id (sorted): between `truth == t` and `prediction == t` after step 4,
   capped at half the smallest physical side of the crop, and the cap when nothing carries id t; then
   one cap entry per unmatched component. Distances are stored as float32, normalised as
   `1.01^(−d/‖vs‖)` and emitted as `hausdorff_norm_sum` and `n_hausdorff`.
6. tp = matches, fp = nP − matched components, fn = (number of truth ids) − tp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellseg.eval.distance import Boxes, pair_hausdorff
from cellseg.eval.matching import flow_matching
from cellseg.eval.overlaps import Overlaps, iou_values, overlaps
from cellseg.eval.rules import (
    MAX_OVERLAP_EDGES_2026,
    max_distance_2026,
    normalized_distances_2026,
    ratio_cutoff_2026,
)


def skipped(status: str) -> dict[str, float | int | str]:
    """A crop that contributes nothing to the class pools."""
    return {"tp": 0, "fp": 0, "fn": 0, "hausdorff_norm_sum": 0.0, "n_hausdorff": 0, "status": status}


def match_2026(ov: Overlaps) -> dict[int, int] | str:
    """The official mapping prediction id → truth id, or the skip status."""
    max_truth_id = int(ov.truth_ids[-1]) if ov.truth_ids.size else 0
    if max_truth_id <= 0 or ov.num_pred == 0:
        return {}
    if ov.num_pred / max_truth_id > ratio_cutoff_2026(max_truth_id):
        return "skipped_too_many_instances"
    if ov.rows.size > MAX_OVERLAP_EDGES_2026:
        return "skipped_too_many_instances"
    iou32 = iou_values(ov).astype(np.float32)
    mapping = flow_matching(max_truth_id, ov.num_pred, ov.truth_ids[ov.rows], ov.cols + 1, iou32)
    return "matching_failed" if mapping is None else mapping


def _object_parts(mapping: dict[int, int], truth_ids: np.ndarray, num_pred: int) -> dict[int, tuple[int, ...]]:
    """Truth id → the components that carry that id after the official re-mapping (step 4)."""
    parts: dict[int, list[int]] = {int(t): [] for t in truth_ids}
    for comp, tid in mapping.items():
        parts[tid].append(comp)
    for tid in parts:
        if 1 <= tid <= num_pred and tid not in mapping:
            parts[tid].append(tid)  # an unmatched component keeps its number, which is this truth id
    return {tid: tuple(sorted(c)) for tid, c in parts.items()}


def _merge(boxes: Sequence[tuple[slice, ...]]) -> tuple[slice, ...]:
    return tuple(slice(min(b[k].start for b in boxes), max(b[k].stop for b in boxes)) for k in range(3))


def hausdorff_2026(truth: np.ndarray, pred_cc: np.ndarray, ov: Overlaps, mapping: dict[int, int],
                   voxel_size_nm: Sequence[float], truth_boxes: Boxes) -> np.ndarray:
    """float32 distances: one per truth id (sorted), then the cap once per unmatched component."""
    cap = max_distance_2026(voxel_size_nm, truth.shape)
    parts = _object_parts(mapping, ov.truth_ids, ov.num_pred)
    distances = np.full(ov.truth_ids.size + ov.num_pred - len(mapping), cap, dtype=np.float32)
    if any(parts.values()):
        pred_boxes = Boxes.of(pred_cc)
        for i, tid in enumerate(ov.truth_ids.tolist()):
            if parts[tid]:
                box = _merge([pred_boxes.slices[c] for c in parts[tid]])
                distances[i] = pair_hausdorff(truth, pred_cc, truth_boxes.slices[tid], box, tid, parts[tid],
                                              voxel_size_nm, formula="edt", cap_nm=cap)
    return distances


def matched_2026(pred_cc: np.ndarray, num_pred: int, truth: np.ndarray
                 ) -> tuple[Boxes, Overlaps, dict[int, int] | str]:
    """The truth's boxes, the contingency table and `match_2026`'s mapping (or skip status) of one crop."""
    truth_boxes = Boxes.of(truth)
    ov = overlaps(truth, pred_cc, num_pred, truth_boxes.ids)
    return truth_boxes, ov, match_2026(ov)


def crop_counts(ov: Overlaps, mapping: dict[int, int], norm: np.ndarray) -> dict[str, float | int | str]:
    """The per-crop scores of a matched crop (step 6) with its normalised Hausdorff entries `norm`."""
    tp = len(set(mapping.values()))
    return {
        "tp": tp,
        "fp": ov.num_pred - len(mapping),
        "fn": int(ov.truth_ids.size) - tp,
        "hausdorff_norm_sum": float(np.sum(norm)),
        "n_hausdorff": int(np.size(norm)),
        "status": "scored",
    }


def score_relabelled_2026(pred_cc: np.ndarray, num_pred: int, truth: np.ndarray, voxel_size_nm: Sequence[float]
                          ) -> dict[str, float | int | str]:
    """Per-crop 2026 instance counts of a prediction already relabelled by `relabel_26` (steps 2-6)."""
    truth_boxes, ov, mapping = matched_2026(pred_cc, num_pred, truth)
    if isinstance(mapping, str):
        return skipped(mapping)
    distances = hausdorff_2026(truth, pred_cc, ov, mapping, voxel_size_nm, truth_boxes)
    return crop_counts(ov, mapping, normalized_distances_2026(distances, voxel_size_nm))

