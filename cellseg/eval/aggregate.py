"""From per-crop scores to per-class and overall scores, in each era's way (`ScoringEra.combine`).

2025 (official `combine_scores`, challenge era): per class, the mean of the per-crop values weighted by
the crop's physical volume `prod(voxel_size) · num_voxels` (nm³), missing crops included with 0; the
class `combined_score` is that weighted mean of the per-crop combined scores (not recomputed). Overall:
plain means over classes of `combined_score` (instance) and `iou` (semantic); with no class of a kind the
official `np.mean([])` gives NaN, and so the overall score is NaN (docs/scoring.md quirk 14, reported as null).

2026 (official `combine_scores`, current): per class, pooled counts: semantic `IoU = ΣTP/(ΣTP+ΣFP+ΣFN)`
(1.0 when the denominator is 0); instance `F1 = 2ΣTP/(2ΣTP+ΣFP+ΣFN)`, normalised Hausdorff = the mean
over every pooled instance entry, `combined = sqrt(F1 · Hausdorff)`, and 1.0 for everything when the
class has nothing anywhere. Overall: plain means over classes (0 for a kind with no class).

Both: `overall_score = sqrt(instance · semantic)`. Sums run over crops and classes in sorted order; the
official order depends on which worker finishes first, so only the last bit of a sum can differ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from cellseg.eval.rules import geometric_mean, is_scored_as_instance

CropScores = Mapping[str, Mapping[str, Mapping[str, Any]]]  # crop -> label -> per-crop metrics
KEYS_2025 = {"instance": ("accuracy", "hausdorff_distance", "normalized_hausdorff_distance", "combined_score"),
             "semantic": ("iou", "dice_score")}


def _labels(crop_scores: CropScores) -> list[str]:
    return sorted({label for labels in crop_scores.values() for label in labels})


def _mean_or_nan(values: list[float]) -> float:
    return float(np.mean(np.asarray(values, dtype=np.float64))) if values else float("nan")


def combine_2025(crop_scores: CropScores) -> dict[str, Any]:
    """Class and overall scores of the 2025 era from per-crop scores (see module docstring)."""
    label_scores: dict[str, dict[str, float]] = {}
    for label in _labels(crop_scores):
        keys = KEYS_2025["instance" if is_scored_as_instance(label) else "semantic"]
        sums = dict.fromkeys(keys, 0.0)
        total = 0.0
        for crop in sorted(crop_scores):
            score = crop_scores[crop].get(label)
            if score is None:
                continue
            volume = math.prod(score["voxel_size"]) * score["num_voxels"]  # as np.prod: a*b*c in order, 10x faster
            for key in keys:
                sums[key] += score[key] * volume
            total += volume
        label_scores[label] = {key: sums[key] / total for key in keys}
    instance = [s["combined_score"] for k, s in label_scores.items() if is_scored_as_instance(k)]
    semantic = [s["iou"] for k, s in label_scores.items() if not is_scored_as_instance(k)]
    overall_instance, overall_semantic = _mean_or_nan(instance), _mean_or_nan(semantic)
    return {
        "label_scores": label_scores,
        "overall_instance_score": overall_instance,
        "overall_semantic_score": overall_semantic,
        "overall_score": geometric_mean(overall_instance, overall_semantic),
    }


def _pool(crop_scores: CropScores, label: str) -> dict[str, float]:
    pooled = {"tp": 0, "fp": 0, "fn": 0, "hausdorff_norm_sum": 0.0, "n_hausdorff": 0}
    for crop in sorted(crop_scores):
        score = crop_scores[crop].get(label)
        if score is None:
            continue
        for key in pooled:
            pooled[key] += score.get(key, 0)
    return pooled


def _instance_class_2026(p: dict[str, float]) -> dict[str, float]:
    denom = 2 * p["tp"] + p["fp"] + p["fn"]
    if denom == 0 and p["n_hausdorff"] == 0:  # nothing anywhere
        f1 = hausdorff = combined = 1.0
    else:
        f1 = (2 * p["tp"] / denom) if denom > 0 else 0.0
        hausdorff = p["hausdorff_norm_sum"] / p["n_hausdorff"] if p["n_hausdorff"] > 0 else 0.0
        combined = geometric_mean(f1, hausdorff)
    return {"f1": f1, "normalized_hausdorff_distance": hausdorff, "combined_score": combined,
            "tp": p["tp"], "fp": p["fp"], "fn": p["fn"]}


def combine_2026(crop_scores: CropScores) -> dict[str, Any]:
    """Class and overall scores of the 2026 era from per-crop counts (see module docstring)."""
    label_scores: dict[str, dict[str, float]] = {}
    instance_sum = semantic_sum = 0.0
    n_instance = n_semantic = 0
    for label in _labels(crop_scores):
        pooled = _pool(crop_scores, label)
        if is_scored_as_instance(label):
            label_scores[label] = _instance_class_2026(pooled)
            instance_sum += label_scores[label]["combined_score"]
            n_instance += 1
        else:
            denom = pooled["tp"] + pooled["fp"] + pooled["fn"]
            iou = (pooled["tp"] / denom) if denom > 0 else 1.0
            label_scores[label] = {"iou": iou, "tp": pooled["tp"], "fp": pooled["fp"], "fn": pooled["fn"]}
            semantic_sum += iou
            n_semantic += 1
    overall_instance = instance_sum / n_instance if n_instance else 0
    overall_semantic = semantic_sum / n_semantic if n_semantic else 0
    return {
        "label_scores": label_scores,
        "overall_instance_score": overall_instance,
        "overall_semantic_score": overall_semantic,
        "overall_score": geometric_mean(overall_instance, overall_semantic),
    }
