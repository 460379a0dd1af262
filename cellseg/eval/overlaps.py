"""The contingency table of a truth and a (relabelled) prediction volume, computed in one streaming pass.

Both eras' instance matching needs, for every (truth object, predicted object) pair that overlaps,
the number of shared voxels, plus each object's size; the 2025 accuracy also needs how many voxels
each prediction puts on background. One `bincount` over `truth_index · (nP + 1) + pred_id`, slab by
slab, gives all of it without a dense nG×nP matrix or per-object full-volume masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_BINS = 8_000_000  # above this many (truth, pred) bins the table is built from foreground keys instead
SLAB_VOXELS = 16_000_000  # voxels per streaming step


@dataclass(frozen=True, kw_only=True)
class Overlaps:
    """Contingency counts between truth ids and prediction ids `1..num_pred`.

    Attributes:
        truth_ids: sorted unique non-zero truth ids.
        truth_sizes: voxels of each truth id (aligned with `truth_ids`).
        pred_sizes: voxels of prediction ids 1..num_pred (index 0 is id 1).
        rows, cols, inter: overlapping pairs: index into `truth_ids`, prediction id − 1, shared voxels.
        pred_on_background: voxels of each prediction id lying on truth background.
        background_both: voxels that are background in both.
    """

    truth_ids: np.ndarray
    truth_sizes: np.ndarray
    pred_sizes: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    inter: np.ndarray
    pred_on_background: np.ndarray
    background_both: int

    @property
    def num_pred(self) -> int:
        """Number of prediction ids."""
        return int(self.pred_sizes.size)


def _ranks(values: np.ndarray, truth_ids: np.ndarray, contiguous: bool) -> np.ndarray:
    """1-based rank of each truth value among `truth_ids` (0 for background)."""
    if contiguous:
        return values.astype(np.int64)
    ranks = np.searchsorted(truth_ids, values).astype(np.int64) + 1
    ranks[values == 0] = 0
    return ranks


def _pair_counts(truth: np.ndarray, pred: np.ndarray, truth_ids: np.ndarray, num_pred: int
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """(keys, counts) of `rank · (num_pred + 1) + pred` over foreground voxels, and the foreground size."""
    n_t = int(truth_ids.size)
    width = num_pred + 1
    contiguous = n_t == 0 or (int(truth_ids[0]) == 1 and int(truth_ids[-1]) == n_t)
    dense = (n_t + 1) * width <= MAX_BINS
    table = np.zeros((n_t + 1) * width, dtype=np.int64) if dense else None
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    flat_t, flat_p = truth.reshape(-1), pred.reshape(-1)
    n_fg = 0
    for start in range(0, flat_t.size, SLAB_VOXELS):
        t, p = flat_t[start:start + SLAB_VOXELS], flat_p[start:start + SLAB_VOXELS]
        fg = (t != 0) | (p != 0)
        key = _ranks(t[fg], truth_ids, contiguous) * width
        key += p[fg]
        n_fg += key.size
        if table is not None:
            table += np.bincount(key, minlength=table.size)
        else:
            parts.append(np.unique(key, return_counts=True))
    if table is not None:
        keys = np.flatnonzero(table)
        return keys, table[keys], n_fg
    keys, inverse = np.unique(np.concatenate([k for k, _ in parts] or [np.zeros(0, np.int64)]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([c for _, c in parts] or [np.zeros(0)])).astype(np.int64)
    return keys, counts, n_fg


def overlaps(truth: np.ndarray, pred: np.ndarray, num_pred: int, truth_ids: np.ndarray | None = None) -> Overlaps:
    """The contingency table of `truth` (any ids; `truth_ids` = its sorted non-zero ids if known) and `pred`
    (ids 0..num_pred)."""
    if truth_ids is None:
        import fastremap

        truth_ids = fastremap.unique(truth)
        truth_ids = truth_ids[truth_ids != 0]
    n_t, width = int(truth_ids.size), num_pred + 1
    keys, counts, n_fg = _pair_counts(truth, pred, np.asarray(truth_ids), num_pred)
    t, p = keys // width, keys % width
    both, on_bg = (t > 0) & (p > 0), t == 0
    return Overlaps(
        truth_ids=np.asarray(truth_ids),
        truth_sizes=np.bincount(t, weights=counts, minlength=n_t + 1)[1:].astype(np.int64),
        pred_sizes=np.bincount(p, weights=counts, minlength=width)[1:].astype(np.int64),
        rows=t[both] - 1, cols=p[both] - 1, inter=counts[both],
        pred_on_background=np.bincount(p[on_bg], weights=counts[on_bg], minlength=width)[1:].astype(np.int64),
        background_both=int(truth.size - n_fg),
    )


def iou_values(ov: Overlaps) -> np.ndarray:
    """IoU (float64) of every overlapping pair: shared / (truth size + prediction size − shared)."""
    union = ov.truth_sizes[ov.rows] + ov.pred_sizes[ov.cols] - ov.inter
    return ov.inter / union
