"""Bringing predictions into the truth grid: each era's rules and quirks (docs/scoring.md, "Reproduced quirks")."""

import numpy as np
import pytest

from cellseg.eval import resample
from cellseg.eval.crop_score import align_prediction
from cellseg.eval.resample import BadAttributes, Target, voxel_offset

T8 = Target(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(0.0, 0.0, 0.0), shape_vox=(10, 10, 10))


def _attrs(vs=(8, 8, 8), tr=(0, 0, 0)):
    return {"voxel_size": list(vs), "translation": list(tr)}


def test_translation_snapping_off_grid_truth_loses_a_voxel():
    target = Target(voxel_size_nm=(32.0,) * 3, translation_nm=(192012.0, 41612.0, 43212.0), shape_vox=(50,) * 3)
    intended = np.array([6, 10, 2])
    tr = np.array(target.translation_nm) + intended * 32
    assert voxel_offset(tr, target).tolist() == [5, 9, 1]


def test_finer_prediction_in_voxel_centre_convention_lands_one_voxel_off():
    target = Target(voxel_size_nm=(8.0,) * 3, translation_nm=(0.0,) * 3, shape_vox=(10,) * 3)
    assert voxel_offset((-2.0, -2.0, -2.0), target).tolist() == [-1, -1, -1]  # 4 nm grid: first centre at -2 nm
    assert voxel_offset((0.0, 0.0, 0.0), target).tolist() == [0, 0, 0]


@pytest.mark.parametrize("era", ["2025", "2026"])
def test_copy_length_bug_only_in_2025(era):
    pred = np.arange(1, 7, dtype=np.uint16)[None, None, :].repeat(10, 0).repeat(10, 1)  # 6 voxels along x
    out = align_prediction(pred, _attrs(tr=(0, 0, 16)), instance=True, target=T8, era=era)  # starts at x = 2
    row = out.data[0, 0].tolist()
    if era == "2025":
        assert row == [0, 0, 1, 2, 3, 4, 0, 0, 0, 0]  # min(crop, pred) - offset = 4 voxels copied
        assert any("copy-length bug" in n for n in out.notes)
    else:
        assert row == [0, 0, 1, 2, 3, 4, 5, 6, 0, 0]


@pytest.mark.parametrize("era", ["2025", "2026"])
def test_no_attributes_centre_crop_and_pad(era):
    pred = np.ones((12, 8, 10), np.uint8)
    out = align_prediction(pred, {}, instance=False, target=T8, era=era).data
    assert out.shape == (10, 10, 10)
    assert out[:, 0].sum() == 0 and out[:, 9].sum() == 0 and out[:, 1:9].all()


def test_only_translation_differs_between_eras():
    pred = np.zeros((4, 10, 10), np.uint8)
    pred[0] = 1
    attrs = {"translation": [16, 0, 0]}
    old = align_prediction(pred, attrs, instance=False, target=T8, era="2025").data
    new = align_prediction(pred, attrs, instance=False, target=T8, era="2026").data
    assert old[2].all() and old.sum() == 100  # placed by the translation
    assert new[5].all() and new.sum() == 100  # centre-padded (3 before) then shifted by 2


@pytest.mark.parametrize("spelling", [("resolution", "offset"), ("scale", "translation"), ("voxel_size", "offset")])
def test_accepted_attribute_spellings(spelling):
    pred = np.ones((5, 5, 5), np.uint8)
    attrs = {spelling[0]: [16, 16, 16], spelling[1]: [0, 0, 0]}
    for era in ("2025", "2026"):
        out = align_prediction(pred, attrs, instance=False, target=T8, era=era).data
        assert out.all()  # 5 voxels of 16 nm cover the 10 voxels of 8 nm


def test_string_attributes_fail_in_2025_only():
    pred = np.ones((10, 10, 10), np.uint8)
    attrs = {"voxel_size": ["8", "8", "8"], "translation": [0, 0, 0]}
    assert align_prediction(pred, attrs, instance=False, target=T8, era="2025").official_failure
    assert align_prediction(pred, attrs, instance=False, target=T8, era="2026").official_failure is None
    with pytest.raises(BadAttributes):
        align_prediction(pred, {"voxel_size": "eight"}, instance=False, target=T8, era="2026")


def test_bool_semantic_resampling_crashes_2025_officially_but_is_scored():
    pred = np.zeros((20, 20, 20), bool)
    pred[4:12] = True
    attrs = _attrs(vs=(4, 4, 4))
    old = align_prediction(pred, attrs, instance=False, target=T8, era="2025")
    new = align_prediction(pred, attrs, instance=False, target=T8, era="2026")
    assert "bool" in old.official_failure and new.official_failure is None
    np.testing.assert_array_equal(old.data, new.data)
    assert old.data[2:6].all() and not old.data[7:].any()


def test_voxel_size_comparison_exact_in_2025_allclose_in_2026():
    pred = np.zeros((10, 10, 10), np.float32)
    pred[5, 5, 5] = 0.7  # kept only without resampling... and linear resampling of an isolated voxel keeps it too
    attrs = _attrs(vs=(8.0000001, 8, 8))
    assert any("resampled" in n for n in align_prediction(pred, attrs, instance=False, target=T8, era="2025").notes)
    assert not align_prediction(pred, attrs, instance=False, target=T8, era="2026").notes


def test_without_resampling_semantic_threshold_is_above_zero():
    pred = np.full((10, 10, 10), 0.01, np.float32)
    out = align_prediction(pred, _attrs(), instance=False, target=T8, era="2026").data
    assert out.dtype == np.float32 and (out > 0).all()  # the scorer binarises with > 0


def test_instance_rescale_is_skimage_order0():
    from skimage.transform import rescale

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, (20, 20, 20)).astype(np.uint32)
    out = align_prediction(ids, _attrs(vs=(4, 4, 4)), instance=True, target=T8, era="2026").data
    np.testing.assert_array_equal(out, rescale(ids, 0.5, order=0, mode="constant", preserve_range=True))
    floats = ids.astype(np.float32)  # float ids get anti-aliased (smoothed) by skimage when down-sampling
    smooth = align_prediction(floats, _attrs(vs=(4, 4, 4)), instance=True, target=T8, era="2025").data
    assert not np.array_equal(smooth, out)


def test_2026_size_ratio_limit_is_reported_but_scored():
    pred = np.zeros((170, 170, 170), np.uint8)  # 4913 × the 10³ target
    out = align_prediction(pred, _attrs(vs=(8, 8, 8)), instance=False, target=T8, era="2026")
    assert "16" in out.official_failure or "4096" in out.official_failure


def test_chunked_2026_resampling_is_blockwise(monkeypatch):
    from skimage.transform import rescale

    monkeypatch.setattr(resample, "chunk_edge_2026", lambda: 8)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 4, (16, 16, 16)).astype(np.uint16)
    out = resample.chunked_rescale_2026(ids, np.array([0.5, 0.5, 0.5]), instance=True)
    np.testing.assert_array_equal(out, rescale(ids, 0.5, order=0, preserve_range=True))  # aligned blocks
    probs = rng.random((16, 16, 16)).astype(np.float32)
    sem = resample.chunked_rescale_2026(probs, np.array([0.5, 0.5, 0.5]), instance=False)
    block = rescale(probs[8:, :8, :8], 0.5, order=1, mode="constant", preserve_range=True).astype(np.float32) > 0.5
    np.testing.assert_array_equal(sem[4:, :4, :4], block)  # each block on its own (seams)


def test_non_3d_arrays_are_refused():
    with pytest.raises(BadAttributes, match="3 axes"):
        align_prediction(np.zeros((4, 4)), {}, instance=False, target=T8, era="2025")
