"""Semantic scoring of one crop: both eras binarise prediction and truth with `> 0`.

- 2025 returns `iou` (sklearn `jaccard_score(zero_division=1)`: 1.0 when both are empty) and
  `dice_score` (`1 −` scipy's Dice dissimilarity, 1.0 when both are empty); only IoU is aggregated.
- 2026 returns raw voxel counts `tp`, `fp`, `fn`; IoU is computed from counts pooled over crops.

Counts are taken with `count_nonzero` on boolean views; the ratios are computed with the same integer
operands as the official calls, so the floating-point results are identical.
"""

from __future__ import annotations

import numpy as np

SLAB_VOXELS = 32_000_000


def confusion(pred: np.ndarray, truth: np.ndarray) -> tuple[int, int, int]:
    """(tp, fp, fn) voxel counts of `pred > 0` against `truth > 0`, streamed in slabs."""
    flat_p, flat_t = pred.reshape(-1), truth.reshape(-1)
    tp = n_pred = n_truth = 0
    for start in range(0, flat_p.size, SLAB_VOXELS):
        p = flat_p[start:start + SLAB_VOXELS] > 0
        t = flat_t[start:start + SLAB_VOXELS] > 0
        n_pred += int(np.count_nonzero(p))
        n_truth += int(np.count_nonzero(t))
        p &= t
        tp += int(np.count_nonzero(p))
    return tp, n_pred - tp, n_truth - tp


def semantic_counts_2025(tp: int, fp: int, fn: int) -> dict[str, float]:
    """Per-crop 2025 semantic scores from confusion counts: iou, dice_score."""
    if tp + fp + fn == 0:
        return {"iou": 1, "dice_score": 1}
    iou = float(np.float64(tp) / np.float64(tp + fp + fn))
    dice = 1 - float((fn + fp) / np.array(2.0 * tp + fn + fp))
    return {"iou": iou, "dice_score": dice}


def semantic_counts_2026(tp: int, fp: int, fn: int) -> dict[str, int | str]:
    """Per-crop 2026 semantic counts: tp, fp, fn, status."""
    return {"tp": tp, "fp": fp, "fn": fn, "status": "scored"}
