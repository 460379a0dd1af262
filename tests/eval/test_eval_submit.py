"""`write_submission`: predictions of any grid → the official zip at each test crop's geometry."""

import zipfile

import numpy as np
import pytest
import zarr

from cellseg.data.crops import Crop, Geometry
from cellseg.data.write import write_array, write_multiscale
from cellseg.eval import evaluate, load_manifest, validate_submission, write_submission

GEOM = Geometry(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(100.0, 200.0, 300.0), shape_vox=(48, 48, 48))


def _crops(*labels):
    return {7: Crop(id=7, dataset="synthetic", labels=dict.fromkeys(labels, GEOM))}


def _truth(stores, crops):
    return stores.truth(crops, translation=GEOM.translation_nm)


def test_round_trip_from_finer_and_multiscale_predictions(tmp_path, stores, three_balls):
    ids = three_balls.astype(np.uint32) * 300  # ids 300, 600, 900: would wrap in uint8
    er = (three_balls > 0).astype(np.uint8)
    preds = tmp_path / "pred.zarr"
    fine = ids.repeat(2, 0).repeat(2, 1).repeat(2, 2)
    # 8 nm voxel i spans [t + 8i − 4, t + 8i + 4]; its two 4 nm halves are centred at t + 8i ∓ 2
    write_array(preds / "crop7" / "mito", fine, attrs={"voxel_size": [4, 4, 4], "translation": [98.0, 198.0, 298.0]})
    write_multiscale(preds / "crop7" / "er", er, voxel_size_nm=GEOM.voxel_size_nm, translation_nm=GEOM.translation_nm,
                     kind="labels", num_levels=2)
    probs = np.where(three_balls == 1, 0.9, 0.2).astype(np.float32)
    write_array(preds / "crop7" / "ld_lum", probs, attrs={"voxel_size": [8, 8, 8], "translation": list(GEOM.translation_nm)})
    out = tmp_path / "submission.zip"
    report = write_submission(preds, _crops("mito", "er", "ld_lum", "nuc"), out)
    assert sorted(report.written) == ["crop7/er", "crop7/ld_lum", "crop7/mito"] and report.missing == ["crop7/nuc"]
    names = zipfile.ZipFile(out).namelist()
    assert ".zgroup" in names and "crop7/.zgroup" in names and "crop7/mito/.zarray" in names
    truth = _truth(stores, {"crop7": {"mito": ids, "er": er, "ld_lum": (three_balls == 1).astype(np.uint8)}})
    for era in ("2025", "2026"):
        ev = evaluate(out, truth, metric=era)
        assert ev.overall_score == 1.0, (era, ev.notes, ev.array_notes)


def test_written_dtypes_and_attributes(tmp_path):
    preds = tmp_path / "pred.zarr"
    big = np.zeros((48, 48, 48), np.int64)
    big[0, 0, 0] = 70_000
    attrs = {"voxel_size": list(GEOM.voxel_size_nm), "translation": list(GEOM.translation_nm)}
    write_array(preds / "crop7" / "mito", big, attrs=attrs)
    write_array(preds / "crop7" / "er", np.full((48, 48, 48), 3, np.uint16), attrs=attrs)
    out = tmp_path / "s.zip"
    write_submission(preds, _crops("mito", "er"), out)
    store = tmp_path / "unzipped"
    zipfile.ZipFile(out).extractall(store)
    mito, er = zarr.open_array(str(store / "crop7" / "mito")), zarr.open_array(str(store / "crop7" / "er"))
    assert mito.dtype == np.uint32 and mito[0, 0, 0] == 70_000
    assert er.dtype == np.uint8 and set(np.unique(er[...])) == {1}
    assert mito.attrs.asdict() == {"voxel_size": [8.0, 8.0, 8.0], "translation": [100.0, 200.0, 300.0],
                                   "shape": [48, 48, 48]}


def test_refuses_to_overwrite_and_leaves_nothing_behind(tmp_path):
    preds = tmp_path / "pred.zarr"
    write_array(preds / "crop7" / "er", np.ones((48, 48, 48), np.uint8),
                attrs={"voxel_size": [8, 8, 8], "translation": list(GEOM.translation_nm)})
    out = tmp_path / "s.zip"
    write_submission(preds, _crops("er"), out)
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_submission(preds, _crops("er"), out)
    write_submission(preds, _crops("er"), out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.zarr", "s.zip"]


def test_fractional_instance_ids_are_refused(tmp_path):
    preds = tmp_path / "pred.zarr"
    write_array(preds / "crop7" / "mito", np.full((48, 48, 48), 1.5, np.float32),
                attrs={"voxel_size": [8, 8, 8], "translation": list(GEOM.translation_nm)})
    with pytest.raises(ValueError, match="must be integers"):
        write_submission(preds, _crops("mito"), tmp_path / "s.zip")
    assert not (tmp_path / "s.zip").exists()


def test_manifest_round_trip_and_validation(tmp_path):
    manifest = tmp_path / "test_crop_manifest.csv"
    manifest.write_text("crop_name,dataset,class_label,voxel_size,translation,shape\n"
                        "7,synthetic,er,[8.0;8.0;8.0],[100.0;200.0;300.0],[48;48;48]\n")
    crops = load_manifest(manifest)
    assert crops[7].labels["er"] == GEOM
    preds = tmp_path / "pred.zarr"
    write_array(preds / "crop7" / "er", np.ones((48, 48, 48), np.uint8),
                attrs={"voxel_size": [8, 8, 8], "translation": list(GEOM.translation_nm)})
    write_submission(preds, crops, tmp_path / "s.zip")
    issues = validate_submission(tmp_path / "s.zip", crops)
    assert [i for i in issues if i.severity != "info"] == []
