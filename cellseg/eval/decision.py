"""Scores that decisions are made on: the era's combining in *decision mode*, and which score ranks.

Every decision cellseg makes before scoring (the checkpoint kept as `best.pt`, `--weights auto`, tuned
post-processing parameters, the best single model of a report) ranks candidates by a score that

1. counts a crop the era's combining skips as its worst case (`ScoringEra.combine_decision`): under the
   2026 rules a crop with too many predicted objects adds nothing to the class pools, so shattering a poor
   crop into fragments raises the official class score; here it scores as no match at all;
2. weighs, per class, the crops where it has foreground and those where it is annotated but absent half and half
   (`cellseg.eval.presence`): scored as the leaderboard scores them, the absent crops would reward suppression;
   left out, they would reward hallucination; a class with no positive crop takes no part, and when no class has
   one every candidate ties (`NO_EVIDENCE`, score 0);
3. is defined for the classes being ranked (`ranking_score`): the overall score needs both kinds of class
   (2025: NaN without one; 2026: 0 for the missing kind, the same for every candidate), so with one kind
   the ranking falls back to that kind's mean, else to the mean class score, and says so.

The official numbers are still what every log and table reports, with the number of skipped crops beside
them (`Decision.summary`).

Example:
    >>> d = decide(crop_scores, "2026")  # doctest: +SKIP
    >>> d.ranking.score, d.ranking.ranked_by, d.summary()["skipped_crops"]  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cellseg.eval.eras import CropScores, Era, Scores, ScoringEra, get_era
from cellseg.eval.presence import combine_for_decision, positive_counts
from cellseg.eval.rules import is_scored_as_instance

OVERALL = "overall_score"
KIND_KEYS = {True: "overall_instance_score", False: "overall_semantic_score"}
MEAN_CLASS = "mean_class_score"
NO_EVIDENCE = "no_evidence"  # no class has foreground on any crop: every candidate scores 0 and ties


def class_score(label: str, scores: Mapping[str, Any]) -> float:
    """The score a class is ranked by: its combined score (instance) or IoU (semantic)."""
    return float(scores["combined_score" if is_scored_as_instance(label) else "iou"])


@dataclass(frozen=True)
class Ranking:
    """The number a decision ranks by.

    Attributes:
        score: its value (NaN when nothing is defined).
        ranked_by: "overall_score", "overall_instance_score", "overall_semantic_score", "mean_class_score" or
            "no_evidence".
        reason: why it is not the overall score (None when it is).
    """

    score: float
    ranked_by: str
    reason: str | None = None


def ranking_score(combined: Mapping[str, Any]) -> Ranking:
    """The overall score when the classes hold both kinds and it is finite, else the defined part (module
    docstring, rule 2); `combined` is a `combine` result."""
    labels = combined["label_scores"]
    kinds = {is_scored_as_instance(label) for label in labels}
    overall = float(combined[OVERALL])
    if len(kinds) == 2 and math.isfinite(overall):
        return Ranking(overall, OVERALL)
    if len(kinds) == 1:
        (kind,) = kinds
        value = float(combined[KIND_KEYS[kind]])
        if math.isfinite(value):
            what = "instance" if kind else "semantic"
            return Ranking(value, KIND_KEYS[kind], f"only {what} classes are scored: the era's overall score "
                                                  "needs both kinds, so the mean of the "
                                                  f"{what} class scores ranks")
    finite = [v for label, s in labels.items() if math.isfinite(v := class_score(label, s))]
    reason = f"the overall score is not a number ({overall}) for these classes: the mean class score ranks"
    return Ranking(sum(finite) / len(finite) if finite else math.nan, MEAN_CLASS, reason)


@dataclass(frozen=True)
class Decision:
    """Official and decision-mode scores of one set of per-crop scores, and the ranking.

    Attributes:
        era: the era's name.
        official: `ScoringEra.combine` of the crops (what the leaderboard would say).
        decision: `cellseg.eval.presence.combine_for_decision` (skipped crops at their worst case; positive
            and absent crops half and half; classes without a positive crop left out).
        skipped: (crop, label) left out of `official`.
        ranking: `ranking_score(decision)`.
        positive: label -> (crops with its foreground, crops scored).
    """

    era: Era
    official: Scores
    decision: Scores
    skipped: list[tuple[str, str]]
    ranking: Ranking
    positive: dict[str, tuple[int, int]]

    @property
    def uninformed(self) -> list[str]:
        """The labels no decision is made for (no positive crop)."""
        return sorted(set(self.official["label_scores"]) - set(self.decision["label_scores"]))

    def class_scores(self, *, decision: bool = False) -> dict[str, float]:
        """Class → its score (combined score or IoU), official or in decision mode."""
        labels = (self.decision if decision else self.official)["label_scores"]
        return {label: class_score(label, s) for label, s in labels.items()}

    def summary(self) -> dict[str, Any]:
        """The official overall scores, the skipped count, the decision overall and what ranked (for logs)."""
        return {"metric": self.era, **{k: self.official[k] for k in (OVERALL, *KIND_KEYS.values())},
                "skipped_crops": len(self.skipped), "decision_score": self.decision[OVERALL],
                "ranked_by": self.ranking.ranked_by, "ranking_score": self.ranking.score,
                "positive_crops": {label: p for label, (p, _) in self.positive.items()},
                "uninformed_classes": self.uninformed}


def decide(crop_scores: CropScores, era: Era | ScoringEra) -> Decision:
    """Combine per-crop scores officially and in decision mode, and pick the ranking score.

    Raises:
        ValueError: an unknown era, or skipped scores without the counts their worst case needs.
    """
    rules = get_era(era)
    decision = combine_for_decision(crop_scores, rules)
    ranking = ranking_score(decision) if decision["label_scores"] else Ranking(
        0.0, NO_EVIDENCE, "no class has foreground on any tuning crop: every candidate ties")
    return Decision(era=rules.name, official=rules.combine(crop_scores), decision=decision,
                    skipped=rules.skipped(crop_scores), ranking=ranking, positive=positive_counts(crop_scores))
