"""Instances and masks decoded block by block (`cellseg.volume.instances`) against decoding the volume in one
piece, on whole synthetic volumes (`cellseg.synth`, tiny preset) and on crafted touching objects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth_volumes import probabilities, touching, truth_volume

from cellseg.postprocess import InstanceParams, ParamSet, SemanticParams, segment_instances, segment_semantic
from cellseg.postprocess.hierarchy import edited_probability
from cellseg.postprocess.spec import min_voxels
from cellseg.volume.instances import (
    PROVISIONAL,
    BlockGrid,
    decode_block,
    dequantise,
    load_lookup,
    merge_faces,
    relabel_block,
)

VOXEL = (4.0, 4.0, 4.0)  # dataset 0 of the tiny preset


def blockwise(channels: dict[str, np.ndarray], name: str, params: ParamSet, block: int, records: Path, *,
              voxel=VOXEL, halo=None) -> tuple[np.ndarray, int]:
    """Steps 1-3 over every block, on numpy arrays; the final labels and the merge's object count."""
    shape = channels[name].shape
    grid = BlockGrid(shape, (block,) * 3)
    instance = name in ("mito", "ves", "cell")
    labels = np.zeros(shape, np.uint64 if instance else np.uint8)

    def read(channel, box):
        return dequantise(channels[channel][box])

    for pos in grid.positions():
        decode_block(read, labels, grid, pos, class_name=name, params=params, voxel_size_nm=voxel,
                     channels=list(channels), records=records, halo_vox=halo)
    if not instance:
        return labels, 0
    lookup = merge_faces(records, grid, min_size_voxels=min_voxels(params.get(name).min_size_nm3, voxel))
    for pos in grid.positions():
        relabel_block(labels, grid, pos, lookup)
    return labels, lookup.objects


def pairing(ref: np.ndarray, got: np.ndarray) -> tuple[int, int, bool]:
    """(objects of `ref` matched by one of `got` at IoU ≥ 0.99, objects of `ref`, whether the two are the same
    partition up to the names of the ids: no object split or merged anywhere)."""
    nz = (ref > 0) | (got > 0)
    pairs, overlap = np.unique(np.stack([ref[nz].astype(np.uint64), got[nz].astype(np.uint64)]), axis=1,
                               return_counts=True)
    ref_ids, ref_size = np.unique(ref, return_counts=True)
    got_ids, got_size = np.unique(got, return_counts=True)
    size_r = dict(zip(ref_ids.tolist(), ref_size.tolist(), strict=True))
    size_g = dict(zip(got_ids.tolist(), got_size.tolist(), strict=True))
    matched = sum(1 for (a, b), n in zip(pairs.T.tolist(), overlap.tolist(), strict=True)
                  if a and b and n / (size_r[a] + size_g[b] - n) >= 0.99)
    same = bool(pairs.all()) and len(set(pairs[0].tolist())) == len(set(pairs[1].tolist())) == pairs.shape[1]
    return matched, int(np.count_nonzero(ref_ids)), same


@pytest.fixture(scope="module")
def volume() -> dict[str, np.ndarray]:
    """The truth of the tiny preset's 4 nm dataset (96³), classes mito, ves, cell, er."""
    return truth_volume(0)[0]


def channels_of(truth: np.ndarray, name: str) -> dict[str, np.ndarray]:
    return {name: probabilities(truth > 0, seed=1), f"{name}_boundary": probabilities(touching(truth), seed=2)}


@pytest.mark.parametrize(("name", "block", "seed_nm", "min_size_nm3", "exact"), [
    ("mito", 16, 12.0, 0.0, True),  # 16-voxel blocks: most mitochondria here span 18-33 voxels
    ("ves", 24, 0.0, 20 * 64.0, True),  # many small objects; the size filter applied to whole objects
    ("cell", 24, 12.0, 0.0, False),  # huge touching cells joined by thin necks (limit (b) of the module)
])
def test_blockwise_instances_equal_one_piece(volume, tmp_path, name, block, seed_nm, min_size_nm3, exact):
    chans = channels_of(volume[name][:64, :72, :72], name)
    params = ParamSet({name: InstanceParams(seed_distance_nm=seed_nm, min_size_nm3=min_size_nm3)})
    ref = segment_instances(dequantise(chans[name]), dequantise(chans[f"{name}_boundary"]), voxel_size_nm=VOXEL,
                            params=params.get(name))
    got, objects = blockwise(chans, name, params, block, tmp_path)
    matched, total, same = pairing(ref, got)
    assert total >= 3 and objects == total  # no object split in two (or two merged)
    assert matched >= 0.99 * total
    assert same or not exact  # stronger than the goal: the same objects voxel for voxel
    assert got.max() == objects and set(np.unique(got).tolist()) == set(range(objects + 1))  # consecutive ids


def test_ids_do_not_depend_on_the_blocking(volume, tmp_path):
    chans = channels_of(volume["mito"][:64, :64, :64], "mito")
    params = ParamSet({"mito": InstanceParams(seed_distance_nm=8.0)})
    a, _ = blockwise(chans, "mito", params, 16, tmp_path / "a")
    b, _ = blockwise(chans, "mito", params, 48, tmp_path / "b")
    assert np.array_equal(a, b)  # ids numbered by the raster order of each object's first voxel


def two_touching(shape=(32, 24, 24), face=16) -> tuple[np.ndarray, np.ndarray]:
    """Two boxes meeting face to face at plane z = `face`: probability 1 inside either, and the boundary channel
    1 on the two planes where they touch; the first box is wider in y so they are not mirror images."""
    fg = np.zeros(shape, bool)
    fg[4:face, 4:20, 4:20] = True
    fg[face:28, 6:18, 6:18] = True
    ids = np.zeros(shape, np.uint32)
    ids[:face][fg[:face]] = 1
    ids[face:][fg[face:]] = 2
    return (fg * 255).astype(np.uint8), (touching(ids) * 255).astype(np.uint8)


@pytest.mark.parametrize("use_boundary", [True, False])
def test_touching_objects_across_a_face_stay_apart(tmp_path, use_boundary):
    prob, boundary = two_touching()
    chans = {"mito": prob, "mito_boundary": boundary}
    if not use_boundary:  # separated by the seed distance alone: a narrow waist where the boxes meet
        waist = prob.copy()
        waist[14:18] = 0
        waist[14:18, 10:13, 10:13] = 255
        chans = {"mito": waist}
    params = ParamSet({"mito": InstanceParams(seed_distance_nm=8.0)})
    read = {c: dequantise(a) for c, a in chans.items()}
    ref = segment_instances(read["mito"], read.get("mito_boundary"), voxel_size_nm=VOXEL, params=params.get("mito"))
    assert ref.max() == 2
    got, objects = blockwise(chans, "mito", params, 16, tmp_path)  # the block face is the plane they meet at
    assert objects == 2 and pairing(ref, got)[2]


def test_relabel_twice_changes_nothing_and_merge_errors_name_the_block(volume, tmp_path):
    chans = channels_of(volume["mito"][:48, :48, :48], "mito")
    params = ParamSet({"mito": InstanceParams()})
    got, _ = blockwise(chans, "mito", params, 24, tmp_path)
    grid = BlockGrid(got.shape, (24, 24, 24))
    lookup = load_lookup(tmp_path)
    again = got.copy()
    for pos in grid.positions():
        relabel_block(again, grid, pos, lookup)
    assert np.array_equal(again, got) and not (got & PROVISIONAL).any()
    with pytest.raises(ValueError, match="missing from the lookup"):
        lookup(np.array([PROVISIONAL | np.uint64(12345)], np.uint64))
    (tmp_path / "1_0_1.npz").unlink()
    with pytest.raises(FileNotFoundError, match=r"1_0_1\.npz.*\[1, 0, 1\]"):
        merge_faces(tmp_path, grid)


def test_semantic_masks_equal_one_piece(volume, tmp_path):
    prob = probabilities(volume["er"] > 0, seed=3)
    params = ParamSet({"er": SemanticParams(threshold=0.5, min_size_nm3=5 * 64.0)})
    ref = segment_semantic(dequantise(prob), voxel_size_nm=VOXEL, params=params.get("er"))
    got, _ = blockwise({"er": prob}, "er", params, 24, tmp_path)
    assert got.dtype == np.uint8 and np.array_equal(got, ref.astype(np.uint8))


def test_holes_within_the_halo_are_filled_across_faces(tmp_path):
    z, y, x = np.ogrid[:40, :40, :40]
    r2 = (z - 20) ** 2 + (y - 18) ** 2 + (x - 21) ** 2
    shell = ((r2 <= 10**2) & (r2 > 5**2)).astype(np.uint8) * 255  # a hollow ball centred near the block corner
    for name, params in (("er", SemanticParams(fill_holes=True)), ("mito", InstanceParams(fill_holes=True))):
        chans = {name: shell}
        p = ParamSet({name: params})
        got, _ = blockwise(chans, name, p, 20, tmp_path / name)
        assert np.count_nonzero(got) == np.count_nonzero(r2 <= 10**2)  # the hole is filled
        if name == "mito":
            assert got.max() == 1


def test_hierarchy_union_is_applied_per_block(volume, tmp_path):
    truth = volume["mito"]
    chans = channels_of(truth, "mito")
    from scipy.ndimage import binary_erosion

    chans["mito_mem"] = probabilities((truth > 0) & ~binary_erosion(truth > 0), seed=4)  # the outer voxels
    params = ParamSet({"mito": InstanceParams(threshold=0.6, hierarchy="union"),
                       "mito_mem": SemanticParams(threshold=0.3)})
    read = {c: dequantise(a) for c, a in chans.items()}
    edited = edited_probability("mito", "union", read["mito"], present=["mito", "mito_mem"],
                                threshold_of=lambda c: params.get(c).threshold, read=read.__getitem__,
                                rivals=lambda: None)
    assert not np.array_equal(edited, read["mito"])
    ref = segment_instances(edited, read["mito_boundary"], voxel_size_nm=VOXEL, params=params.get("mito"))
    got, _ = blockwise(chans, "mito", params, 32, tmp_path)
    assert pairing(ref, got)[2]


def test_labels_of_the_wrong_dtype_are_refused(tmp_path):
    grid = BlockGrid((16, 16, 16), (8, 8, 8))
    with pytest.raises(ValueError, match="expected uint64"):
        decode_block(lambda c, box: np.zeros((16, 16, 16), np.float32)[box], np.zeros((16, 16, 16), np.uint32),
                     grid, (0, 0, 0), class_name="mito", params=ParamSet(), voxel_size_nm=VOXEL,
                     channels=["mito"], records=tmp_path)


def test_hierarchy_argmax_is_applied_per_block(volume, tmp_path):
    from cellseg.postprocess.hierarchy import crop_rivals

    truth = volume["mito"][:48, :48, :48] > 0
    chans = {"mito_mem": probabilities(truth, seed=5), "mito_lum": probabilities(truth, seed=6)}
    params = ParamSet({"mito_mem": SemanticParams(hierarchy="argmax"), "mito_lum": SemanticParams(threshold=0.4)})
    read = {c: dequantise(a) for c, a in chans.items()}

    def threshold_of(c):
        return params.get(c).threshold

    edited = edited_probability("mito_mem", "argmax", read["mito_mem"], present=list(chans), threshold_of=threshold_of,
                                read=read.__getitem__,
                                rivals=lambda: crop_rivals(list(chans), threshold_of=threshold_of, read=read.__getitem__))
    ref = segment_semantic(edited, voxel_size_nm=VOXEL, params=params.get("mito_mem"))
    assert 0 < ref.sum() < segment_semantic(read["mito_mem"], voxel_size_nm=VOXEL, params=params.get("mito_mem")).sum()
    got, _ = blockwise(chans, "mito_mem", params, 16, tmp_path)
    assert np.array_equal(got, ref.astype(np.uint8))
