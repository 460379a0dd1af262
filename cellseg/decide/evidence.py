"""How sure each per-class decision is: the paired crop-bootstrap interval, on the tuning crops, of the class's
decision-mode score with the stage minus the score of what the stage would replace (`cellseg.eval.noise.
paired_gain`), from the evaluations the switches were decided on (kept beside their submissions:
`cellseg.decide.scoring.scores_file`).

What each switch compares, per class (`cellseg.decide.switches`):

| switch | with the stage | what it would replace |
|---|---|---|
| uniform | the uniform mean | the best single model |
| weighted | the fitted weights | stage 2 as switched: the uniform mean where it is on, else the best single model |
| tta | stage 4 (TTA) | stage 3 as switched |
| postprocess, per era | the tuned decoding | stage 4 as switched, decoded plainly: TTA where it is on, else stage 3 |

With one tuning crop every draw is that crop: the interval is a point and says nothing about noise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from cellseg.decide.options import Layout
from cellseg.decide.ranking import crop_scores_of
from cellseg.decide.scoring import scores_file
from cellseg.eval.noise import DRAWS, paired_gain
from cellseg.eval.presence import score_key

ClassScores = dict[str, dict[str, Any]]  # crop -> the class's per-crop scores


def _per_crop(document: Mapping[str, Any], label: str) -> ClassScores:
    return {crop: labels[label] for crop, labels in crop_scores_of(document).items() if label in labels}


class Evaluations:
    """The tuning crops' evaluation documents of a decide or report directory, read once each."""

    def __init__(self, layout: Layout, single_key: str):
        self.layout, self.single_key, self._docs = layout, single_key, {}

    def doc(self, key: str, era: str) -> Mapping[str, Any]:
        """The evaluation of the submission `key` ("tuning_uniform", ...; "single": the best single model's) in
        `era`."""
        name = self.single_key if key == "single" else key
        if (name, era) not in self._docs:
            self._docs[(name, era)] = json.loads(scores_file(self.layout.submission(name), era).read_text())
        return self._docs[(name, era)]


def _interval(evaluations: Evaluations, label: str, era: str, after: str, before: str, num: int) -> list[float | None]:
    gain = paired_gain(_per_crop(evaluations.doc(after, era), label), _per_crop(evaluations.doc(before, era), label),
                       label=label, key=score_key(label), era=era, num=num)
    return [None if math.isnan(v) else v for v in (gain.low, gain.high)]


def switch_intervals(layout: Layout, single_key: str, switches: Mapping[str, Any], classes: Sequence[str],
                     eras: Sequence[str], *, num: int = DRAWS) -> dict[str, dict[str, list[float | None]]]:
    """Class → switch ("uniform", "weighted", "tta", "postprocess_<era>") → [low, high] of the paired gain on the
    tuning crops (module docstring); `single_key`: the submission key of the best single model on them."""
    evaluations, era = Evaluations(layout, single_key), switches["era"]
    out: dict[str, dict[str, list[float | None]]] = {}
    for name in classes:
        uniform_on = switches["uniform"]["classes"][name]["on"]
        tta_on = switches["tta"]["classes"][name]["on"]
        if switches["uniform"].get("alone"):  # one run: no ensemble was scored
            row = {"uniform": [None, None], "weighted": [None, None]}
        else:
            row = {"uniform": _interval(evaluations, name, era, "tuning_uniform", "single", num),
                   "weighted": _interval(evaluations, name, era, "tuning_weighted_fit",
                                         "tuning_uniform" if uniform_on else "single", num)}
        row["tta"] = _interval(evaluations, name, era, "tuning_tta", "tuning_weighted", num)
        for e in eras:
            row[f"postprocess_{e}"] = _interval(evaluations, name, e, "tuning_postprocess",
                                                "tuning_tta" if tta_on else "tuning_weighted", num)
        out[name] = row
    return out
