"""Per-crop scores of one (prediction, truth) pair in each era, in the form of the official evaluators'
per-crop functions: the library's scorers, an instance prediction first relabelled into its 26-connected
components as `cellseg.eval.crop_score` does."""

from collections.abc import Sequence

import numpy as np

from cellseg.eval.instance_2025 import score_relabelled_2025
from cellseg.eval.instance_2026 import score_relabelled_2026
from cellseg.eval.instance_2026_07 import score_relabelled_2026_07
from cellseg.eval.relabel import relabel_26
from cellseg.eval.semantic import confusion, semantic_counts_2025, semantic_counts_2026


def score_semantic_2025(pred: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """2025 semantic scores of a (prediction, truth) pair: iou, dice_score."""
    return semantic_counts_2025(*confusion(pred, truth))


def score_semantic_2026(pred: np.ndarray, truth: np.ndarray) -> dict[str, int | str]:
    """2026 semantic counts of a (prediction, truth) pair: tp, fp, fn, status."""
    return semantic_counts_2026(*confusion(pred, truth))


def score_instance_2025(pred: np.ndarray, truth: np.ndarray, voxel_size_nm: Sequence[float], *,
                        max_matrix_bytes: int | None = None) -> dict[str, float]:
    """2025 instance scores: accuracy, hausdorff_distance, normalized_hausdorff_distance, combined_score."""
    pred_cc, num_pred = relabel_26(pred)
    return score_relabelled_2025(pred_cc, num_pred, truth, voxel_size_nm, max_matrix_bytes=max_matrix_bytes)


def score_instance_2026(pred: np.ndarray, truth: np.ndarray, voxel_size_nm: Sequence[float]
                        ) -> dict[str, float | int | str]:
    """2026 instance counts: tp, fp, fn, hausdorff_norm_sum, n_hausdorff, status."""
    pred_cc, num_pred = relabel_26(pred)
    return score_relabelled_2026(pred_cc, num_pred, truth, voxel_size_nm)


def score_instance_2026_07(pred: np.ndarray, truth: np.ndarray, voxel_size_nm: Sequence[float]
                           ) -> dict[str, float | int | str]:
    """"2026-07" instance counts (reconstructed rules): the 2026 keys with the July 2026 Hausdorff entries."""
    pred_cc, num_pred = relabel_26(pred)
    return score_relabelled_2026_07(pred_cc, num_pred, truth, voxel_size_nm)
