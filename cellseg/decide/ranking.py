"""The report's own decision and what it reports beside the official numbers.

- The best single model (stage 1) is a decision like the ensemble weights and the post-processing
  parameters, so it is made the same way: each run's stage-1 prediction is scored on the *tuning* crops
  (written as a submission at their truth's geometry and evaluated, as every stage is) and, in each era, the
  run with the highest decision score (`cellseg.eval.decision`: skipped crops at their worst case, the overall
  score or its defined part) is chosen; its scores on the scored crops are what the table shows.
- Every official number is reported with the number of (crop, label) pairs the era's combining skipped
  (`skipped_count`) and the decision-mode overall score (`decision_overall`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from cellseg.decide.options import StageResult
from cellseg.eval.decision import decide
from cellseg.eval.eras import Era


def crop_scores_of(document: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """The per-crop scores of an evaluation document as numbers (its JSON nulls, non-finite values, as NaN)."""
    return {crop: {label: {k: math.nan if v is None else v for k, v in s.items()} for label, s in labels.items()}
            for crop, labels in document["crop_scores"].items()}


def skipped_count(document: Mapping[str, Any]) -> int:
    """(crop, label) pairs the era's combining left out of an evaluation document."""
    return len(decide(crop_scores_of(document), document["metric"]).skipped)


def decision_overall(document: Mapping[str, Any]) -> float:
    """The decision-mode overall score of an evaluation document."""
    return float(decide(crop_scores_of(document), document["metric"]).decision["overall_score"])


def ranking(stage: StageResult, era: Era) -> tuple[float, str]:
    """(score, what it is) a stage is ranked by in `era` (NaN ranks last)."""
    r = decide(crop_scores_of(stage.scores[era].document), era).ranking
    return r.score, r.ranked_by


def choose_best(on_tuning: Sequence[StageResult], eras: Sequence[Era], names: Sequence[str]
                ) -> dict[Era, dict[str, Any]]:
    """Era → the choice of the best run (`names`, in the order of `on_tuning`) by its decision score on the
    tuning crops: `{"index", "run", "ranked_by", "scores": run → its score}`."""
    out = {}
    for era in eras:
        ranked = [ranking(s, era) for s in on_tuning]
        best = max(range(len(ranked)), key=lambda i: -math.inf if math.isnan(ranked[i][0]) else ranked[i][0])
        out[era] = {"index": best, "run": names[best], "ranked_by": ranked[best][1],
                    "scores": {name: score for name, (score, _) in zip(names, ranked, strict=True)}}
    return out
