"""The weight-fit guard: the written weights are never worse on the tuning crops than a member alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from crafted import crop_truth
from test_ensemble import write_store

from cellseg.config.inference import EnsembleConfig
from cellseg.infer.ensemble import ensemble
from cellseg.infer.ensemble_fit import guard


def test_shrinkage_that_would_lose_to_the_best_member_is_undone(tiny_synth_root, tmp_path):
    """One member equals the truth, two are its negative: uniform (1/3 on the truth) and the fit shrunk towards
    it (two crops: λ ≥ 0.875) threshold to nothing on the truth; the guard keeps the unshrunk fit."""
    classes = ("mito", "er")
    truth = {crop: crop_truth(tiny_synth_root, crop, classes) for crop in ("crop1", "crop2", "crop3")}
    negative = {crop: (grid, {c: 1 - p for c, p in t.items()}) for crop, (grid, t) in truth.items()}
    provenance = {"data_root": str(tiny_synth_root)}
    members = [write_store(tmp_path / f"{name}.zarr", data, channels=classes, provenance=provenance)
               for name, data in (("bad1", negative), ("good", truth), ("bad2", negative))]
    result = ensemble(EnsembleConfig(members=tuple(members), weights="auto"), tmp_path / "ens.zarr")
    doc = json.loads((tmp_path / "ens.zarr" / "weights.json").read_text())
    for c in classes:
        fit = result.weights.report["classes"][c]
        scores = fit["scores"]
        assert scores["members"] == [0.0, 1.0, 0.0] and scores["uniform"] == 0.0
        assert fit["lambda"] >= 0.875 and scores["shrunk"] < 1.0 == scores["fitted"]
        assert fit["chosen"] == "unshrunk" and scores["final"] == 1.0 >= max(scores["members"])
        assert fit["weights"] == pytest.approx(fit["fitted_weights"])
        assert result.weights.per_channel[c] == pytest.approx(fit["fitted_weights"])
        assert doc["fit"]["classes"][c]["chosen"] == "unshrunk"
    # The written ensemble is the truth where the uniform mean would have been its negative.
    _, t = truth["crop2"]
    for c in classes:
        assert np.array_equal(result.store.read("crop2", c) > 0.5, t[c] > 0.5)


def test_weights_scored_in_the_first_pass_keep_their_scores(tiny_synth_root, tmp_path):
    """Three equal members: every candidate ties, the fit and its shrunk form are uniform, a first-pass candidate;
    they keep its score and its exact weights (no second pass for the class)."""
    classes = ("mito", "er")
    truth = {crop: crop_truth(tiny_synth_root, crop, classes) for crop in ("crop1", "crop2", "crop3")}
    provenance = {"data_root": str(tiny_synth_root)}
    members = [write_store(tmp_path / f"m{k}.zarr", truth, channels=classes, provenance=provenance) for k in range(3)]
    result = ensemble(EnsembleConfig(members=tuple(members), weights="auto"), tmp_path / "ens.zarr")
    for c in classes:
        fit = result.weights.report["classes"][c]
        assert fit["chosen"] == "uniform" and fit["weights"] == fit["fitted_weights"] == [1 / 3] * 3
        scores = fit["scores"]
        assert scores["fitted"] == scores["shrunk"] == scores["uniform"] == scores["final"] == 1.0


def fit(members, uniform, weights=(0.5, 0.5), fitted=(0.2, 0.8)):
    return {"weights": np.asarray(weights), "fitted_weights": np.asarray(fitted),
            "scores": {"members": list(members), "uniform": uniform}}


def test_guard_prefers_the_simplest_of_tied_candidates_and_a_member_only_when_strictly_better():
    clear = {"uniform": 1.0, "unshrunk": 1.0, "member 0": 1.0, "member 1": 1.0, "member 2": 1.0, "member 5": 1.0}
    assert guard(fit([0.6, 0.7], 0.8), 0.8, 0.8, [0, 1], clear)["chosen"] == "uniform"
    assert guard(fit([0.6, 0.7], 0.5), 0.8, 0.8, [0, 1], clear)["chosen"] == "shrunk"
    assert guard(fit([0.6, 0.8], 0.5), 0.8, 0.7, [0, 1], clear)["chosen"] == "unshrunk"
    best = guard(fit([0.6, 0.9], 0.5), 0.8, float("nan"), [2, 5], clear)
    assert best["chosen"] == "member 5" and list(best["weights"]) == [0.0, 1.0]
    assert best["scores"]["final"] == 0.9 and best["scores"]["fitted"] == 0.8


def test_guard_keeps_the_shrunk_weights_against_gains_within_the_noise():
    """The unshrunk fit and a member score higher in sample, but their paired crop-bootstrap gain over the shrunk
    weights holds 0: the shrinkage stands. Uniform still replaces it on a tie (the simplest)."""
    noisy = {"unshrunk": -0.02, "member 1": -0.05}
    assert guard(fit([0.6, 0.75], 0.5), 0.8, 0.7, [0, 1], noisy)["chosen"] == "shrunk"
    assert guard(fit([0.6, 0.75], 0.5), 0.8, 0.7, [0, 1], {**noisy, "member 1": 0.01})["chosen"] == "member 1"
    assert guard(fit([0.6, 0.75], 0.7), 0.8, 0.7, [0, 1], noisy)["chosen"] == "uniform"


def test_paired_gain_tells_a_consistent_gain_from_one_lucky_crop():
    """Better on every crop: the interval lies above 0; better on one crop of six and worse on the others:
    it holds 0 although the pooled score is higher."""
    from cellseg.eval.noise import paired_gain

    extra = {"num_voxels": 1000, "voxel_size": [8.0, 8.0, 8.0]}

    def iou(tp, fp, fn):
        return {"iou": tp / (tp + fp + fn), "dice_score": 2 * tp / (2 * tp + fp + fn), **extra}

    crops = [f"crop{k}" for k in range(6)]
    base = {c: iou(50, 50, 50) for c in crops}
    better = {c: iou(60, 40, 40) for c in crops}
    lucky = {c: iou(45, 55, 55) for c in crops} | {"crop0": iou(100, 0, 0)}
    assert paired_gain(better, base, label="er", key="iou", era="2025").low > 0
    gain = paired_gain(lucky, base, label="er", key="iou", era="2025")
    assert gain.low < 0 < gain.high


def test_the_second_pass_on_kept_values_equals_reading_them_again(tiny_synth_root, tmp_path, monkeypatch, caplog):
    """Members of different quality (the truth blended with noise) give fitted and shrunk weights outside the
    first pass's candidates; the second pass scores them on the values kept from the first, and the fit is the
    same as with nothing kept (every value read and resampled again)."""
    import cellseg.infer.ensemble_fit as ensemble_fit

    classes = ("mito", "er")
    truth = {crop: crop_truth(tiny_synth_root, crop, classes) for crop in ("crop1", "crop2", "crop3")}
    rng = np.random.default_rng(0)
    provenance = {"data_root": str(tiny_synth_root)}
    members = []
    for k, trust in enumerate((0.9, 0.6, 0.3, 0.45, 0.75)):  # five members: softmax weights, not a grid point
        data = {crop: (grid, {c: (trust * p + (1 - trust) * rng.random(p.shape)).astype(np.float32)
                              for c, p in t.items()}) for crop, (grid, t) in truth.items()}
        members.append(write_store(tmp_path / f"m{k}.zarr", data, channels=classes, provenance=provenance))
    caplog.set_level("INFO", logger="cellseg.infer.ensemble_fit")
    config = EnsembleConfig(members=tuple(members), weights="auto")
    kept = ensemble(config, tmp_path / "kept.zarr").weights.report["classes"]
    assert "weight fit: 0.0 MB" not in caplog.text and "MB of member values kept" in caplog.text
    monkeypatch.setattr(ensemble_fit, "KEEP_MAX_BYTES", 0)
    caplog.clear()
    read = ensemble(config, tmp_path / "read.zarr").weights.report["classes"]
    assert "weight fit: 0.0 MB of member values kept" in caplog.text
    for c in classes:
        assert kept[c]["fitted_weights"] not in ([0.2] * 5, *np.eye(5).tolist())  # a second pass was needed
        assert kept[c] == read[c]
