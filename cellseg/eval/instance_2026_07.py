"""Instance scoring of one crop under the "2026-07" era: the 2026 rules with the two changes the official
evaluator merged after `6b9ad68`, as their published descriptions state them. A reconstruction: the official
code of these changes is not available, and nothing here is verified against it (docs/scoring.md, "The
2026-07 era").

Kept from `instance_2026` (verified there): 26-connected relabelling, the object-count cutoff and the
overlapping-pair limit (a skipped crop adds nothing), the matching and tp/fp/fn, one Hausdorff entry per truth
id and one per unmatched component, the cap of half the smallest physical side of the crop, float32 distances.

Changed (each rule as docs/scoring.md words it):

1. **Unmatched predictions are background before the Hausdorff distance** (official change approved
   2026-07-10): matched components take their truth id and every other component is set to 0, so a truth
   object is compared with its matched component alone. The 2026 quirk, where an unmatched component numbered
   like a truth id is compared with that object, is gone. The matching itself, hence tp/fp/fn, is unchanged.
2. **An unmatched instance scores 0** (official change of 2026-07-02): a truth object without a match and each
   unmatched component get an infinite distance, normalised to 0 (2026: the cap, e.g. 0.871 on a 48³ crop of
   8 nm).
3. **The normalisation floors the worst real match at 0.1** (same change): a matched distance `d` (at most the
   cap) scores `0.1^(d / cap)`, 1 at 0 and 0.1 at the cap on every crop, whatever its size and voxel size
   (2026: `1.01^(−d/‖vs‖)`). The description fixes these two values; `0.1^(d / cap)` is the one exponential
   decay (2026's form) that meets both, and it sends an infinite distance to 0 by itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellseg.eval.distance import Boxes, pair_hausdorff
from cellseg.eval.instance_2026 import crop_counts, matched_2026, skipped
from cellseg.eval.overlaps import Overlaps
from cellseg.eval.rules import max_distance_2026

# The normalised Hausdorff score of a real match at the cap (rule 3), the same on every crop.
WORST_MATCH_SCORE = 0.1


def normalized_distances_2026_07(distances_nm: np.ndarray, cap_nm: float) -> np.ndarray:
    """Rule 3: `0.1^(d / cap)` of each finite distance (nm), 0 for an infinite one (an unmatched instance).

    A finite distance is at most the cap; float32 rounding may put a capped one a hair above it, which
    still scores 0.1.

    Example:
        >>> normalized_distances_2026_07(np.array([0.0, 96.0, 192.0, np.inf]), 192.0).round(4).tolist()
        [1.0, 0.3162, 0.1, 0.0]
    """
    d = np.asarray(distances_nm, dtype=np.float64)
    finite = np.isfinite(d)
    ratio = np.minimum(np.where(finite, d, 0.0) / cap_nm, 1.0)
    return np.where(finite, WORST_MATCH_SCORE**ratio, 0.0)


def hausdorff_2026_07(truth: np.ndarray, pred_cc: np.ndarray, ov: Overlaps, mapping: dict[int, int],
                      voxel_size_nm: Sequence[float], truth_boxes: Boxes) -> np.ndarray:
    """float32 distances (nm): one per truth id (sorted), between the object and its matched component alone
    (rule 1; capped) or inf without a match (rule 2), then inf once per unmatched component."""
    cap = max_distance_2026(voxel_size_nm, truth.shape)
    component_of = {tid: comp for comp, tid in mapping.items()}  # the matching is one-to-one
    distances = np.full(ov.truth_ids.size + ov.num_pred - len(mapping), np.inf, dtype=np.float32)
    if component_of:
        pred_boxes = Boxes.of(pred_cc)
        for i, tid in enumerate(ov.truth_ids.tolist()):
            comp = component_of.get(tid)
            if comp is not None:
                distances[i] = pair_hausdorff(truth, pred_cc, truth_boxes.slices[tid], pred_boxes.slices[comp], tid,
                                              (comp,), voxel_size_nm, formula="edt", cap_nm=cap)
    return distances


def score_relabelled_2026_07(pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                             voxel_size_nm: Sequence[float]) -> dict[str, float | int | str]:
    """Per-crop "2026-07" instance scores of a prediction already relabelled by `relabel_26`: tp, fp, fn,
    hausdorff_norm_sum, n_hausdorff, status (the 2026 keys)."""
    truth_boxes, ov, mapping = matched_2026(pred_cc, num_pred, truth)
    if isinstance(mapping, str):
        return skipped(mapping)
    distances = hausdorff_2026_07(truth, pred_cc, ov, mapping, voxel_size_nm, truth_boxes)
    cap = max_distance_2026(voxel_size_nm, truth.shape)
    return crop_counts(ov, mapping, normalized_distances_2026_07(distances, cap))

