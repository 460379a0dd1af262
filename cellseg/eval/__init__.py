"""Scoring exactly like the CellMap leaderboard, in both eras, plus the submission writer and validator.

- `evaluate(submission, truth, metric="2025" | "2026")`: per-crop, per-class and overall scores with
  the official key names (`score.py`; the rules are in `rules.py` and documented in docs/scoring.md);
- `write_submission(predictions, crops, out)`: the official zip from our prediction stores (`submit.py`);
- `validate_submission(path, crops)`: every problem the evaluators would meet, without scoring
  (`validate.py`).

Every result names its era: "2025" is the challenge-era metric (volume-weighted accuracy/Hausdorff,
Hungarian matching), "2026" the current one (pooled IoU and F1, capped Hausdorff). They are not comparable.
"""

from cellseg.eval.rules import ERA_TITLES, ERAS, Era
from cellseg.eval.score import Evaluation, evaluate
from cellseg.eval.submit import load_manifest, write_submission
from cellseg.eval.validate import Issue, validate_submission

__all__ = ["ERAS", "ERA_TITLES", "Era", "Evaluation", "Issue", "evaluate", "load_manifest", "validate_submission",
           "write_submission"]
