"""Choosing the validation crops of a synthetic root so that validation sees every class.

Rule: with crops visited in a seeded random order, repeatedly move to validation the crop that adds
the most classes not yet present (non-zero) in any validation crop, skipping a crop when that would
remove the last training crop in which one of its classes is present (unless no other crop can cover
the class); then add random crops, with the same care for training coverage, until
`validation_fraction` of the crops is reached.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def _train_safe(crop: int, train: set[int], present: Mapping[int, set[str]]) -> bool:
    others = set().union(*(present[c] for c in train if c != crop))
    return present[crop] <= others


def choose_validation(present: Mapping[int, set[str]], *, fraction: float, seed: int) -> set[int]:
    """Validation crop ids, given the classes present (annotated and non-zero) in each training crop."""
    order = [int(c) for c in np.random.default_rng([seed & 0xFFFFFFFF, 0x5E1EC7]).permutation(sorted(present))]
    validate: set[int] = set()
    train = set(order)
    wanted = set().union(*present.values()) if present else set()
    while True:
        covered = set().union(*(present[c] for c in validate))
        gains = {c: len((present[c] & wanted) - covered) for c in order if c in train and len(train) > 1}
        if not gains or max(gains.values()) == 0:
            break
        safe = [c for c in order if gains.get(c, 0) > 0 and _train_safe(c, train, present)]
        best = max(safe or [c for c in order if gains.get(c, 0) > 0], key=lambda c: gains[c])
        validate.add(best)
        train.discard(best)
    target = max(len(validate), math.ceil(fraction * len(order)))
    for crop in order:
        if len(validate) >= target or len(train) <= 1:
            break
        if crop in train and _train_safe(crop, train, present):
            validate.add(crop)
            train.discard(crop)
    return validate
