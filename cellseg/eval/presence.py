"""Which crops can inform a decision about a class: those where the class has foreground in the truth.

Both eras score a class with no truth on a crop as 1 when nothing is predicted there and 0 otherwise. On a
crop where the class is absent, a candidate therefore wins by predicting less, whatever it does where the
class is present: a decision made on such crops rewards suppression (a threshold of 0.8 instead of 0.5, a
member that predicts nothing). So every decision cellseg makes (checkpoint ranking, ensemble weights,
post-processing parameters, the report's stage switches and best single model) scores a class only on the
crops where its truth has foreground, and a class with fewer than `MIN_POSITIVE_CROPS` such crops takes no
part: its defaults are kept and the log says so, with the count of positive crops per class.

Per-crop scores carry the truth's foreground voxel count under `TRUTH_KEY` (`cellseg.eval.crop_score` adds
it); scores without it (written by older versions) count as positive, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRUTH_KEY = "truth_voxels"  # foreground voxels of the class's truth on the crop (annotated voxels only)
MIN_POSITIVE_CROPS = 1  # a class needs this many crops with foreground before it takes part in a decision

CropScores = Mapping[str, Mapping[str, Mapping[str, Any]]]  # crop -> label -> per-crop scores


def is_positive(scores: Mapping[str, Any]) -> bool:
    """True when the crop's truth has foreground of the class (or the count was not recorded)."""
    count = scores.get(TRUTH_KEY)
    return count is None or int(count) > 0


def positive_counts(crop_scores: CropScores) -> dict[str, tuple[int, int]]:
    """label -> (crops with foreground, crops scored), labels in sorted order."""
    counts: dict[str, list[int]] = {}
    for labels in crop_scores.values():
        for label, scores in labels.items():
            c = counts.setdefault(label, [0, 0])
            c[0] += is_positive(scores)
            c[1] += 1
    return {label: (c[0], c[1]) for label, c in sorted(counts.items())}


def informative(crop_scores: CropScores, min_positive: int = MIN_POSITIVE_CROPS) -> dict[str, dict[str, Any]]:
    """The per-crop scores a decision may use: each label on its positive crops only, and only the labels with at
    least `min_positive` of them (crops left with no label are dropped)."""
    counts = positive_counts(crop_scores)
    kept = {label for label, (positive, _) in counts.items() if positive >= min_positive}
    out: dict[str, dict[str, Any]] = {}
    for crop, labels in crop_scores.items():
        use = {label: s for label, s in labels.items() if label in kept and is_positive(s)}
        if use:
            out[crop] = use
    return out
