"""Crop-bootstrap intervals: deterministic, covering the score, and paired for changes (so a small change
on every crop is told apart from noise even when the two stages' own intervals overlap)."""

from __future__ import annotations

import numpy as np
import pytest

from cellseg.decide.bootstrap import uncertainties, within_noise
from cellseg.decide.ranking import crop_scores_of, skipped_count


def stage_uncertainty(documents: list[dict], era: str) -> dict:
    """The intervals of one list of stages' documents in one era (`uncertainties` of a single group)."""
    return uncertainties({"stages": {era: documents}})[era]["stages"]


def _document(era: str, tp_er: list[int], tp_mito: list[int], *, skip: int | None = None) -> dict:
    """Per-crop 2026 counts: `er` with 100 truth voxels, `mito` with 10 truth objects per crop."""
    crops = {}
    for i, (er, mito) in enumerate(zip(tp_er, tp_mito, strict=True)):
        m = {"tp": mito, "fp": 2, "fn": 10 - mito, "hausdorff_norm_sum": 0.9 * mito, "n_hausdorff": 12 - mito,
             "status": "scored"}
        if i == skip:
            m = {"tp": 0, "fp": 0, "fn": 0, "hausdorff_norm_sum": 0.0, "n_hausdorff": 0,
                 "status": "skipped_too_many_instances", "num_truth_objects": 10, "num_pred_objects": 600}
        crops[f"crop{i + 1}"] = {
            "er": {"tp": er, "fp": 10, "fn": 100 - er, "status": "scored", "num_voxels": 1000, "voxel_size": [8] * 3},
            "mito": {**m, "num_voxels": 1000, "voxel_size": [8] * 3}}
    return {"metric": era, "crop_scores": crops}


def test_intervals_are_deterministic_and_cover_the_score():
    rng = np.random.default_rng(0)
    doc = _document("2026", rng.integers(20, 90, 12).tolist(), rng.integers(2, 9, 12).tolist())
    first, again = stage_uncertainty([doc], "2026"), stage_uncertainty([doc], "2026")
    assert first == again and first["crops"] == sorted(doc["crop_scores"]) and first["draws"] == 1000
    from cellseg.eval.crop_score import combine

    overall = combine(crop_scores_of(doc), "2026")["overall_score"]
    iv = first["stages"][0]["overall"]
    assert iv.low < overall < iv.high and iv.high - iv.low > 0.01  # twelve varied crops: a real spread
    assert first["changes"] == [None]


def test_a_change_on_every_crop_is_not_noise_and_a_shuffle_is():
    rng = np.random.default_rng(1)
    er, mito = rng.integers(20, 80, 10), rng.integers(2, 8, 10)
    base = _document("2026", er.tolist(), mito.tolist())
    better = _document("2026", (er + 3).tolist(), mito.tolist())  # +3 true-positive voxels on every crop
    shuffled = _document("2026", (er + rng.integers(-15, 16, 10)).tolist(), mito.tolist())
    u = stage_uncertainty([base, better, shuffled], "2026")
    a, b = u["stages"][0]["overall"], u["stages"][1]["overall"]
    assert a.high > b.low  # the stages' own intervals overlap ...
    assert not within_noise(u["changes"][1]["overall"])  # ... but the paired change is clear
    assert within_noise(u["changes"][2]["overall"])


def test_skipped_crops_are_counted_and_one_crop_gives_points():
    doc = _document("2026", [50, 60, 70], [5, 6, 7], skip=1)
    assert skipped_count(doc) == 1
    single = {"metric": "2026", "crop_scores": {"crop1": doc["crop_scores"]["crop1"]}}
    iv = stage_uncertainty([single], "2026")["stages"][0]["overall"]
    assert iv.low == pytest.approx(iv.high)
