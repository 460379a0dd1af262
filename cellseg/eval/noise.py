"""Crop-bootstrap noise: how far a score, or a difference of two scores, moves when other crops are drawn.

The crops are the independent samples (the voxels of one crop are strongly correlated), so a draw resamples
the crops with replacement and recombines their per-crop scores as the era does (a crop drawn twice counts
twice). Over `DRAWS` draws (seed `SEED`: the same numbers on every run) an interval is the central `LEVEL` of
the draws (percentiles). A difference is drawn *paired*: the same crops for both sides, so what they share
(the same hard crops) cancels. The ablation report's intervals (`cellseg.decide.bootstrap`) and the ensemble
fit's guard (`cellseg.infer.ensemble_fit.guard`) both use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellseg.eval.crop_score import combine
from cellseg.eval.eras import Era

DRAWS = 1000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A percentile interval (NaN ends where every draw is NaN)."""

    low: float
    high: float

    def to_json(self) -> list[float]:
        """[low, high]."""
        return [self.low, self.high]


def interval(values: np.ndarray, level: float = LEVEL) -> Interval:
    """The central `level` of `values`, NaN values left out."""
    finite = values[~np.isnan(values)]
    if not finite.size:
        return Interval(math.nan, math.nan)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return Interval(float(low), float(high))


def draws(crops: Sequence[str], num: int = DRAWS, seed: int = SEED) -> np.ndarray:
    """(num, len(crops)) indices of the crops drawn with replacement (deterministic)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, len(crops), size=(num, len(crops)))


def paired_gain(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]], *, label: str, key: str,
                era: Era, num: int = DRAWS, seed: int = SEED, level: float = LEVEL) -> Interval:
    """The interval of class score(a) − class score(b), both combined in decision mode over the same draws.

    Args:
        a, b: crop -> the class's per-crop scores (with `num_voxels` and `voxel_size`) of two candidates on the
            same crops.
        key: the class score: "combined_score" (instance) or "iou".
    """
    crops = sorted(set(a) & set(b))
    if not crops:
        return Interval(math.nan, math.nan)
    gains = np.empty(num)
    for d, row in enumerate(draws(crops, num, seed)):
        side = []
        for scores in (a, b):
            labels = combine({f"{crops[i]}#{k}": {label: scores[crops[i]]} for k, i in enumerate(row)}, era,
                             decision=True)["label_scores"]
            side.append(float(labels[label][key]) if label in labels else math.nan)
        gains[d] = side[0] - side[1]
    return interval(gains, level)
