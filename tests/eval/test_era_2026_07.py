"""The "2026-07" era (the July 2026 changes, reconstructed): worked examples computed by hand where it differs
from "2026", on real small arrays.

Crops of 20³ voxels at 8 nm unless said otherwise: the Hausdorff cap is 20 · 8 / 2 = 80 nm, where 2026 scores
1.01^(−80/‖(8, 8, 8)‖) = 0.94417 and 2026-07 scores 0.1.
"""

import numpy as np
import pytest
from crop_scores import score_instance_2026_07
from eval_helpers import VS8

from cellseg.eval import evaluate
from cellseg.eval.crop_score import combine, score_class, score_missing
from cellseg.eval.eras import ERAS, get_era
from cellseg.eval.eras.era_2026 import Era2026
from cellseg.eval.instance_2026_07 import normalized_distances_2026_07

SHAPE = (20, 20, 20)
CAP = 80.0  # nm: half the smallest physical side, 20 · 8 / 2
NORM_8 = np.linalg.norm(VS8)  # 13.856 nm


def f_2026(d_nm):
    """The 2026 normalised distance on an 8 nm grid."""
    return 1.01 ** (-d_nm / NORM_8)


def cubes(shape, corners, size=2):
    """Object `i + 1` a cube of `size` voxels per side at each (z, y, x) corner."""
    out = np.zeros(shape, dtype=np.uint16)
    for i, (z, y, x) in enumerate(corners, start=1):
        out[z:z + size, y:y + size, x:x + size] = i
    return out


def scores(pred, truth, era="2026-07", voxel_size=VS8):
    """The era's per-crop scores (without the truth's voxel count `score_class` adds for decisions)."""
    out = score_class(pred, truth, label="mito", era=era, voxel_size_nm=voxel_size)
    assert out.pop("truth_voxels") == np.count_nonzero(truth)
    return out


def class_scores(crop, era="2026-07"):
    """The class scores of one crop's scores (the era's pooled combining)."""
    return combine({"crop1": {"mito": {**crop, "num_voxels": 8000, "voxel_size": list(VS8)}}}, era)[
        "label_scores"]["mito"]


def test_the_era_is_registered_and_keeps_the_2026_rules_it_does_not_change():
    era = get_era("2026-07")
    assert "2026-07" in ERAS and era.name == "2026-07" and isinstance(era, Era2026)
    assert era.title == "2026-07 leaderboard metric (reconstructed)"
    assert era.repairs_layout and not era.copy_length_bug
    assert era.skip_statuses == get_era("2026").skip_statuses
    assert era.semantic_from_counts(3, 1, 2) == get_era("2026").semantic_from_counts(3, 1, 2)
    truth = cubes(SHAPE, [(2, 2, 2)])
    assert scores(truth > 0, truth) == scores(truth > 0, truth, era="2026")  # a perfect match is 1 in both


def test_the_normalisation_is_one_at_zero_a_tenth_at_the_cap_and_zero_for_inf():
    got = normalized_distances_2026_07(np.float32([0, 40, 80, 80.00001, np.inf]), CAP)
    assert got.tolist() == pytest.approx([1.0, 0.1**0.5, 0.1, 0.1, 0.0], rel=1e-12)


def test_a_missed_object_scores_zero_not_the_cap():
    truth = cubes(SHAPE, [(2, 2, 2), (12, 12, 12)])
    pred = np.where(truth == 1, 1, 0)
    new = scores(pred, truth)
    assert new == {"tp": 1, "fp": 0, "fn": 1, "hausdorff_norm_sum": 1.0, "n_hausdorff": 2, "status": "scored"}
    assert scores(pred, truth, era="2026")["hausdorff_norm_sum"] == pytest.approx(1 + f_2026(CAP), rel=1e-12)
    c = class_scores(new)
    # F1 = 2·1 / (2·1 + 0 + 1) = 2/3; normalised Hausdorff (1 + 0) / 2; combined sqrt(2/3 · 1/2)
    assert (c["f1"], c["normalized_hausdorff_distance"]) == (pytest.approx(2 / 3), 0.5)
    assert c["combined_score"] == pytest.approx(np.sqrt(1 / 3), rel=1e-12)


def test_a_hallucinated_object_scores_zero_not_the_cap():
    truth = cubes(SHAPE, [(2, 2, 2)])
    pred = cubes(SHAPE, [(2, 2, 2), (12, 12, 12)])  # the second touches no truth object
    new = scores(pred, truth)
    assert new == {"tp": 1, "fp": 1, "fn": 0, "hausdorff_norm_sum": 1.0, "n_hausdorff": 2, "status": "scored"}
    assert scores(pred, truth, era="2026")["hausdorff_norm_sum"] == pytest.approx(1 + f_2026(CAP), rel=1e-12)
    assert class_scores(new)["combined_score"] == pytest.approx(np.sqrt(2 / 3 * 1 / 2), rel=1e-12)
    # no truth at all: the one predicted object is an entry of 0 (2026: the cap's 0.94417)
    nothing = np.zeros_like(truth)
    assert scores(pred == 1, nothing) == {"tp": 0, "fp": 1, "fn": 0, "hausdorff_norm_sum": 0.0, "n_hausdorff": 1,
                                          "status": "scored"}


@pytest.mark.parametrize(("rod_end", "distance_nm", "expected"), [
    (11, 40.0, 0.1**0.5),  # the rod's far end 5 voxels from the cube: d = cap / 2
    (19, 104.0, 0.1),  # 13 voxels: capped at 80 nm, the worst real match
])
def test_a_matched_distance_scores_a_tenth_to_the_power_d_over_the_cap(rod_end, distance_nm, expected):
    truth = cubes(SHAPE, [(4, 4, 4)])
    pred = truth.copy()
    pred[4, 4, 6:rod_end] = 1  # a rod along x, attached to the cube: still its match
    new = scores(pred, truth)
    assert (new["tp"], new["fp"], new["fn"], new["n_hausdorff"]) == (1, 0, 0, 1)
    assert new["hausdorff_norm_sum"] == pytest.approx(expected, rel=1e-12)
    old = scores(pred, truth, era="2026")["hausdorff_norm_sum"]
    assert old == pytest.approx(f_2026(min(distance_nm, CAP)), rel=1e-12)
    assert class_scores(new)["combined_score"] == pytest.approx(np.sqrt(expected), rel=1e-12)


@pytest.mark.parametrize(("shape", "voxel_size"), [((10, 40, 40), VS8), ((20, 20, 20), (4.0, 4.0, 4.0)),
                                                   ((16, 16, 16), (40.0, 8.0, 8.0))])
def test_the_worst_real_match_is_a_tenth_on_every_crop_geometry(shape, voxel_size):
    truth = cubes(shape, [(1, 1, 1)])
    pred = truth.copy()
    pred[1, 1, 3:] = 1  # a rod to the crop's far side: longer than the cap on each of these grids
    assert scores(pred, truth, voxel_size=voxel_size)["hausdorff_norm_sum"] == pytest.approx(0.1, rel=1e-12)
    cap = min(v * s for v, s in zip(voxel_size, shape, strict=True)) / 2
    assert scores(pred, truth, era="2026", voxel_size=voxel_size)["hausdorff_norm_sum"] == \
        pytest.approx(1.01 ** (-cap / np.linalg.norm(voxel_size)), rel=1e-12)


def test_unmatched_predictions_are_background_before_the_hausdorff_distance():
    # (a) An unmatched component first in raster order is component 1, the id of the truth object that
    # component 2 matches exactly. 2026 compares the object with both (the far one 8 voxels = 64 nm away),
    # 2026-07 with its match alone.
    truth = cubes(SHAPE, [(10, 10, 10)])
    pred = cubes(SHAPE, [(2, 10, 10), (10, 10, 10)])
    new = scores(pred, truth)
    assert new == {"tp": 1, "fp": 1, "fn": 0, "hausdorff_norm_sum": 1.0, "n_hausdorff": 2, "status": "scored"}
    assert scores(pred, truth, era="2026")["hausdorff_norm_sum"] == pytest.approx(f_2026(64) + f_2026(CAP))
    # Had it stayed, the object's entry would be 0.1^(64/80) = 0.158 (not 1).
    # (b) An unmatched component numbered like a missed truth object, 4 voxels (32 nm) beside it: 2026 compares
    # them (entry f(32)); 2026-07 leaves the object without a match (entry 0).
    truth = cubes(SHAPE, [(2, 2, 2), (12, 12, 12)])
    pred = cubes(SHAPE, [(2, 2, 2), (12, 12, 16)])
    new = scores(pred, truth)
    assert new == {"tp": 1, "fp": 1, "fn": 1, "hausdorff_norm_sum": 1.0, "n_hausdorff": 3, "status": "scored"}
    old = scores(pred, truth, era="2026")
    assert (old["tp"], old["fp"], old["fn"]) == (1, 1, 1)  # the matching is unchanged
    assert old["hausdorff_norm_sum"] == pytest.approx(1 + f_2026(32) + f_2026(CAP), rel=1e-12)
    assert score_instance_2026_07(pred, truth, VS8) == new


def test_the_worked_examples_perfect_and_empty_included(stores, three_balls):
    """End to end through `evaluate`: the 48³ crop of three balls at 8 nm of the worked examples, cap 192 nm."""
    truth_path = stores.truth({"crop1": {"mito": three_balls}})
    shifted = np.zeros_like(three_balls)
    shifted[:, :, 2:] = three_balls[:, :, :-2]  # every ball 2 voxels along x: Hausdorff 16 nm each
    extra = three_balls.copy()
    extra[40:44, 40:44, 40:44] = 9  # a false-positive object touching nothing
    cases = {  # prediction: (tp, fp, fn, F1, normalised Hausdorff)
        "perfect": (three_balls, (3, 0, 0, 1.0, 1.0)),
        "binary": ((three_balls > 0).astype(np.uint8), (3, 0, 0, 1.0, 1.0)),
        "empty": (np.zeros_like(three_balls), (0, 0, 3, 0.0, 0.0)),  # 2026: Hausdorff 0.871, combined 0 too
        "two_of_three": (np.where(three_balls == 3, 0, three_balls), (2, 0, 1, 0.8, 2 / 3)),
        "extra_fp": (extra, (3, 1, 0, 6 / 7, 3 / 4)),
        "shifted": (shifted, (3, 0, 0, 1.0, 0.1 ** (16 / 192))),
    }
    for name, (pred, (tp, fp, fn, f1, hd)) in cases.items():
        got = evaluate(stores.submission({"crop1": {"mito": pred}}), truth_path, metric="2026-07")
        s = got.label_scores["mito"]
        assert (s["tp"], s["fp"], s["fn"]) == (tp, fp, fn), name
        assert s["f1"] == pytest.approx(f1, rel=1e-15), name
        assert s["normalized_hausdorff_distance"] == pytest.approx(hd, rel=1e-12), name
        assert s["combined_score"] == pytest.approx(np.sqrt(f1 * hd), rel=1e-12), name
        assert got.metric == "2026-07"
    assert np.sqrt(0.8 * 2 / 3) == pytest.approx(0.73030, abs=5e-6)  # two of three (2026: 0.87502)
    assert np.sqrt(6 / 7 * 3 / 4) == pytest.approx(0.80178, abs=5e-6)  # extra false positive (2026: 0.91079)
    assert np.sqrt(0.1 ** (16 / 192)) == pytest.approx(0.90852, abs=5e-6)  # shifted (2026: 0.99427)


def test_a_missing_label_scores_as_an_empty_prediction(three_balls):
    missing = score_missing(label="mito", era="2026-07", num_voxels=three_balls.size, truth=lambda: three_balls)
    empty = scores(np.zeros_like(three_balls), three_balls)
    assert missing == {**empty, "status": "missing"}
    assert missing == {"tp": 0, "fp": 0, "fn": 3, "hausdorff_norm_sum": 0.0, "n_hausdorff": 3, "status": "missing"}


def test_a_skipped_crop_counts_in_a_decision_as_no_match_under_the_new_rules():
    """A shattered crop (60 isolated voxels for 1 object: over the cutoff 10 + 50·exp(−1/5) = 50.9) is
    skipped; a decision counts it as every object unmatched, the 60 predicted ones included, entries 0."""
    truth = cubes(SHAPE, [(2, 2, 2)])
    shattered = np.zeros_like(truth)
    shattered[10:20:3, 1:20:3, 1:20:4] = 1  # 4 · 7 · 5 = 140 voxels, pick 60 of them below
    shattered.reshape(-1)[np.flatnonzero(shattered)[60:]] = 0
    era = get_era("2026-07")
    skipped = {**scores(shattered, truth), "num_voxels": truth.size, "voxel_size": list(VS8)}
    assert era.is_skipped(skipped) and (skipped["num_truth_objects"], skipped["num_pred_objects"]) == (1, 60)
    worst = era.worst_case(skipped)
    assert {k: worst[k] for k in ("tp", "fp", "fn", "hausdorff_norm_sum", "n_hausdorff")} == \
        {"tp": 0, "fp": 60, "fn": 1, "hausdorff_norm_sum": 0.0, "n_hausdorff": 61}
    assert get_era("2026").worst_case(skipped)["n_hausdorff"] == 1  # 2026 gives the fragments no entry
    good = {**scores(truth, truth), "num_voxels": truth.size, "voxel_size": list(VS8)}
    crops = {"crop1": {"mito": good}, "crop2": {"mito": skipped}}
    assert combine(crops, era)["label_scores"]["mito"]["combined_score"] == 1.0  # the official score
    decided = combine(crops, era, decision=True)["label_scores"]["mito"]
    # tp 1, fp 60, fn 1: F1 = 2/63; entries 1 (crop1) and 61 zeros: 1/62
    assert decided["combined_score"] == pytest.approx(np.sqrt(2 / 63 * 1 / 62), rel=1e-12)
