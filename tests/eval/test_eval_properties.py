"""Properties: id permutations change nothing, perfect scores 1, 2× finer submissions score the same,
missing labels and crops score as the official evaluators score them, classes aggregate per era."""

import numpy as np
import pytest
from crop_scores import score_instance_2025, score_instance_2026, score_instance_2026_07
from eval_helpers import balls
from hypothesis import given, settings
from hypothesis import strategies as st

from cellseg.eval import evaluate

ERAS = ("2025", "2026", "2026-07")


def _truth_pred(seed):
    rng = np.random.default_rng(seed)
    specs = [((int(rng.integers(4, 28)), int(rng.integers(4, 28)), int(rng.integers(4, 28))), int(rng.integers(2, 5)))
             for _ in range(int(rng.integers(1, 6)))]
    truth = balls((32, 32, 32), specs)
    pred = np.roll(truth, int(rng.integers(-2, 3)), axis=int(rng.integers(0, 3)))
    return truth, pred


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_permuting_prediction_ids_changes_nothing(seed, perm_seed):
    truth, pred = _truth_pred(seed)
    ids = np.unique(pred)
    ids = ids[ids != 0]
    new = np.random.default_rng(perm_seed).permutation(np.arange(1000, 1000 + ids.size)).astype(np.uint32)
    lut = np.zeros(int(pred.max()) + 1, dtype=np.uint32)
    lut[ids] = new
    permuted = lut[pred]
    vs = [8.0, 8.0, 8.0]
    assert score_instance_2025(permuted, truth, vs) == score_instance_2025(pred, truth, vs)
    assert score_instance_2026(permuted, truth, vs) == score_instance_2026(pred, truth, vs)
    assert score_instance_2026_07(permuted, truth, vs) == score_instance_2026_07(pred, truth, vs)


@pytest.mark.parametrize("era", ERAS)
def test_perfect_submission_scores_one(stores, three_balls, era):
    crops = {"crop1": {"mito": three_balls, "nuc": (three_balls == 2).astype(np.uint8),
                       "er": (three_balls > 0).astype(np.uint8), "pm": np.zeros_like(three_balls, np.uint8)},
             "crop2": {"mito": np.zeros((20, 20, 20), np.uint16), "er": np.ones((20, 20, 20), np.uint8)}}
    ev = evaluate(stores.submission(crops), stores.truth(crops), metric=era)
    assert (ev.overall_score, ev.overall_instance_score, ev.overall_semantic_score) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("era", ERAS)
def test_two_times_finer_submission_scores_the_same(stores, three_balls, era):
    truth_crops = {"crop1": {"mito": three_balls, "er": (three_balls % 2 == 1).astype(np.uint8)}}
    truth = stores.truth(truth_crops, translation=(800.0, 400.0, 1600.0))
    pred = {"mito": np.roll(three_balls, 1, axis=0), "er": (np.roll(three_balls, 1, axis=2) > 0).astype(np.uint8)}
    same = stores.submission({"crop1": pred}, translation=(800.0, 400.0, 1600.0))
    fine = {k: v.repeat(2, 0).repeat(2, 1).repeat(2, 2) for k, v in pred.items()}
    # Same translation: the evaluators snap it onto the truth grid (floor), so the finer grid starts at voxel 0.
    finer = stores.submission({"crop1": fine}, voxel_size=(4.0, 4.0, 4.0), translation=(800.0, 400.0, 1600.0))
    a, b = evaluate(same, truth, metric=era), evaluate(finer, truth, metric=era)
    assert a.crop_scores == {c: {k: {**v, "voxel_size": v["voxel_size"]} for k, v in s.items()}
                             for c, s in b.crop_scores.items()}
    assert a.overall_score == b.overall_score < 1


def test_missing_labels_and_crops_2025(stores, three_balls):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"mito": three_balls, "er": er}, "crop2": {"mito": three_balls, "er": er}})
    sub = stores.submission({"crop1": {"mito": three_balls}})  # crop1/er missing, crop2 missing
    ev = evaluate(sub, truth, metric="2025")
    assert ev.missing["crops"] == ["crop2"] and ev.missing["labels"] == {"crop1": ["er"]}
    assert ev.crop_scores["crop1"]["er"] == {"iou": 0, "dice_score": 0, "num_voxels": 48**3,
                                             "voxel_size": [8.0, 8.0, 8.0], "is_missing": True}
    assert ev.crop_scores["crop2"]["mito"]["combined_score"] == 0
    # equal volumes: class score = mean of the crops' scores, missing = 0
    assert ev.label_scores["mito"]["combined_score"] == 0.5
    assert ev.label_scores["er"]["iou"] == 0.0
    assert ev.overall_score == 0.0


def test_missing_labels_and_crops_2026(stores, three_balls):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"mito": three_balls, "er": er}, "crop2": {"mito": three_balls, "er": er}})
    sub = stores.submission({"crop1": {"mito": three_balls, "er": er}})
    ev = evaluate(sub, truth, metric="2026")
    assert ev.crop_scores["crop2"]["mito"] | {} == {"tp": 0, "fp": 0, "fn": 3, "hausdorff_norm_sum": 0.0,
                                                     "n_hausdorff": 3, "status": "missing", "num_voxels": 48**3,
                                                     "voxel_size": [8.0, 8.0, 8.0], "is_missing": True}
    assert ev.crop_scores["crop2"]["er"]["fn"] == 48**3  # every voxel, not just the foreground
    mito = ev.label_scores["mito"]
    assert (mito["tp"], mito["fn"], mito["f1"]) == (3, 3, 6 / 9)
    assert mito["normalized_hausdorff_distance"] == 0.5
    assert ev.label_scores["er"]["iou"] == er.sum() / (er.sum() + 48**3)


def test_missing_instance_label_with_empty_truth(stores):
    empty = np.zeros((16, 16, 16), np.uint16)
    truth = stores.truth({"crop1": {"mito": empty, "er": empty.astype(np.uint8)}})
    sub = stores.submission({"crop1": {"er": empty.astype(np.uint8)}})
    e25, e26 = evaluate(sub, truth, metric="2025"), evaluate(sub, truth, metric="2026")
    assert e25.label_scores["mito"]["combined_score"] == 0  # 0, weighted in
    assert e25.label_scores["er"]["iou"] == 1.0  # empty vs empty
    assert e26.label_scores["mito"]["combined_score"] == 1.0  # nothing anywhere
    assert e26.label_scores["er"]["iou"] == 1.0


def test_2025_weights_crops_by_physical_volume(stores, three_balls):
    small = balls((10, 10, 10), [((5, 5, 5), 3)])
    truth = stores.truth({"crop1": {"er": (three_balls > 0).astype(np.uint8)}})
    stores.truth({"crop2": {"er": (small > 0).astype(np.uint8)}}, voxel_size=(32.0, 32.0, 32.0))
    sub = stores.submission({"crop1": {"er": (three_balls > 0).astype(np.uint8)}})  # crop2 missing
    ev = evaluate(sub, truth, metric="2025")
    v1, v2 = 8.0**3 * 48**3, 32.0**3 * 10**3
    assert ev.label_scores["er"]["iou"] == pytest.approx(v1 / (v1 + v2), rel=1e-15)
    ev26 = evaluate(sub, truth, metric="2026")
    tp = int((three_balls > 0).sum())
    assert ev26.label_scores["er"]["iou"] == tp / (tp + 10**3)


def test_only_semantic_truth_overall(stores, three_balls):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"er": er}})
    sub = stores.submission({"crop1": {"er": er}})
    e25, e26 = evaluate(sub, truth, metric="2025"), evaluate(sub, truth, metric="2026")
    assert np.isnan(e25.overall_instance_score) and np.isnan(e25.overall_score)  # np.mean([]) officially
    assert (e26.overall_instance_score, e26.overall_score) == (0, 0.0)


def test_instance_count_cutoffs(stores):
    truth = balls((40, 40, 40), [((20, 20, 20), 3)])
    pred = np.zeros_like(truth)
    pred[::2, ::2, ::4] = 1  # thousands of isolated voxels
    t = stores.truth({"crop1": {"mito": truth}})
    sub = stores.submission({"crop1": {"mito": pred}})
    e25 = evaluate(sub, t, metric="2025").crop_scores["crop1"]["mito"]
    assert (e25["accuracy"], e25["combined_score"], e25["hausdorff_distance"]) == (0, 0, np.inf)
    e26 = evaluate(sub, t, metric="2026").crop_scores["crop1"]["mito"]
    assert e26["status"] == "skipped_too_many_instances" and e26["n_hausdorff"] == 0


def test_2026_cutoff_uses_the_largest_truth_id(stores):
    truth = balls((40, 40, 40), [((20, 20, 20), 3)])
    pred = np.zeros_like(truth)
    pred[2:40:4, 2:40:4, 2] = 1  # 100 objects
    few = stores.truth({"crop1": {"mito": truth}}, name="few.zarr")
    phantom = stores.truth({"crop1": {"mito": truth * 5}}, name="phantom.zarr")  # id 5: nG = 5
    sub = stores.submission({"crop1": {"mito": pred}})
    assert evaluate(sub, few, metric="2026").crop_scores["crop1"]["mito"]["status"] == "skipped_too_many_instances"
    scored = evaluate(sub, phantom, metric="2026").crop_scores["crop1"]["mito"]
    assert scored["status"] == "scored" and scored["fp"] == 100 and scored["fn"] == 1  # 100/5 = 20 < 28.4


def test_2025_hungarian_pairs_objects_that_do_not_overlap(stores):
    truth = balls((40, 40, 40), [((8, 8, 8), 3), ((30, 30, 30), 3)])
    pred = balls((40, 40, 40), [((8, 8, 8), 3), ((8, 30, 8), 3)])  # second prediction touches nothing
    t = stores.truth({"crop1": {"mito": truth}})
    ev = evaluate(stores.submission({"crop1": {"mito": pred}}), t, metric="2025").crop_scores["crop1"]["mito"]
    # truth 2 is paired with the far prediction: a finite distance, not inf
    expected = np.sqrt(22**2 * 2 + 0) * 8  # farthest voxel pair distance realised between the two balls
    assert np.isfinite(ev["hausdorff_distance"]) and ev["hausdorff_distance"] > 0
    assert ev["hausdorff_distance"] <= expected + 6 * 8 * 2


def test_2026_unmatched_component_numbered_like_a_truth_object(stores):
    truth = balls((40, 40, 40), [((10, 10, 10), 3), ((30, 30, 30), 3)])
    pred = np.zeros_like(truth)
    pred[2:4, 9:12, 9:12] = 7  # first in raster order: component 1, near truth 1 but not touching it
    pred[truth == 2] = 9  # component 2: matched to truth 2
    t = stores.truth({"crop1": {"mito": truth}})
    s = evaluate(stores.submission({"crop1": {"mito": pred}}), t, metric="2026").crop_scores["crop1"]["mito"]
    # truth 1 is unmatched but component 1 keeps its number: a real (capped) distance, not the cap
    cap = 40 * 8 / 2
    entries = [1.01 ** (-d / np.linalg.norm([8, 8, 8])) for d in (cap,)]
    assert (s["tp"], s["fp"], s["fn"], s["n_hausdorff"]) == (1, 1, 1, 3)
    assert s["hausdorff_norm_sum"] > 1 + 2 * entries[0]
