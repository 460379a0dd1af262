"""`cellseg postprocess --grid annotation`, then `submit`, then `evaluate`, on the tiny synthetic root: every
class lands on its test crop's grid, the submission copies it unchanged, and it scores at least as well as the
model-grid segmentation upsampled by nearest neighbour."""

from __future__ import annotations

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.data.crops import Catalog, Geometry
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.eval.report import to_json
from cellseg.eval.score import evaluate
from cellseg.eval.submit import read_single_scale
from cellseg.postprocess.annotation import AnnotationGrids, to_grid
from cellseg.postprocess.native import segment_class
from cellseg.postprocess.params import default_params

CLASSES = ("mito", "er", "nuc")
MODEL_NM = 8.0


def _model_grid(geometry: Geometry) -> Grid:
    """The test crop's box on an 8 nm grid (as `cellseg predict` covers it)."""
    start = np.asarray(geometry.start_nm)
    shape = np.maximum(1, np.round((np.asarray(geometry.stop_nm) - start) / MODEL_NM)).astype(int)
    return Grid.of(translation_nm=start + MODEL_NM / 2, shape_vox=shape, voxel_size_nm=(MODEL_NM,) * 3)


def _probability(root, crop: str, label: str, grid: Grid) -> np.ndarray:
    """The truth's area fraction on `grid`: a soft probability whose 0.5 level set is the truth's boundary."""
    import zarr

    truth = zarr.open_array(str(root / "ground_truth.zarr" / crop / label), mode="r")
    mask = (np.asarray(truth[...]) > 0).astype(np.float32)
    target = Geometry(voxel_size_nm=grid.voxel_size_nm, translation_nm=grid.translation_nm, shape_vox=grid.shape_vox)
    step = grid.voxel_size_nm[0] / float(truth.attrs["voxel_size"][0])
    return read_single_scale(mask, tuple(truth.attrs["voxel_size"]), tuple(truth.attrs["translation"]), target,
                             "area" if step > 1 else "linear").astype(np.float32)


@pytest.fixture(scope="module")
def probabilities(tiny_synth_root, tmp_path_factory):
    tests = Catalog.from_dir(tiny_synth_root).test()
    store = PredictionStore.create(tmp_path_factory.mktemp("native") / "prob.zarr", kind="probabilities",
                                   channels=list(CLASSES), instance_channels=["mito", "nuc"],
                                   provenance={"data_root": str(tiny_synth_root)})
    for crop in tests.values():
        grid = _model_grid(crop.labels["mito"])
        store.write_crop(crop.name, grid, {c: _probability(tiny_synth_root, crop.name, c, grid) for c in CLASSES},
                         attrs={"split": "test", "dataset": crop.dataset})
    return store


def _scores(zip_path, root) -> dict[str, float]:
    doc = to_json(evaluate(zip_path, root / "ground_truth.zarr", metric="2026"))
    return {c: doc["label_scores"][c]["iou" if c == "er" else "combined_score"] for c in CLASSES}


def test_annotation_grids_then_submit_then_evaluate(probabilities, tiny_synth_root, tmp_path):
    import zarr

    manifest, tests = tiny_synth_root / "test_crop_manifest.csv", Catalog.from_dir(tiny_synth_root).test()
    scores = {}
    for mode in ("annotation", "model"):
        seg_path, sub = tmp_path / f"seg_{mode}.zarr", tmp_path / f"sub_{mode}.zip"
        assert main(["postprocess", str(probabilities.path), "--out", str(seg_path), "--device", "cpu",
                     "--grid", mode]) == 0
        assert main(["submit", str(seg_path), "--manifest", str(manifest), "--out", str(sub), "--labels",
                     *CLASSES]) == 0
        seg = PredictionStore.open(seg_path)
        for crop in tests.values():
            for label in CLASSES:
                model = probabilities.grid(crop.name)
                if mode == "model":  # today's path, voxel for voxel
                    assert seg.grid(crop.name, label) == model
                    expected = segment_class(label, probabilities.read(crop.name, label), None,
                                             voxel_size_nm=model.voxel_size_nm, params=default_params(label))
                    assert np.array_equal(seg.read(crop.name, label), expected)
                    continue
                assert seg.grid(crop.name, label) == to_grid(crop.labels[label])
                submitted = zarr.open(str(sub), mode="r")[f"{crop.name}/{label}"]
                assert np.array_equal(submitted[...], seg.read(crop.name, label))  # copied, not resampled
        scores[mode] = _scores(sub, tiny_synth_root)
    assert sum(scores["annotation"].values()) >= sum(scores["model"].values())
    assert scores["annotation"]["er"] > scores["model"]["er"]


def test_annotation_grids_of_training_crops_come_from_the_label_arrays(tiny_synth_root, tmp_path):
    catalog = Catalog.from_dir(tiny_synth_root)
    crop = next(c for c in catalog.train.values() if "mito" in c.labels)
    grid = _model_grid(crop.labels["mito"])
    store = PredictionStore.create(tmp_path / "p.zarr", kind="probabilities", channels=["mito", "ld"],
                                   instance_channels=["mito", "ld"])
    store.write_crop(crop.name, grid, {c: np.zeros(grid.shape_vox, np.float32) for c in ("mito", "ld")},
                     attrs={"split": "validate"})
    grids = AnnotationGrids(str(tiny_synth_root)).of(store, crop.name, ["mito", "ld"])
    assert grids["mito"] == to_grid(crop.labels["mito"])
    assert AnnotationGrids(None).of(store, crop.name, ["mito"]) == {"mito": grid}  # no data root: the model's
