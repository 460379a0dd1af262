"""Scoring one class of one crop under a named era: the one path every scorer of cellseg takes.

Validation during training (`cellseg.train.validate`), post-processing tuning (`cellseg.postprocess.tune`),
ensemble weight fitting (`cellseg.infer.ensemble_fit`) and the evaluator (`cellseg.eval.tasks`, hence
`cellseg evaluate` and the ablation report) all score a (prediction, truth) pair with `score_class` and
combine crops with `combine` (in decision mode when choosing between candidates); the era's rules come
from `cellseg.eval.eras`. Which labels take the instance branch is the official rule
(`is_scored_as_instance`): the 26-connected components of the prediction are matched to the truth's object
ids; every other label is scored as a mask (`> 0` is foreground).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cellseg.eval.eras import CropScores, Era, Scores, ScoringEra, get_era
from cellseg.eval.presence import TRUTH_KEY, combine_for_decision
from cellseg.eval.relabel import relabel_26
from cellseg.eval.resample import Aligned, Target
from cellseg.eval.rules import is_scored_as_instance


def score_class(pred: np.ndarray, truth: np.ndarray, *, label: str, era: Era | ScoringEra,
                voxel_size_nm: Sequence[float], num_components: int | None = None,
                max_bytes: int | None = None) -> Scores:
    """Per-crop scores of `label` in `era`: a prediction against its truth on the same (z, y, x) grid.

    Args:
        pred: instance labels: object ids (any integers; relabelled into 26-connected components), or,
            with `num_components`, those components already (`relabel_26`); semantic labels: a mask.
        truth: object ids (instance labels) or a mask, 0 where not annotated.
        voxel_size_nm: the grid's voxel size (Hausdorff distances are in nm).
        num_components: the number of components when `pred` is already relabelled (the evaluator
            relabels before reading the truth, to hold fewer volumes at once).
        max_bytes: memory budget of the era's matching, if it has one.

    Returns:
        The era's per-crop scores plus the truth's foreground voxel count (`cellseg.eval.presence.TRUTH_KEY`),
        which decisions use to leave out crops where the class is absent.

    Raises:
        ValueError: unknown era.
        MatrixTooLarge: the 2025 matching would need more than `max_bytes`.
    """
    rules = get_era(era)
    present = int(np.count_nonzero(truth))
    if not is_scored_as_instance(label):
        return {**rules.score_semantic(pred, truth), TRUTH_KEY: present}
    if num_components is None:
        pred, num_components = relabel_26(pred)
    return {**rules.score_instance(pred, num_components, truth, voxel_size_nm, max_bytes=max_bytes), TRUTH_KEY: present}


def semantic_from_counts(tp: int, fp: int, fn: int, era: Era | ScoringEra) -> Scores:
    """Per-crop semantic scores of `era` from confusion counts (equal to `score_class` on the masks)."""
    return {**get_era(era).semantic_from_counts(tp, fp, fn), TRUTH_KEY: int(tp) + int(fn)}


def score_missing(*, label: str, era: Era | ScoringEra, num_voxels: int,
                  truth: Callable[[], np.ndarray] | None = None) -> Scores:
    """Per-crop scores of `label` in `era` when the submission lacks it; `truth` reads its truth ids if the
    era counts them (None: counted as none)."""
    return get_era(era).score_missing(instance=is_scored_as_instance(label), num_voxels=num_voxels, truth=truth)


def combine(crop_scores: CropScores, era: Era | ScoringEra, *, decision: bool = False) -> dict[str, Any]:
    """Class and overall scores of `era` from per-crop scores (crop -> label -> scores with `num_voxels`
    and `voxel_size`, as the functions above return them plus those two keys).

    Args:
        decision: decision mode (`cellseg.eval.presence.combine_for_decision`): a crop the era skips counts as
            its worst case instead of nothing, and each class's crops with foreground and its crops without weigh
            half each (a class with no crop of foreground is left out of the result). Every decision cellseg makes
            uses it (`cellseg.eval.decision`); the official scores (False) are what is reported.
    """
    rules = get_era(era)
    return combine_for_decision(crop_scores, rules) if decision else rules.combine(crop_scores)


def align_prediction(array: Any, attrs: dict[str, Any], *, instance: bool, target: Target,
                     era: Era | ScoringEra) -> Aligned:
    """Bring a submitted (z, y, x) array (numpy or zarr, read lazily) onto the truth grid as `era` does.

    Raises:
        ValueError: unknown era.
        BadAttributes: voxel size / translation attributes it cannot use, or an array that is not 3-D.
    """
    return get_era(era).align(array, attrs, instance=instance, target=target)
