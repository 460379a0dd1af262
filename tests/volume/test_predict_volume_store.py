"""The whole-volume store (`cellseg.volume.store`): layout, NGFF levels, resume rules, refusal of other stores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cellseg.config.volume import VolumeConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.write import artifact_kind
from cellseg.volume.store import VolumeStore, roi_grid

GRID = roi_grid((80.0, 0.0, 160.0), (64 * 8, 128 * 8, 100 * 8), (8.0, 8.0, 8.0))


def _create(path: Path, **kw) -> VolumeStore:
    args = dict(dataset="ds", data_root="/data", grid=GRID, block_vox=(64, 64, 64), classes=["mito", "er"],
                instance_classes=["mito"], instances=True, tta=1)
    return VolumeStore.create(path, **{**args, **kw})


def test_layout_levels_and_world_coordinates(tmp_path: Path) -> None:
    store = _create(tmp_path / "out.zarr")
    assert artifact_kind(store.path) == "volume prediction store"
    assert store.grid == GRID and store.num_levels == 3
    probs = store.array("probabilities", "er", 0)
    assert probs.dtype == np.uint8 and probs.shape == (64, 128, 100) and probs.chunks == (64, 64, 64)
    assert store.array("labels", "mito", 0).dtype == np.uint64
    assert store.array("labels", "er", 0).dtype == np.uint8
    assert store.array("probabilities", "er", 2).shape == (16, 32, 25)
    probs[0:64, 64:128, 0:64] = 7  # a block written into place, then read back in world coordinates
    em = MultiscaleImage(store.path / "probabilities" / "er")
    assert [lv.path for lv in em.levels] == ["s0", "s1", "s2"]
    assert em.levels[0].translation_nm == (84.0, 4.0, 164.0)  # voxel centres: the ROI offset + half a voxel
    assert em.levels[1].voxel_size_nm == (16.0, 16.0, 16.0)
    read = em.read(translation_nm=(84.0, 64 * 8 + 4.0, 164.0), shape_vox=(2, 2, 2), voxel_size_nm=(8, 8, 8))
    assert (read == 7).all()
    labels = json.loads((store.path / "labels" / "mito" / ".zattrs").read_text())
    assert "image-label" in labels and labels["multiscales"][0]["axes"][0]["unit"] == "nanometer"


def test_resume_and_refusals(tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    _create(out)
    with pytest.raises(FileExistsError, match="--resume"):
        _create(out)
    assert _create(out, resume=True).attrs["classes"] == ["mito", "er"]
    with pytest.raises(ValueError, match="tta"):
        _create(out, tta=8, resume=True)
    with pytest.raises(ValueError, match="whole number of 64-voxel chunks"):
        _create(tmp_path / "other.zarr", block_vox=(96, 64, 64))
    crops = PredictionStore.create(tmp_path / "crops.zarr", kind="probabilities", channels=["mito"])
    with pytest.raises(ValueError, match="probabilities store, not a volume"):
        _create(crops.path, resume=True)
    assert (crops.path / ".zattrs").is_file()  # left as it was


def test_block_shapes_cubes_and_columns() -> None:
    assert VolumeConfig(block_vox=64).block_shape(100) == (64, 64, 64)
    assert VolumeConfig(block_vox=64, block_z_vox=0).block_shape(100) == (128, 64, 64)  # whole depth, whole chunks
    assert VolumeConfig(block_vox=64, block_z_vox=192).block_shape(100) == (192, 64, 64)
    with pytest.raises(ValueError, match="block_z_vox=-64"):
        VolumeConfig(block_z_vox=-64)
