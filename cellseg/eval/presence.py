"""Which crops inform a decision about a class, and how: the crops where it is present and those where it is
annotated but absent, each group carrying half of the class's decision score.

Both eras score a class with no truth on a crop as 1 when nothing is predicted there and 0 otherwise. Scored on
every crop as the leaderboard scores them, a decision can be won by predicting less: a threshold of 0.8 instead of
0.5, or a member that predicts nothing, gains on the crops without the class whatever it loses where the class is
present. Scored on the crops with the class's foreground alone, it can be won by predicting more: a decoding that
hallucinates the class on the crops without it loses nothing there. So every decision cellseg makes (checkpoint
ranking, ensemble weights, post-processing parameters, the stage switches and the best single model) scores a class
by `combine_for_decision`:

    decision score = (1 - ABSENT_SHARE) · score on the crops with its foreground (combined as the era combines)
                   + ABSENT_SHARE · the share of the crops without it where nothing is predicted

With `ABSENT_SHARE` = 1/2 neither group can outweigh the other however many crops it has. A prediction that is right
where the class is present and clean where it is absent scores 1; hallucinating on every absent crop, or predicting
nothing where the class is present, costs half the score. A class with fewer than `MIN_POSITIVE_CROPS` crops of
foreground takes no part (nothing could tell suppressing it from getting it right): its defaults are kept and the
log says so, with the count of positive crops per class. A class without absent crops is scored on its positive
crops alone, as the era combines them.

Per-crop scores carry the truth's foreground voxel count under `TRUTH_KEY` (`cellseg.eval.crop_score` adds
it); scores without it (written by older versions) count as positive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cellseg.eval.eras import Era, ScoringEra, get_era
from cellseg.eval.rules import geometric_mean, is_scored_as_instance

TRUTH_KEY = "truth_voxels"  # foreground voxels of the class's truth on the crop (annotated voxels only)
MIN_POSITIVE_CROPS = 1  # a class needs this many crops with foreground before it takes part in a decision
ABSENT_SHARE = 0.5  # the part of a class's decision score its crops without foreground carry (module docstring)
KIND_KEYS = {True: "overall_instance_score", False: "overall_semantic_score"}

CropScores = Mapping[str, Mapping[str, Mapping[str, Any]]]  # crop -> label -> per-crop scores


def is_positive(scores: Mapping[str, Any]) -> bool:
    """True when the crop's truth has foreground of the class (or the count was not recorded)."""
    count = scores.get(TRUTH_KEY)
    return count is None or int(count) > 0


def score_key(label: str) -> str:
    """The key of a class's score in combined scores: "combined_score" (instance) or "iou" (semantic)."""
    return "combined_score" if is_scored_as_instance(label) else "iou"


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
    """Each label's per-crop scores on its positive crops only, for the labels with at least `min_positive` of them
    (crops left with no label are dropped)."""
    counts = positive_counts(crop_scores)
    kept = {label for label, (positive, _) in counts.items() if positive >= min_positive}
    out: dict[str, dict[str, Any]] = {}
    for crop, labels in crop_scores.items():
        use = {label: s for label, s in labels.items() if label in kept and is_positive(s)}
        if use:
            out[crop] = use
    return out


def clean_share(crop_scores: CropScores, label: str, rules: ScoringEra) -> tuple[float, int]:
    """(the share of `label`'s absent crops where nothing is predicted, how many absent crops were scored): each
    absent crop scored alone as the era scores it (1 when nothing is predicted, 0 otherwise); NaN and 0 without any."""
    values = []
    for labels in crop_scores.values():
        scores = labels.get(label)
        if scores is None or is_positive(scores):
            continue
        alone = rules.combine_decision({"crop": {label: scores}})["label_scores"][label][score_key(label)]
        if math.isfinite(float(alone)):
            values.append(float(alone))
    return (sum(values) / len(values), len(values)) if values else (math.nan, 0)


def combine_for_decision(crop_scores: CropScores, era: Era | ScoringEra,
                         min_positive: int = MIN_POSITIVE_CROPS) -> dict[str, Any]:
    """The class and overall scores a decision ranks by (module docstring): each class with positive crops
    combined over them in the era's decision mode (`ScoringEra.combine_decision`), blended with its absent crops'
    clean share; a class's entry then also holds "present_score", "absent_score" and "absent_crops". The kind and
    overall scores are the era's means of the blended class scores (a kind with no class keeps the era's value)."""
    rules = get_era(era)
    combined = rules.combine_decision(informative(crop_scores, min_positive))
    labels = combined["label_scores"]
    for label, entry in list(labels.items()):
        clean, count = clean_share(crop_scores, label, rules)
        if not count:
            continue
        key = score_key(label)
        present = float(entry[key])
        labels[label] = {**entry, key: (1 - ABSENT_SHARE) * present + ABSENT_SHARE * clean,
                         "present_score": present, "absent_score": clean, "absent_crops": count}
    for instance, kind_key in KIND_KEYS.items():
        values = [float(s[score_key(k)]) for k, s in labels.items() if is_scored_as_instance(k) == instance]
        if values:
            combined[kind_key] = sum(values) / len(values)
    combined["overall_score"] = geometric_mean(combined[KIND_KEYS[True]], combined[KIND_KEYS[False]])
    return combined
