"""Tuning on a small set knows when it knows nothing: crops without the class's foreground take no part, and an
instance setting that predicts far from the truth's foreground or object count cannot win."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from blobs import ball

from cellseg.postprocess.params import InstanceParams, SemanticParams
from cellseg.postprocess.tune import INSTANCE_BOUND, Sample, score_samples, tune_class

ISO = (8.0, 8.0, 8.0)
THIN = (40.0, 8.0, 8.0)  # a serial-section look-alike: few, thick z-planes


def official(name: str, samples: list[Sample], params, era: str = "2026") -> float:
    """The class score over every sample as the leaderboard combines them (absent crops included)."""
    from cellseg.eval.crop_score import combine, score_class

    scores = {s.crop: {name: {**score_class(s.decode(name, params), s.truth, label=name, era=era,
                                            voxel_size_nm=s.voxel_size_nm), **s.extra()}} for s in samples}
    label = combine(scores, era)["label_scores"][name]
    return float(label["iou"] if "iou" in label else label["combined_score"])


def _sample(crop: str, prob: np.ndarray, truth: np.ndarray, voxel_size=ISO) -> Sample:
    return Sample(crop=crop, prob=prob.astype(np.float32), boundary=None, truth=truth,
                  inside=np.ones(truth.shape, bool), voxel_size_nm=voxel_size)


def _er(seed: int, present: bool) -> tuple[np.ndarray, np.ndarray]:
    """A ball of `er` at 0.55-0.95 when present; false positives of 0.5-0.75 on a small blob either way."""
    rng = np.random.default_rng(seed)
    shape = (24, 24, 24)
    truth = ball(shape, (96, 96, 96), 64.0, ISO) if present else np.zeros(shape, bool)
    blob = ball(shape, (24, 24, 24), 24.0, ISO)
    prob = np.where(truth, rng.uniform(0.55, 0.95, shape), np.where(blob, rng.uniform(0.5, 0.75, shape), 0.05))
    return prob, truth


def test_a_class_absent_from_every_tuning_crop_keeps_its_default_threshold(caplog):
    """Absent everywhere: a threshold above the false positives scores 1.0 on the absent crop (nothing predicted,
    nothing there) against 0.0 at 0.5, so a presence-blind search picks 0.8, which halves the IoU where the class
    is. Presence-aware, nothing is decided and the default stands."""
    tuning = [_sample("crop1", *_er(0, present=False))]
    blind = {t: official("er", tuning, SemanticParams(threshold=t)) for t in (0.5, 0.8)}
    assert blind == {0.5: 0.0, 0.8: 1.0}  # what a presence-blind search sees (every crop counts)
    best, info = tune_class("er", tuning, era="2026")
    assert best == SemanticParams() and info["positive_crops"] == 0 and info["crops"] == 1
    assert info["score"] is None and info["default_score"] is None
    test = _sample("crop9", *_er(1, present=True))
    kept = score_samples("er", [test], best, era="2026")
    suppressing = score_samples("er", [test], SemanticParams(threshold=0.8), era="2026")
    assert kept > 0.85 > 0.6 > suppressing


def test_only_the_crops_with_foreground_decide(caplog):
    """One crop with `er`, one without: the result is the one-crop result on the positive crop."""
    positive = _sample("crop1", *_er(2, present=True))
    absent = _sample("crop2", *_er(3, present=False))
    both, info = tune_class("er", [positive, absent], era="2026")
    alone, _ = tune_class("er", [positive], era="2026")
    assert both == alone and info["positive_crops"] == 1 and info["crops"] == 2


def _degenerate_case() -> Sample:
    """Six thin objects whose probability is 0.32 but 0.9 on a lattice of isolated voxels, over a background of
    0.31: above 0.3 the whole crop is one object; from 0.4 up the objects shatter into hundreds of fragments
    (the 2026 metric skips the crop: worst case in decision mode). In sample, the whole-crop object wins."""
    shape = (8, 48, 96)
    truth = np.zeros(shape, np.uint32)
    for i in range(6):
        truth[ball(shape, (160, 96 + 192 * (i % 2), 64 + 128 * (i // 2)), 56.0, THIN)] = i + 1
    lattice = np.zeros(shape, bool)
    lattice[::2, ::2, ::2] = True
    prob = np.where(truth > 0, np.where(lattice, 0.9, 0.32), 0.31)
    return _sample("crop1", prob, truth, THIN)


def test_a_degenerate_instance_setting_is_never_chosen(caplog):
    sample = _degenerate_case()
    whole = score_samples("mito", [sample], InstanceParams(threshold=0.3), era="2026")
    default = score_samples("mito", [sample], InstanceParams(), era="2026")
    assert whole > default  # unbounded, the whole-crop object would win
    best, info = tune_class("mito", [sample], era="2026")
    assert best.threshold != 0.3
    assert info["truth_objects"] == 6 and info["rejected"] >= 1
    assert not info["bounded"] and best == InstanceParams()  # nothing bounded: the defaults stand


def test_a_degenerate_default_gives_way_to_a_bounded_setting():
    """The objects at 0.45 with a 0.9 lattice (shattered above 0.5), background 0.05: 0.4 finds the six objects."""
    sample = _degenerate_case()
    prob = np.where(sample.truth > 0, np.where(sample.prob > 0.5, 0.9, 0.45), 0.05)
    case = _sample("crop1", prob, sample.truth, THIN)
    best, info = tune_class("mito", [case], era="2026")
    assert best.threshold < 0.45 and info["bounded"]
    assert info["truth_objects"] / INSTANCE_BOUND <= info["objects"] <= info["truth_objects"] * INSTANCE_BOUND


@pytest.mark.parametrize("era", ["2025", "2026-07"])
def test_presence_holds_in_every_era(era):
    best, info = tune_class("er", [_sample("crop1", *_er(0, present=False))], era=era)
    assert best == SemanticParams() and info["positive_crops"] == 0


def test_the_store_tuning_log_names_the_positive_crops(caplog):
    from cellseg.postprocess.tuning import _log_tuned

    caplog.set_level(logging.INFO, logger="cellseg.postprocess.tuning")
    _log_tuned("er", "2026", SemanticParams(), {"score": None, "default_score": None, "positive_crops": 0, "crops": 3})
    assert "no tuning crop has its foreground (0 of 3 tuning crops with its foreground); defaults kept" in caplog.text
