"""2025 challenge-era instance scoring of one crop (official `evaluate.score_instance`, 2025-04 to 2025-11).

1. Relabel the prediction by 26-connected components (`skimage.measure.label(connectivity=3)`; `cc3d`
   numbers components in the same raster order, which matters for ties below).
2. With nG truth ids and nP components, nP/nG > 50 scores 0 everywhere (Hausdorff inf).
3. Hungarian matching, `linear_sum_assignment(maximize=True)` on the full nG×nP IoU matrix (rows in
   sorted truth-id order, columns in component order, 0 where objects do not overlap): min(nG, nP)
   pairs are assigned, **including pairs that do not overlap** (quirk). Assigned predictions take their
   truth id; all others are erased.
4. `accuracy` = fraction of all voxels (background included) whose truth id equals the re-painted id.
5. Per truth id: the symmetric Hausdorff distance (nm) to its assigned prediction, inf when it has none;
   `hausdorff_distance` = their mean (0 when nP = 0 or nG = 0).
6. `normalized_hausdorff_distance = 1.01^(−mean / ‖vs‖)`, `combined_score = sqrt(accuracy · normalized)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellseg.eval.distance import Boxes, pair_hausdorff
from cellseg.eval.overlaps import Overlaps, iou_values, overlaps
from cellseg.eval.rules import RATIO_CUTOFF_2025, geometric_mean, normalized_distance_2025


class MatrixTooLarge(ValueError):
    """The 2025 dense IoU matrix would not fit the memory budget."""


def _zero_scores() -> dict[str, float]:
    return {"accuracy": 0, "hausdorff_distance": np.inf, "normalized_hausdorff_distance": 0, "combined_score": 0}


def hungarian_2025(ov: Overlaps, *, max_matrix_bytes: int | None = None) -> list[tuple[int, int]]:
    """The official assignment: (truth index, prediction id − 1) pairs, zero-overlap pairs included."""
    from scipy.optimize import linear_sum_assignment

    n_t, n_p = ov.truth_ids.size, ov.num_pred
    if max_matrix_bytes is not None and n_t * n_p * 8 > max_matrix_bytes:
        raise MatrixTooLarge(f"the 2025 IoU matrix of {n_t}×{n_p} objects needs {n_t * n_p * 8 / 2**30:.1f} GiB")
    matrix = np.zeros((n_t, n_p), dtype=np.float64)
    matrix[ov.rows, ov.cols] = iou_values(ov)
    rows, cols = linear_sum_assignment(matrix, maximize=True)
    return list(zip(rows.tolist(), cols.tolist(), strict=True))


def _accuracy(ov: Overlaps, pairs: list[tuple[int, int]], num_voxels: int) -> float:
    """Voxels where truth id == re-painted id: background kept as background plus each pair's overlap."""
    shared = {(r, c): n for r, c, n in zip(ov.rows.tolist(), ov.cols.tolist(), ov.inter.tolist(), strict=True)}
    matched_cols = [c for _, c in pairs]
    agree = ov.background_both + int(ov.pred_on_background.sum() - ov.pred_on_background[matched_cols].sum())
    agree += sum(shared.get(pair, 0) for pair in pairs)
    return float(np.float64(agree) / np.float64(num_voxels))


def _hausdorff_2025(truth: np.ndarray, pred_cc: np.ndarray, ov: Overlaps, pairs: list[tuple[int, int]],
                    voxel_size_nm: Sequence[float], truth_boxes: Boxes) -> np.ndarray:
    """One distance per truth id in sorted order: to its assigned component, or inf."""
    distances = np.full(ov.truth_ids.size, np.inf, dtype=np.float64)
    if not pairs:
        return distances
    pred_boxes = Boxes.of(pred_cc)
    for row, col in pairs:
        tid = int(ov.truth_ids[row])
        distances[row] = pair_hausdorff(truth, pred_cc, truth_boxes.slices[tid], pred_boxes.slices[col + 1], tid,
                                        (col + 1,), voxel_size_nm, formula="kd")
    return distances


def score_relabelled_2025(pred_cc: np.ndarray, num_pred: int, truth: np.ndarray, voxel_size_nm: Sequence[float], *,
                          max_matrix_bytes: int | None = None) -> dict[str, float]:
    """Per-crop 2025 instance scores of a prediction already relabelled by `relabel_26` (steps 2-6).

    Raises:
        MatrixTooLarge: the dense IoU matrix exceeds `max_matrix_bytes`.
    """
    truth_boxes = Boxes.of(truth)
    ov = overlaps(truth, pred_cc, num_pred, truth_boxes.ids)
    n_truth = int(ov.truth_ids.size)
    if n_truth > 0 and num_pred / n_truth > RATIO_CUTOFF_2025:
        return _zero_scores()
    pairs = hungarian_2025(ov, max_matrix_bytes=max_matrix_bytes) if num_pred > 0 else []
    accuracy = _accuracy(ov, pairs, truth.size)
    if num_pred > 0 and n_truth > 0:
        hausdorff = np.mean(_hausdorff_2025(truth, pred_cc, ov, pairs, voxel_size_nm, truth_boxes))
    else:
        hausdorff = 0
    normalized = normalized_distance_2025(hausdorff, voxel_size_nm)
    return {
        "accuracy": accuracy,
        "hausdorff_distance": hausdorff,
        "normalized_hausdorff_distance": normalized,
        "combined_score": geometric_mean(accuracy, normalized),
    }
