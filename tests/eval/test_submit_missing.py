"""Labels the predictions lack: `write_submission` writes empty arrays (or, `allow_missing`, leaves them out),
an empty array scores at least as well as a missing one in both eras, and `validate_submission` reports a
missing label as an error with its cost in each era."""

import zipfile

import numpy as np
import pytest
import zarr
from eval_helpers import THREE_BALLS, balls

from cellseg.data.crops import Crop, Geometry
from cellseg.data.write import write_array, write_multiscale
from cellseg.eval import evaluate, validate_submission, write_submission
from cellseg.eval.io import open_source
from cellseg.eval.missing import missing_costs
from cellseg.eval.submit import EmptySubmission

VS = (8.0, 8.0, 8.0)
SMALL = Geometry(voxel_size_nm=VS, translation_nm=(0.0, 0.0, 0.0), shape_vox=(32, 32, 32))  # 32,768 voxels
LARGE = Geometry(voxel_size_nm=VS, translation_nm=(0.0, 0.0, 0.0), shape_vox=(64, 64, 64))  # 262,144 voxels
LABELS = ("er", "mito", "perox_mem")
CROPS = {1: Crop(id=1, dataset="s", labels=dict.fromkeys(LABELS, SMALL)),
         2: Crop(id=2, dataset="s", labels=dict.fromkeys(LABELS, LARGE))}
ATTRS = {"voxel_size": list(VS), "translation": [0.0, 0.0, 0.0]}
SMALL_BALLS = [((8, 8, 8), 4), ((22, 22, 10), 5), ((10, 22, 22), 4)]


def _slab(shape, depth):
    out = np.zeros(shape, np.uint8)
    out[:depth] = 1
    return out


def _truth(stores):
    """er: a slab in both crops; mito: 3 balls in both; perox_mem: a slab on crop 1 only (none on crop 2)."""
    return stores.truth({
        "crop1": {"er": _slab(SMALL.shape_vox, 8), "mito": balls(SMALL.shape_vox, SMALL_BALLS),
                  "perox_mem": _slab(SMALL.shape_vox, 4)},
        "crop2": {"er": _slab(LARGE.shape_vox, 8), "mito": balls(LARGE.shape_vox, THREE_BALLS),
                  "perox_mem": np.zeros(LARGE.shape_vox, np.uint8)}})


def _predictions(root):
    """Crop 1 only: er and perox_mem at IoU 0.5 (half of each slab), mito perfect; crop 2 lacks everything."""
    write_array(root / "crop1" / "er", _slab(SMALL.shape_vox, 4), attrs=ATTRS)
    write_array(root / "crop1" / "perox_mem", _slab(SMALL.shape_vox, 2), attrs=ATTRS)
    write_array(root / "crop1" / "mito", balls(SMALL.shape_vox, SMALL_BALLS), attrs=ATTRS)
    return root


def _submissions(tmp_path):
    preds = _predictions(tmp_path / "pred.zarr")
    with pytest.raises(EmptySubmission, match=r"crop2 \(er, mito, perox_mem\)"):  # as `cellseg submit` calls it
        write_submission(preds, CROPS, tmp_path / "empty.zip", allow_empty=False)
    assert not (tmp_path / "empty.zip").exists()
    empty = write_submission(preds, CROPS, tmp_path / "empty.zip")  # crop 2: all empty arrays, scored
    missing = write_submission(preds, CROPS, tmp_path / "missing.zip", allow_missing=True)
    return empty, missing


def test_lacking_labels_are_written_empty_by_default(tmp_path):
    empty, missing = _submissions(tmp_path)
    lacking = ["crop2/er", "crop2/mito", "crop2/perox_mem"]
    assert empty.written == missing.written == ["crop1/er", "crop1/mito", "crop1/perox_mem"]
    assert empty.missing == missing.missing == lacking
    assert empty.empty == lacking and missing.empty == []
    store = tmp_path / "unzipped"
    zipfile.ZipFile(tmp_path / "empty.zip").extractall(store)
    for label, dtype in (("er", np.uint8), ("perox_mem", np.uint8), ("mito", np.uint16)):
        array = zarr.open_array(str(store / "crop2" / label), mode="r")
        assert array.dtype == dtype and array.shape == LARGE.shape_vox and not array[...].any()
        assert array.attrs.asdict() == {"voxel_size": [8.0, 8.0, 8.0], "translation": [0.0, 0.0, 0.0],
                                        "shape": [64, 64, 64]}
    names = zipfile.ZipFile(tmp_path / "empty.zip").namelist()
    assert [n for n in names if n.startswith("crop2/er/")] == ["crop2/er/.zarray", "crop2/er/.zattrs"]  # no chunk
    assert not [n for n in zipfile.ZipFile(tmp_path / "missing.zip").namelist() if n.startswith("crop2/er")]


def _scores(tmp_path, stores, era):
    truth = _truth(stores)
    return (evaluate(tmp_path / "missing.zip", truth, metric=era),
            evaluate(tmp_path / "empty.zip", truth, metric=era))


def test_empty_scores_above_missing_in_2026(tmp_path, stores):
    _submissions(tmp_path)
    missing, empty = _scores(tmp_path, stores, "2026")
    # er: TP 4096, FN 4096 on crop 1; crop 2 adds all its 262,144 voxels (missing) or its 32,768 true ones (empty)
    assert missing.label_scores["er"]["iou"] == pytest.approx(4096 / (8192 + 262_144))  # 0.0152
    assert empty.label_scores["er"]["iou"] == pytest.approx(4096 / (8192 + 32_768))  # 0.1
    # perox_mem: crop 2 has none; missing adds its every voxel, empty adds nothing
    assert missing.label_scores["perox_mem"]["iou"] == pytest.approx(2048 / (4096 + 262_144))  # 0.0077
    assert empty.label_scores["perox_mem"]["iou"] == pytest.approx(0.5)
    # mito: 3 of 6 objects missed either way (F1 2/3); their Hausdorff entries are 0 (missing) or the
    # normalised cap of crop 2, 1.01^(−256 nm / ‖(8, 8, 8)‖) = 0.832 (empty)
    cap_entry = 1.01 ** (-256 / np.linalg.norm(VS))
    assert missing.label_scores["mito"]["combined_score"] == pytest.approx(np.sqrt(2 / 3 * 0.5))  # 0.577
    assert empty.label_scores["mito"]["combined_score"] == pytest.approx(
        np.sqrt(2 / 3 * (3 + 3 * cap_entry) / 6), rel=1e-6)  # 0.781
    assert missing.overall_score == pytest.approx(0.0812, abs=1e-4)
    assert empty.overall_score == pytest.approx(0.4842, abs=1e-4)


def test_empty_scores_at_least_missing_in_2025(tmp_path, stores):
    _submissions(tmp_path)
    missing, empty = _scores(tmp_path, stores, "2025")
    # crop 2 holds 8/9 of each class's volume weight (nm³); crop 1 scores 0.5 (er, perox_mem) and 1 (mito)
    assert missing.label_scores["er"]["iou"] == empty.label_scores["er"]["iou"] == pytest.approx(0.5 / 9)
    assert missing.label_scores["perox_mem"]["iou"] == pytest.approx(0.5 / 9)
    assert empty.label_scores["perox_mem"]["iou"] == pytest.approx(0.5 / 9 + 8 / 9)  # both empty: IoU 1
    background = 1 - np.count_nonzero(balls(LARGE.shape_vox, THREE_BALLS)) / LARGE.num_voxels
    mito = 1 / 9 + 8 / 9 * np.sqrt(background)  # no object predicted: Hausdorff 0, sqrt(accuracy) on crop 2
    assert missing.label_scores["mito"]["combined_score"] == pytest.approx(1 / 9)
    assert empty.label_scores["mito"]["combined_score"] == pytest.approx(mito)  # 0.9967
    assert missing.overall_score == pytest.approx(np.sqrt(1 / 9 * 0.5 / 9))  # 0.0786
    assert empty.overall_score == pytest.approx(np.sqrt(mito * (0.5 / 9 + 0.5 / 9 + 8 / 9) / 2))  # 0.7059


def test_missing_costs_from_the_manifest():
    costs = missing_costs(CROPS)
    er, mito = costs["crop2/er"], costs["crop2/mito"]
    assert er.volume_share == pytest.approx(8 / 9) and er.voxel_share == pytest.approx(8 / 9)
    assert er.num_voxels == 262_144 and costs["crop1/er"].volume_share == pytest.approx(1 / 9)
    assert mito.empty_hausdorff == pytest.approx(1.01 ** (-256 / np.linalg.norm(VS)), rel=1e-6)
    assert "262,144 voxels of the crop become false negatives of er (88.9%" in er.describe()
    assert "er scores at most 0.111" in er.describe() and "at most 0.111)" in er.describe()
    assert "entries of 0.832" in mito.describe()


def test_validate_reports_missing_labels_with_their_cost(tmp_path, stores):
    _submissions(tmp_path)
    issues = validate_submission(tmp_path / "missing.zip", CROPS)
    errors = [i for i in issues if i.severity == "error"]
    assert [i.where for i in errors] == ["crop2/er", "crop2/mito", "crop2/perox_mem"]
    assert "2025: scores 0 on a crop holding 88.9% of er's volume weight" in errors[0].message
    assert "2026: all 262,144 voxels of the crop become false negatives of er" in errors[0].message
    assert "every true mito object of the crop is missed" in errors[1].message
    allowed = validate_submission(tmp_path / "missing.zip", CROPS, allow_missing=True)
    assert not [i for i in allowed if i.severity == "error"]
    assert [i.where for i in allowed if "allowed by --allow-missing" in i.message] == [i.where for i in errors]
    truth = open_source(_truth(stores))
    assert [i for i in validate_submission(tmp_path / "empty.zip", CROPS, truth=truth, allow_empty=True)
            if i.severity not in ("info", "warning")] == []
    refused = [i for i in validate_submission(tmp_path / "empty.zip", CROPS, truth=truth) if i.severity == "error"]
    assert [i.where for i in refused] == ["crop2"] and "every one of its 3 arrays is all zeros" in refused[0].message


def test_a_label_written_as_a_group_stays_an_error(tmp_path):
    _submissions(tmp_path)
    store = tmp_path / "unzipped.zarr"
    zipfile.ZipFile(tmp_path / "missing.zip").extractall(store)
    write_multiscale(store / "crop2" / "er", _slab(LARGE.shape_vox, 8), voxel_size_nm=VS, translation_nm=(0, 0, 0),
                     kind="labels", num_levels=1)
    issues = validate_submission(store, CROPS, allow_missing=True)
    group = [i for i in issues if i.where == "crop2/er"]
    assert len(group) == 1 and group[0].severity == "error" and "written as a group" in group[0].message
    assert "write a single-scale array" in group[0].message and "2026: all 262,144 voxels" in group[0].message


def test_validate_reports_each_label_of_a_missing_crop(tmp_path):
    _submissions(tmp_path)
    third = Crop(id=3, dataset="s", labels={"er": SMALL, "mito": SMALL})
    issues = validate_submission(tmp_path / "empty.zip", {**CROPS, 3: third}, allow_empty=True)
    assert [(i.severity, i.where) for i in issues if i.severity != "info"] == [
        ("warning", "crop2"), ("error", "crop3"), ("error", "crop3/er"), ("error", "crop3/mito")]  # crop 2: all
    # zeros, allowed
    assert "label absent (crop missing); scored as missing" in issues[-1].message
