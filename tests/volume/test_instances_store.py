"""The three instance steps and the label pyramid on a real whole-volume store (`cellseg.volume.store` layout):
the blockwise ids and masks equal one-piece decoding, and the face records and lookup lie under `.stitch/`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_volumes import probabilities, touching, truth_volume

from cellseg.data.write import downsample_2x
from cellseg.postprocess import InstanceParams, ParamSet, SemanticParams, segment_instances, segment_semantic
from cellseg.volume.instances import (
    decode_store_block,
    dequantise,
    face_record_dir,
    load_lookup,
    merge_store,
    relabel_store_block,
    store_voxel_size,
)
from cellseg.volume.pyramid import downsample_store_block, level_positions
from cellseg.volume.store import VolumeStore, roi_grid

BLOCK = (16, 16, 16)


def test_store_steps_equal_one_piece_decoding(tmp_path: Path) -> None:
    truth = truth_volume(0)[0]
    mito, er = truth["mito"][:48, 16:64, 8:56], truth["er"][:48, 16:64, 8:56]
    grid = roi_grid((0.0, 64.0, 32.0), (48 * 4.0,) * 3, (4.0, 4.0, 4.0))
    store = VolumeStore.create(tmp_path / "out.zarr", dataset="synth-iso4-1", data_root="/data", grid=grid,
                               block_vox=BLOCK, chunk_vox=(8, 8, 8), classes=["mito", "er"],
                               channels=["mito", "er", "mito_boundary"], instance_classes=["mito"], instances=True,
                               num_levels=2)
    chans = {"mito": probabilities(mito > 0, seed=1), "er": probabilities(er > 0, seed=2),
             "mito_boundary": probabilities(touching(mito), seed=3)}
    for name, data in chans.items():
        store.array("probabilities", name, 0)[...] = data
    params = ParamSet({"mito": InstanceParams(seed_distance_nm=8.0, min_size_nm3=10 * 64.0),
                       "er": SemanticParams(threshold=0.5)})
    assert store_voxel_size(store.path, "mito") == (4.0, 4.0, 4.0)
    offsets = [tuple(p * b for p, b in zip(pos, BLOCK, strict=True)) for pos in level_positions((48,) * 3, BLOCK)]
    for offset in offsets:
        for name in ("mito", "er"):
            decode_store_block(store.path, name, offset, block_vox=BLOCK, params=params)
    assert len(list(face_record_dir(store.path, "mito").glob("*.npz"))) == len(offsets)
    lookup = merge_store(store.path, "mito", block_vox=BLOCK, params=params)
    assert load_lookup(face_record_dir(store.path, "mito")).objects == lookup.objects
    for offset in offsets:
        relabel_store_block(store.path, "mito", offset, block_vox=BLOCK, lookup=lookup)

    ids = store.array("labels", "mito", 0)[...]
    ref = segment_instances(dequantise(chans["mito"]), dequantise(chans["mito_boundary"]), voxel_size_nm=(4, 4, 4),
                            params=params.get("mito"))
    assert ref.max() >= 3 and ids.max() == lookup.objects == ref.max()
    pairs = np.unique(np.stack([ids.ravel(), ref.ravel().astype(np.uint64)]), axis=1)
    assert pairs.shape[1] == ref.max() + 1  # one id of ours per object of the one-piece decoding, and back
    mask = store.array("labels", "er", 0)[...]
    assert np.array_equal(mask, segment_semantic(dequantise(chans["er"]), voxel_size_nm=(4, 4, 4),
                                                 params=params.get("er")).astype(np.uint8))

    group = store.path / "labels" / "mito"
    for pos in level_positions((24, 24, 24), BLOCK):
        downsample_store_block(group, 1, [p * b for p, b in zip(pos, BLOCK, strict=True)], block_vox=BLOCK)
        downsample_store_block(store.path / "labels" / "er", 1, [p * b for p, b in zip(pos, BLOCK, strict=True)],
                               block_vox=BLOCK)
    assert np.array_equal(store.array("labels", "mito", 1)[...], ids[::2, ::2, ::2])  # stride for ids
    assert np.array_equal(store.array("labels", "er", 1)[...], downsample_2x(mask, "labels"))  # mode for masks


def test_misaligned_block_and_missing_labels_are_refused(tmp_path: Path) -> None:
    grid = roi_grid((0.0, 0.0, 0.0), (32 * 8.0,) * 3, (8.0, 8.0, 8.0))
    store = VolumeStore.create(tmp_path / "a.zarr", dataset="d", data_root="/data", grid=grid, block_vox=BLOCK,
                               chunk_vox=(16, 16, 16), classes=["mito"], instance_classes=["mito"], instances=True)
    with pytest.raises(ValueError, match="not a multiple of its chunks"):
        decode_store_block(store.path, "mito", (0, 0, 0), block_vox=(8, 8, 8), params=ParamSet())
    with pytest.raises(ValueError, match="not the corner of a block"):
        decode_store_block(store.path, "mito", (8, 0, 0), block_vox=BLOCK, params=ParamSet())
    bare = VolumeStore.create(tmp_path / "b.zarr", dataset="d", data_root="/data", grid=grid, block_vox=BLOCK,
                              chunk_vox=(16, 16, 16), classes=["mito"])
    with pytest.raises(FileNotFoundError, match="no label array"):
        decode_store_block(bare.path, "mito", (0, 0, 0), block_vox=BLOCK, params=ParamSet())
    with pytest.raises(FileNotFoundError, match="merge step has not run"):
        relabel_store_block(store.path, "mito", (0, 0, 0), block_vox=BLOCK)
