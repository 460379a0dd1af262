"""How much of an ablation number is noise: crop-bootstrap intervals of every score and of every change.

The scored crops are the independent samples (the voxels of one crop are strongly correlated), so each draw
resamples the crops with replacement, keeps every label of a drawn crop together, and recombines the
per-crop scores of each stage exactly as its era's leaderboard does (`ScoringEra.combine`; a crop drawn
twice counts twice). Over `DRAWS` draws (seed `SEED`: the same numbers on every run) the interval is the
central `LEVEL` of the draws (percentiles). A change between two stages is bootstrapped *paired*: the same
draw for both stages, so what the two share (the same hard crops) cancels; a change whose interval holds 0
is called "within noise".

With one scored crop every draw is the same crop: the intervals are points and say nothing about noise; the
report then says so instead of calling anything significant.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cellseg.eval.eras import CropScores, Era, get_era
from cellseg.eval.noise import DRAWS, LEVEL, SEED, Interval, draws, interval

__all__ = ["DRAWS", "LEVEL", "SEED", "Interval", "draws", "interval", "part_draws", "uncertainties", "within_noise"]

PARTS = ("overall", "instance", "semantic")
KEYS = {"overall": "overall_score", "instance": "overall_instance_score", "semantic": "overall_semantic_score"}


def _numbers(scores: Mapping[str, Any]) -> dict[str, Any]:
    """JSON scores back to numbers: null (a non-finite value in the evaluator's JSON) becomes NaN."""
    return {k: math.nan if v is None else v for k, v in scores.items()}


def part_draws(crop_scores: CropScores, era: Era, crops: Sequence[str], picks: np.ndarray) -> dict[str, np.ndarray]:
    """Part ("overall", "instance", "semantic") → its value in every draw."""
    rules = get_era(era)
    # each crop's scores converted once; a draw refers to them (`combine` only reads its input)
    numbers = [{label: _numbers(s) for label, s in crop_scores[crop].items()} for crop in crops]
    out = {part: np.empty(len(picks)) for part in PARTS}
    for d, row in enumerate(picks):
        combined = rules.combine({f"{crops[i]}#{k}": numbers[i] for k, i in enumerate(row)})
        for part in PARTS:
            out[part][d] = float(combined[KEYS[part]])
    return out


def _intervals(samples: Sequence[Mapping[str, np.ndarray]], crops: Sequence[str], *, num: int, seed: int,
               level: float) -> dict[str, Any]:
    stages = [{part: interval(s[part], level) for part in PARTS} for s in samples]
    changes: list[dict[str, Interval] | None] = [None]
    for before, after in itertools.pairwise(samples):
        changes.append({part: interval(after[part] - before[part], level) for part in PARTS})
    return {"crops": list(crops), "draws": num, "seed": seed, "level": level, "stages": stages, "changes": changes}


def _part_draws_job(job: tuple[CropScores, Era, Sequence[str], np.ndarray]) -> dict[str, np.ndarray]:
    return part_draws(*job)


def uncertainties(groups: Mapping[str, Mapping[Era, Sequence[Mapping[str, Any]]]], *, workers: int = 1,
                  num: int = DRAWS, seed: int = SEED, level: float = LEVEL) -> dict[Era, dict[str, Any]]:
    """Intervals of every part of every stage, and paired intervals of each stage's change from the one
    before, for several lists of stages' evaluation documents (`crop_scores` of `cellseg.eval.report.to_json`)
    in every era, the documents' draws spread over `workers` processes (the intervals do not depend on it).

    `groups` is name → era → documents, e.g. {"stages": ..., "singles": ...}.

    Returns:
        era → name → `{"crops", "draws", "seed", "level", "stages": [{part: Interval}],
        "changes": [None, {part: Interval}]}`.
    """
    from cellseg.pool import map_bounded

    jobs, where = [], []
    for name, by_era in groups.items():
        for era, documents in by_era.items():
            crops = sorted(documents[0]["crop_scores"])
            picks = draws(crops, num, seed)
            for doc in documents:
                jobs.append((doc["crop_scores"], era, crops, picks))
                where.append((name, era))
    results = map_bounded(_part_draws_job, jobs, max(1, min(workers, len(jobs))), processes=True)
    out: dict[Era, dict[str, Any]] = {}
    for name, by_era in groups.items():
        for era in by_era:
            samples = [r for r, w in zip(results, where, strict=True) if w == (name, era)]
            crops = sorted(by_era[era][0]["crop_scores"])
            out.setdefault(era, {})[name] = _intervals(samples, crops, num=num, seed=seed, level=level)
    return out


def within_noise(change: Interval) -> bool:
    """A change whose interval holds 0 (or is undefined) is not told apart from noise."""
    return not (change.low > 0 or change.high < 0)
