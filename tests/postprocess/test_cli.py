"""`cellseg postprocess` end to end on small probability stores written here."""

from __future__ import annotations

import json

import numpy as np
from blobs import ball

from cellseg.cli import main
from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.target_bits import touching
from cellseg.eval.truth import read_class_truth as read_truth
from cellseg.postprocess.tune import split_entry

ISO = (8.0, 8.0, 8.0)
GRID = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(24, 24, 36), voxel_size_nm=ISO)


def _store(path, kind="probabilities"):
    """One crop: two touching balls of mito (with their boundary channel) and a slab of er."""
    a = ball(GRID.shape_vox, (96, 96, 96), 64.0, ISO)
    b = ball(GRID.shape_vox, (96, 96, 200), 64.0, ISO)
    ids = np.where(a, 1, np.where(b, 2, 0)).astype(np.uint32)
    er = np.zeros(GRID.shape_vox, dtype=bool)
    er[:, :4, :] = True
    store = PredictionStore.create(path, kind=kind, channels=["mito", "mito_boundary", "er"] if kind ==
                                   "probabilities" else ["mito", "er"], instance_channels=["mito"])
    if kind == "probabilities":
        arrays = {"mito": np.where(ids > 0, 0.9, 0.05), "mito_boundary": np.where(touching(ids), 0.9, 0.05),
                  "er": np.where(er, 0.8, 0.1)}
        arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    else:
        arrays = {"mito": ids, "er": er}
    store.write_crop("crop7", GRID, arrays, attrs={"dataset": "jrc_test-1"})
    return store


def test_postprocess_writes_a_segmentation_store_and_resumes(tmp_path, capsys):
    pred = _store(tmp_path / "pred.zarr")
    out = tmp_path / "seg.zarr"
    assert main(["postprocess", str(pred.path), "--out", str(out), "--device", "cpu"]) == 0
    seg = PredictionStore.open(out)
    assert seg.kind == "segmentation" and seg.channels == ("mito", "er") and seg.instance_channels == ("mito",)
    mito, er = seg.read("crop7", "mito"), seg.read("crop7", "er")
    assert mito.dtype == np.uint32 and mito.max() == 2  # the boundary channel split the touching balls
    assert er.dtype == np.uint8 and set(np.unique(er)) == {0, 1} and er[:, :4].all()
    attrs = seg.crop_attrs("crop7")
    assert attrs["dataset"] == "jrc_test-1" and attrs["postprocess"]["objects"] == {"mito": 2}
    assert seg.provenance["postprocess"]["classes"]["mito"]["seed_distance_nm"] == 0.0
    # same settings: resumes (nothing left to do); other settings: refuses without --overwrite
    assert main(["postprocess", str(pred.path), "--out", str(out), "--device", "cpu"]) == 0
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"format": "cellseg-postprocess-params", "version": 1,
                                  "classes": {"mito": {"use_boundary": False}, "er": {"threshold": 0.9}}}))
    capsys.readouterr()
    assert main(["postprocess", str(pred.path), "--out", str(out), "--params", str(params), "--device", "cpu"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["postprocess", str(pred.path), "--out", str(out), "--params", str(params), "--device", "cpu",
                 "--overwrite"]) == 0
    seg = PredictionStore.open(out)
    assert seg.read("crop7", "mito").max() == 1 and not seg.read("crop7", "er").any()


def test_bad_inputs_are_clear_errors(tmp_path, capsys):
    pred = _store(tmp_path / "pred.zarr")
    seg = _store(tmp_path / "already.zarr", kind="segmentation")
    (tmp_path / "plain").mkdir()
    params = tmp_path / "params.json"

    def error(*argv: str) -> str:
        capsys.readouterr()
        assert main(["postprocess", *argv, "--device", "cpu"]) == 2
        return capsys.readouterr().err

    assert "holds segmentation, not probabilities" in error(str(seg.path), "--out", str(tmp_path / "o1"))
    assert "not a cellseg prediction store" in error(str(tmp_path / "plain"), "--out", str(tmp_path / "o2"))
    params.write_text(json.dumps({"format": "cellseg-postprocess-params", "version": 1,
                                  "classes": {"nuc": {"threshold": 0.3}}}))
    message = error(str(pred.path), "--out", str(tmp_path / "o3"), "--params", str(params))
    assert f"{params}: classes ['nuc'] are not classes of {pred.path}" in message and "['mito', 'er']" in message
    params.write_text(json.dumps({"format": "cellseg-postprocess-params", "version": 1,
                                  "classes": {"mitochondria": {}}}))
    assert "unknown CellMap class 'mitochondria'" in error(str(pred.path), "--out", str(tmp_path / "o4"),
                                                             "--params", str(params))
    assert "needs --tune-on" in error(str(pred.path), "--out", str(tmp_path / "o5"), "--crops", "1")
    assert not any((tmp_path / f"o{k}").exists() for k in range(1, 6))


def test_tune_on_a_synthetic_root(tiny_synth_root, tmp_path, capsys):
    """Probabilities made from the truth of two crops: tuning writes the parameter file, then segments."""
    catalog = Catalog.from_dir(tiny_synth_root)
    store = PredictionStore.create(tmp_path / "pred.zarr", kind="probabilities",
                                   channels=["mito", "mito_boundary", "er"], instance_channels=["mito"])
    rng = np.random.default_rng(0)
    for crop_id in (1, 3):
        geometry = catalog.train[crop_id].labels["mito"]
        grid = Grid(translation_nm=geometry.translation_nm, shape_vox=geometry.shape_vox,
                    voxel_size_nm=geometry.voxel_size_nm)
        entry = split_entry(catalog, crop_id)
        ids, _ = read_truth(entry, "mito", grid)
        er, _ = read_truth(entry, "er", grid)
        noise = rng.uniform(-0.05, 0.05, size=ids.shape)
        store.write_crop(f"crop{crop_id}", grid, {
            "mito": (np.where(ids > 0, 0.8, 0.1) + noise).astype(np.float32),
            "mito_boundary": np.where(touching(ids), 0.9, 0.05).astype(np.float32),
            "er": (np.where(er, 0.35, 0.15) + noise).astype(np.float32)})  # under-confident: 0.5 misses it all
    out = tmp_path / "seg.zarr"
    assert main(["postprocess", str(store.path), "--out", str(out), "--tune-on", str(tiny_synth_root),
                 "--crops", "1", "crop3", "--metric", "2026", "--device", "cpu"]) == 0
    assert "wrote" in capsys.readouterr().out
    params = json.loads((tmp_path / "seg.zarr.params.json").read_text())
    assert params["era"] == "2026" and params["tuned_on"]["crops"] == ["crop1", "crop3"]
    assert params["classes"]["er"]["threshold"] < 0.35 and params["classes"]["er"]["score"] > 0.9
    assert params["classes"]["er"]["default_score"] < 0.1
    assert params["classes"]["mito"]["score"] >= params["classes"]["mito"]["default_score"]
    seg = PredictionStore.open(out)
    assert seg.completed() == ["crop1", "crop3"] and seg.read("crop1", "er").any()
    capsys.readouterr()
    assert main(["postprocess", str(store.path), "--out", str(tmp_path / "x.zarr"), "--tune-on",
                 str(tiny_synth_root), "--crops", "99", "--device", "cpu"]) == 2
    assert "crop99" in capsys.readouterr().err


def test_classes_in_parallel_give_the_same_segmentation(tmp_path):
    """Several classes of a crop read, segmented and written on threads: the store equals the one-thread one."""
    from cellseg.postprocess.apply import class_workers, postprocess_store
    from cellseg.postprocess.params import ParamSet

    pred = _store(tmp_path / "pred.zarr")
    one = postprocess_store(pred, tmp_path / "one.zarr", params=ParamSet(), device="cpu", progress=False, workers=1)
    three = postprocess_store(pred, tmp_path / "three.zarr", params=ParamSet(), device="cpu", progress=False,
                              workers=3)
    for channel in one.channels:
        np.testing.assert_array_equal(three.read("crop7", channel), one.read("crop7", channel))
    assert three.crop_attrs("crop7")["postprocess"]["objects"] == {"mito": 2}
    assert 1 <= class_workers(1000**3) <= 2  # 12 GB a class in flight: 32 GiB hold two
