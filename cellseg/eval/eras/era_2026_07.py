"""The "2026-07" metric: the official evaluator's rules after its changes of July 2026, as their
published descriptions state them (`--metric 2026-07`). A reconstruction, not verified against official code:
the official code cellseg reproduces exactly stops at `6b9ad68` (2026-06-30), the "2026" era.

Everything is the 2026 era's (`era_2026`: loader, semantic scores, cutoff and skips, matching, tp/fp/fn,
missing labels, pooled combining) except the instance Hausdorff entries of a scored crop
(`cellseg.eval.instance_2026_07`):

- unmatched predictions are set to background before the Hausdorff distance (official change approved
  2026-07-10);
- an unmatched instance, a missed truth object or a predicted object without a match, scores 0 (official
  change of 2026-07-02; 2026: the distance cap);
- a matched distance `d` scores `0.1^(d / cap)`: the worst real match, at the cap, scores 0.1 on every crop
  (same change; 2026: `1.01^(−d/‖vs‖)`).

A label the submission lacks scores as in 2026 (every truth object missed, each with an entry of 0), which is
now also what an empty prediction scores. Decisions: a skipped crop counts as no match at all under these
rules, every truth object a false negative and every predicted object a false positive, each with a Hausdorff
entry of 0 (2026 gives the false positives no entry, as their cap entries would score above 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cellseg.eval.eras import Scores
from cellseg.eval.eras.era_2026 import Era2026
from cellseg.eval.instance_2026_07 import score_relabelled_2026_07


class Era2026July(Era2026):
    """The 2026-07 rules (module docstring)."""

    name = "2026-07"
    title = "2026-07 leaderboard metric (reconstructed)"

    def score_components(self, pred_cc: np.ndarray, num_pred: int, truth: np.ndarray,
                         voxel_size_nm: Sequence[float]) -> Scores:
        """The 2026 keys, with the July 2026 Hausdorff entries (`score_relabelled_2026_07`)."""
        return score_relabelled_2026_07(pred_cc, num_pred, truth, voxel_size_nm)

    def worst_case(self, scores: Mapping[str, Any]) -> Scores:
        """No match: every truth object and every predicted object unmatched, each with a Hausdorff entry of 0.

        Raises:
            ValueError: scores without the object counts (not made by `score_instance`).
        """
        worst = super().worst_case(scores)
        worst["n_hausdorff"] = worst["fn"] + worst["fp"]
        return worst


ERA = Era2026July()
