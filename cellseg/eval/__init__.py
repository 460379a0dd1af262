"""Scoring exactly like the CellMap leaderboard, in both eras, plus the submission writer and validator.

- `evaluate(submission, truth, metric="2025" | "2026" | "2026-07")`: per-crop, per-class and overall scores with
  the official key names (`score.py`; the rules are in `rules.py` and documented in docs/scoring.md);
- `write_submission(predictions, crops, out)`: the official zip from our prediction stores (`submit.py`);
- `validate_submission(path, crops)`: every problem the evaluators would meet, without scoring
  (`validate.py`);
- `score_class(pred, truth, label=, era=, voxel_size_nm=)`: one class of one crop, the path validation,
  tuning and ensemble fitting share with `evaluate` (`crop_score.py`); `read_class_truth` reads the truth
  of a training crop for them (`truth.py`).

Every result names its era: "2025" is the challenge-era metric (volume-weighted accuracy/Hausdorff,
Hungarian matching), "2026" the official code at commit `6b9ad68` (pooled IoU and F1, capped Hausdorff),
"2026-07" the 2026 rules with the official Hausdorff changes of July 2026, reconstructed from their descriptions
(`eras/era_2026_07.py`): the leaderboard's, and every command's default. They are not comparable.
Each era is one module of `eras/` (`get_era(name)`); adding a module there adds an era.
"""

from cellseg.eval.crop_score import score_class
from cellseg.eval.eras import ERA_TITLES, ERAS, Era, ScoringEra, get_era
from cellseg.eval.score import Evaluation, evaluate
from cellseg.eval.submit import load_manifest, write_submission
from cellseg.eval.validate import Issue, validate_submission

__all__ = ["ERAS", "ERA_TITLES", "Era", "Evaluation", "Issue", "ScoringEra", "evaluate", "get_era", "load_manifest",
           "score_class", "validate_submission", "write_submission"]
