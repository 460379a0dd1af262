"""A validation that cannot tell checkpoints apart keeps the latest one and says it decided nothing."""

from __future__ import annotations

import logging
import os

import torch

from cellseg.train.run_checkpoints import CheckpointKeeper
from cellseg.train.validation_hook import DecisionWatch, class_line


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((2,), float(step))}, "ema": None, "step": step}


def test_tied_scores_keep_the_latest_checkpoint_as_best(tmp_path):
    keeper = CheckpointKeeper(tmp_path, top_k=2)
    for step in (200, 400, 600):
        keeper.offer(_state(step), step, 0.0)  # every validation skipped: the same score
    assert sorted(keeper.scores) == [400, 600]
    assert os.path.samefile(tmp_path / "best.pt", tmp_path / "step_600.pt")
    assert torch.load(tmp_path / "best.pt")["step"] == 600
    keeper.offer(_state(800), 800, 0.5)  # a better score still wins ...
    keeper.offer(_state(1000), 1000, 0.25)  # ... and a worse later one does not
    assert torch.load(tmp_path / "best.pt")["step"] == 800 and sorted(keeper.scores) == [800, 1000]


def _result(score: float) -> dict:
    return {"metric": "2026", "ranking_score": score, "ranked_by": "no_evidence", "skipped_crops": 1,
            "crop_scores": {"crop1": {"mito": {"tp": 0, "fp": 2413, "fn": 29, "status": "skipped_too_many_instances"},
                                      "ecs": {"tp": 0, "fp": 0, "fn": 0, "status": "scored", "truth_voxels": 0}}},
            "class_scores": {"mito": 1.0, "ecs": 1.0}, "uninformed_classes": ["ecs"]}


def test_a_run_whose_ranking_never_varies_is_told_so_once(caplog):
    watch = DecisionWatch()
    with caplog.at_level(logging.WARNING, logger="cellseg.train"):
        assert not watch.observe(_result(0.0))  # one validation: nothing to compare yet
        assert watch.observe(_result(0.0))
        assert not watch.observe(_result(0.0))  # once per run
    assert caplog.text.count("validation decided nothing") == 1
    assert caplog.text.count("1 of 2 classes have no foreground in any tuning crop and take no part") == 1
    assert "2 validations all ranked 0.0000 (no_evidence); 1 of 2 (crop, class) pairs were skipped" in caplog.text
    assert "1 classes have no foreground in any tuning crop (ecs)" in caplog.text
    varied = DecisionWatch()
    assert not varied.observe(_result(0.1)) and not varied.observe(_result(0.2)) and not varied.observe(_result(0.2))


def test_the_validation_line_marks_scores_that_say_nothing():
    assert class_line(_result(0.0)) == "mito 1.000 (1 skipped), ecs 1.000 (no foreground)"
