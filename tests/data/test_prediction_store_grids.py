"""Prediction stores whose channels lie on their own grids (labels of one crop annotated at different grids)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore

COARSE = Grid.of(translation_nm=(4, 4, 4), shape_vox=(6, 7, 8), voxel_size_nm=(8, 8, 8))
FINE = Grid.of(translation_nm=(1, 1, 1), shape_vox=(24, 28, 32), voxel_size_nm=(2, 2, 2))


def _store(path):
    return PredictionStore.create(path, kind="segmentation", channels=["mito", "er", "nuc"],
                                  instance_channels=["mito", "nuc"])


def test_channels_on_their_own_grids_round_trip(tmp_path):
    store = _store(tmp_path / "seg.zarr")
    ids = np.arange(np.prod(FINE.shape_vox), dtype=np.uint32).reshape(FINE.shape_vox) % 5
    er = np.zeros(COARSE.shape_vox, bool)
    er[2:4] = True
    nuc = np.ones(COARSE.shape_vox, np.uint32)
    store.write_crop("crop3", COARSE, {"mito": ids, "er": er, "nuc": nuc}, grids={"mito": FINE, "er": COARSE})
    assert store.grid("crop3") == COARSE and store.grid("crop3", "er") == COARSE and store.grid("crop3", "nuc") == COARSE
    assert store.grid("crop3", "mito") == FINE
    assert np.array_equal(store.read("crop3", "mito"), ids) and np.array_equal(store.read("crop3", "er"), er)
    attrs = json.loads((store.path / "crop3" / ".zattrs").read_text())["cellseg_crop"]
    assert set(attrs["channel_grids"]) == {"mito"}  # only the channels whose grid differs from the crop's
    level = MultiscaleImage(str(store.path / "crop3" / "mito")).levels[0]  # the OME-NGFF metadata follows it
    assert level.voxel_size_nm == FINE.voxel_size_nm and level.translation_nm == FINE.translation_nm


def test_slabs_of_a_channel_on_its_own_grid_and_resume(tmp_path):
    store = _store(tmp_path / "seg.zarr")
    writer = store.crop_writer("crop3", COARSE, channels=["mito", "er"], grids={"mito": FINE}, key="k")
    ids = np.arange(np.prod(FINE.shape_vox), dtype=np.uint32).reshape(FINE.shape_vox)
    writer.write("mito", ids[:10])
    writer.mark_done("first slab")
    again = store.crop_writer("crop3", COARSE, channels=["mito", "er"], grids={"mito": FINE}, key="k")
    assert again.done == {"first slab"}  # same grids: resumed
    other = store.crop_writer("crop3", COARSE, channels=["mito", "er"], key="k")
    assert other.done == frozenset()  # other grids: started over
    other = store.crop_writer("crop3", COARSE, channels=["mito", "er"], grids={"mito": FINE}, key="k")
    other.write("mito", ids[:10])
    other.write("mito", ids[10:], offset=(10, 0, 0))
    other.write("er", np.zeros(COARSE.shape_vox, bool))
    with pytest.raises(ValueError, match="not inside the grid"):
        other.write("er", np.zeros(FINE.shape_vox, bool))
    other.commit()
    assert np.array_equal(store.read("crop3", "mito"), ids) and store.crop_channels("crop3") == ("mito", "er")


def test_grids_of_channels_the_crop_lacks_are_refused(tmp_path):
    store = _store(tmp_path / "seg.zarr")
    with pytest.raises(ValueError, match=r"grids given for \['nuc'\]"):
        store.crop_writer("crop3", COARSE, channels=["mito", "er"], grids={"nuc": FINE})
    with pytest.raises(ValueError, match="differs from the grid"):
        store.write_crop("crop3", COARSE, {"mito": np.zeros(COARSE.shape_vox, np.uint32),
                                           "er": np.zeros(COARSE.shape_vox, bool),
                                           "nuc": np.zeros(COARSE.shape_vox, np.uint32)}, grids={"mito": FINE})
