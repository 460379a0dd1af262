"""Decision mode: a crop the era skips counts as its worst case, so shattering a poor crop cannot raise the
score a decision ranks by; and the ranking score falls back when the overall score is undefined."""

from __future__ import annotations

import math

import numpy as np
import pytest
from eval_helpers import THREE_BALLS, VS8, balls

from cellseg.eval.crop_score import combine, score_class
from cellseg.eval.decision import decide, ranking_score
from cellseg.eval.eras import get_era


def _scores(pred: np.ndarray, truth: np.ndarray, label: str, era: str) -> dict:
    return {**score_class(pred, truth, label=label, era=era, voxel_size_nm=VS8), "num_voxels": truth.size,
            "voxel_size": list(VS8)}


def _shattered(pred: np.ndarray) -> np.ndarray:
    """Every other voxel along each axis: isolated voxels, one 26-connected component each."""
    lattice = np.zeros(pred.shape, bool)
    lattice[::2, ::2, ::2] = True
    return np.where(lattice, pred, 0).astype(pred.dtype)


@pytest.fixture
def crops() -> dict:
    good = balls((48, 48, 48), THREE_BALLS)
    poor_truth = balls((48, 48, 48), THREE_BALLS)
    poor = balls((48, 48, 48), [((12, 12, 13), 5), ((30, 30, 16), 6), ((40, 8, 40), 4)])  # 2 shifted, 1 wrong
    return {"good": (good, good), "poor": (poor, poor_truth)}


def test_shattering_a_poor_crop_raises_the_official_score_but_not_the_decision_score(crops):
    good, truth = crops["good"]
    poor, poor_truth = crops["poor"]
    honest = {"crop1": {"mito": _scores(good, truth, "mito", "2026")},
              "crop2": {"mito": _scores(poor, poor_truth, "mito", "2026")}}
    attacked = {"crop1": honest["crop1"], "crop2": {"mito": _scores(_shattered(poor), poor_truth, "mito", "2026")}}
    shattered = attacked["crop2"]["mito"]
    assert shattered["status"] == "skipped_too_many_instances"
    assert shattered["num_truth_objects"] == 3 and shattered["num_pred_objects"] > 112  # 3 · (10 + 50 e^-0.6)

    official = {k: combine(v, "2026")["label_scores"]["mito"]["combined_score"] for k, v in (("honest", honest),
                                                                                             ("attacked", attacked))}
    decision = {k: combine(v, "2026", decision=True)["label_scores"]["mito"]["combined_score"]
                for k, v in (("honest", honest), ("attacked", attacked))}
    assert official["honest"] < 0.95 and official["attacked"] == 1.0  # the attack pays officially
    assert decision["honest"] == official["honest"]  # nothing skipped: decision mode changes nothing
    assert decision["attacked"] < official["honest"]  # and it does not pay in decision mode
    d = decide(attacked, "2026")
    assert d.skipped == [("crop2", "mito")] and d.summary()["skipped_crops"] == 1
    assert d.official["label_scores"]["mito"]["combined_score"] == 1.0


def test_the_worst_case_counts_every_object_and_keeps_the_crop_size(crops):
    poor, truth = crops["poor"]
    scores = _scores(_shattered(poor), truth, "mito", "2026")
    worst = get_era("2026").worst_case(scores)
    assert worst == {"tp": 0, "fp": scores["num_pred_objects"], "fn": 3, "hausdorff_norm_sum": 0.0, "n_hausdorff": 3,
                     "status": "skipped_counted_as_worst", "num_voxels": truth.size, "voxel_size": list(VS8)}
    with pytest.raises(ValueError, match="num_truth_objects"):
        get_era("2026").worst_case({"status": "skipped_too_many_instances", "tp": 0})


def test_2025_skips_nothing_so_decision_mode_is_the_official_combining(crops):
    poor, truth = crops["poor"]
    scores = {"crop1": {"mito": _scores(_shattered(poor), truth, "mito", "2025")}}
    assert scores["crop1"]["mito"]["combined_score"] == 0  # 2025: over its cutoff the crop scores 0
    assert combine(scores, "2025", decision=True)["label_scores"] == combine(scores, "2025")["label_scores"]
    assert decide(scores, "2025").skipped == []


def test_ranking_falls_back_when_the_overall_score_is_undefined(crops):
    good, truth = crops["good"]
    instance_only = {"crop1": {"mito": _scores(good, truth, "mito", "2025")}}
    d = decide(instance_only, "2025")
    assert math.isnan(d.official["overall_score"])  # 2025: no semantic class, no overall score
    assert d.ranking.ranked_by == "overall_instance_score" and d.ranking.score == 1.0
    assert "only instance classes" in d.ranking.reason
    d26 = decide({"crop1": {"mito": _scores(good, truth, "mito", "2026")}}, "2026")
    assert d26.official["overall_score"] == 0.0  # 2026: 0 for the missing kind, for every candidate alike
    assert d26.ranking.ranked_by == "overall_instance_score" and d26.ranking.score == 1.0
    both = {"crop1": {"mito": _scores(good, truth, "mito", "2026"), "er": _scores(good > 0, truth > 0, "er", "2026")}}
    assert ranking_score(combine(both, "2026")).ranked_by == "overall_score"
    nothing = ranking_score({"label_scores": {}, "overall_score": math.nan, "overall_instance_score": math.nan,
                             "overall_semantic_score": math.nan})
    assert nothing.ranked_by == "mean_class_score" and math.isnan(nothing.score)


def test_an_era_that_skips_crops_must_say_what_a_skipped_crop_counts_as():
    from cellseg.eval.eras import ScoringEra

    with pytest.raises(TypeError, match="does not define worst_case"):
        type("SkippingEra", (ScoringEra,), {"skip_statuses": frozenset({"skipped"})})
