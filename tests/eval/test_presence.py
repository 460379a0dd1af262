"""Decisions on crops where a class is annotated but absent: neither hallucinating it there nor suppressing it where
it is present can win (`cellseg.eval.presence.combine_for_decision`), in every era, for instance and semantic
classes; crafted crops with one ball of the class and one empty annotated crop. The 2025 era scores an instance
class by voxel accuracy, which a hallucinated object on an empty crop does not lower: its leaderboard cannot tell
that hallucination from the honest prediction, and neither can a decision in that era."""

from __future__ import annotations

import numpy as np
import pytest
from eval_helpers import THREE_BALLS, VS8, balls

from cellseg.eval.crop_score import combine, score_class
from cellseg.eval.decision import decide
from cellseg.eval.eras import ERAS, get_era
from cellseg.eval.presence import ABSENT_SHARE, informative

SHAPE = (48, 48, 48)
PRESENT = balls(SHAPE, THREE_BALLS)
EMPTY = np.zeros(SHAPE, np.uint16)
HALLUCINATED = balls(SHAPE, [((24, 24, 24), 6)])  # one object where the truth has none


def _crops(present_pred: np.ndarray, absent_pred: np.ndarray, label: str, era: str) -> dict:
    """Crop 1 holds the class (three balls), crop 2 is annotated and empty; per-crop scores of the predictions."""
    def scores(pred: np.ndarray, truth: np.ndarray) -> dict:
        if label == "er":  # semantic: masks
            pred, truth = pred > 0, truth > 0
        return {**score_class(pred, truth, label=label, era=era, voxel_size_nm=VS8), "num_voxels": truth.size,
                "voxel_size": list(VS8)}

    return {"crop1": {label: scores(present_pred, PRESENT)}, "crop2": {label: scores(absent_pred, EMPTY)}}


def _decision_score(crops: dict, label: str, era: str) -> float:
    return decide(crops, era).class_scores(decision=True)[label]


def _blend(present: float, absent: float) -> float:
    return (1 - ABSENT_SHARE) * present + ABSENT_SHARE * absent


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("label", ["mito", "er"])
def test_hallucinating_on_an_absent_crop_loses_the_decision_where_the_leaderboard_punishes_it(era, label):
    honest, hallucinating = _crops(PRESENT, EMPTY, label, era), _crops(PRESENT, HALLUCINATED, label, era)
    key = "combined_score" if label == "mito" else "iou"
    official = [combine(c, era)["label_scores"][label][key] for c in (honest, hallucinating)]
    rules = get_era(era)
    blind = [rules.combine_decision(informative(c))["label_scores"][label][key] for c in (honest, hallucinating)]
    assert blind[0] == blind[1]  # the crops with foreground alone cannot see it
    assert _decision_score(honest, label, era) == pytest.approx(1.0)
    absent = combine({"c": hallucinating["crop2"]}, era)["label_scores"][label][key]  # the era's score of the crop
    assert _decision_score(hallucinating, label, era) == pytest.approx(_blend(1.0, absent))
    if (label, era) == ("mito", "2025"):  # voxel accuracy: the leaderboard ties them, and so does the decision
        assert official[0] == official[1] and absent == 1.0
    else:
        assert official[0] > official[1] and absent == 0.0
        assert _decision_score(honest, label, era) > _decision_score(hallucinating, label, era)


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("label", ["mito", "er"])
def test_suppressing_a_present_class_loses_the_decision(era, label):
    honest, suppressing = _crops(PRESENT, EMPTY, label, era), _crops(EMPTY, EMPTY, label, era)
    d = decide(suppressing, era).decision["label_scores"][label]
    assert (d["absent_score"], d["absent_crops"]) == (1.0, 1)  # clean where absent ...
    assert d["present_score"] < 1.0 and (d["present_score"] == 0.0 or (label, era) == ("mito", "2025"))
    assert _decision_score(suppressing, label, era) == pytest.approx(_blend(d["present_score"], 1.0))
    assert _decision_score(honest, label, era) > _decision_score(suppressing, label, era)  # ... and still loses


@pytest.mark.parametrize("era", ERAS)
def test_many_absent_crops_do_not_outweigh_the_present_one(era):
    """Ten empty annotated crops and one with the class: predicting nothing anywhere still scores half."""
    crops = _crops(EMPTY, EMPTY, "er", era)
    for i in range(3, 12):
        crops[f"crop{i}"] = {"er": crops["crop2"]["er"]}
    assert _decision_score(crops, "er", era) == pytest.approx(ABSENT_SHARE)
    assert _decision_score({**crops, "crop1": _crops(PRESENT, EMPTY, "er", era)["crop1"]}, "er", era) == 1.0


def test_a_class_without_foreground_anywhere_takes_no_part_and_overall_is_the_mean_of_the_blend():
    era = "2026"
    crops = _crops(PRESENT, HALLUCINATED, "mito", era)
    crops["crop1"]["er"] = _crops(PRESENT, EMPTY, "er", era)["crop2"]["er"]  # er annotated, absent everywhere
    d = decide(crops, era)
    assert d.uninformed == ["er"] and list(d.decision["label_scores"]) == ["mito"]
    assert d.decision["overall_instance_score"] == pytest.approx(1.0 - ABSENT_SHARE)
