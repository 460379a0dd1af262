"""Targets and known-masks on a crafted crop: groups, unknown vs known-negative, borders, black EM."""

import dataclasses
import logging
import pickle

import numpy as np
import pytest
from crafted import checker_labels, write_root

from cellseg.data.class_plan import plan_class
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry
from cellseg.data.target_bits import touching
from cellseg.data.targets import CropSource
from cellseg.data.write import write_multiscale


def _entry(root, crop, classes):
    gt = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1"
    return SplitEntry(split="train", em_url=str(gt / "em" / "fibsem-uint8"),
                      crop_url=str(gt / "labels" / "groundtruth" / f"crop{crop}"), classes=tuple(classes))


CROP1 = ("mito_mem", "mito_lum", "mito_ribo", "ecs", "nuc", "mito")


@pytest.fixture(params=[True, False], ids=["with_all", "without_all"])
def root(request, tmp_path):
    return write_root(tmp_path, with_all=request.param)


def test_plans():
    assert plan_class("mito", ["mito"], has_all=False).read == ("mito",)
    assert plan_class("mito", ["mito_mem", "mito_lum", "mito_ribo"], has_all=False).read == (
        "mito_mem", "mito_lum", "mito_ribo")
    unknown = plan_class("golgi", ["mito", "mito_mem", "ecs", "nuc"], has_all=False)
    assert not unknown.known and set(unknown.exclusive) == {"mito", "ecs", "nuc"}  # mito_mem is covered by mito
    assert 41 in plan_class("golgi", [], has_all=True).exclusive_ids  # ves ids are exclusive with golgi


def test_group_union_unknown_and_known_negative(root):
    crop = CropSource.open(_entry(root, 1, CROP1), ("mito", "ecs", "golgi", "er"))
    grid = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(24, 24, 24), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    mask = checker_labels((32, 32, 32))[4:28, 4:28, 4:28]
    np.testing.assert_array_equal(target[0], mask)  # mito: on disk (ids > 0)
    np.testing.assert_array_equal(target[1], ~mask)  # ecs
    assert known[:2].all()
    # golgi is not annotated: known-negative exactly where an exclusive class (mito or ecs) is positive.
    assert not target[2].any()
    np.testing.assert_array_equal(known[2], mask | ~mask)
    # er: mutually exclusive with mito and ecs as well.
    assert known[3].all()


def test_group_from_atoms_only(root):
    crop = CropSource.open(_entry(root, 1, ("mito_mem", "mito_lum", "mito_ribo", "ecs")), ("mito",))
    grid = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(24, 24, 24), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    np.testing.assert_array_equal(target[0], checker_labels((32, 32, 32))[4:28, 4:28, 4:28])
    assert known.all()


def test_outside_the_crop_is_unknown(root):
    crop = CropSource.open(_entry(root, 2, ("ecs",)), ("ecs", "mito"))
    # A grid starting 4 voxels before crop 2 (which starts at 8 nm voxel 8).
    grid = Grid(translation_nm=(2.0 + 8 * 4,) * 3, shape_vox=(8, 8, 8), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    assert not known[0, :4].any() and known[0, 4:, 4:, 4:].all()
    # mito is unannotated in crop 2 and no exclusive evidence beyond ecs: known only where ecs is positive.
    np.testing.assert_array_equal(known[1], target[0])


def test_crop_without_requested_classes_is_a_clear_error(root):
    with pytest.raises(ValueError, match=r"crop2: annotates none of the requested classes \['ld'\]"):
        CropSource.open(_entry(root, 2, ("ecs",)), ("ld",))
    with pytest.raises(FileNotFoundError, match="crop9"):
        CropSource.open(_entry(root, 9, ("ecs",)), ("ecs",))


def test_touching_boundary_channel(root):
    ids = np.zeros((6, 6, 6), np.uint32)
    ids[1:5, 1:5, 1:3] = 1
    ids[1:5, 1:5, 3:5] = 2  # touches object 1 across x = 2|3
    ids[0, 0, 0] = 3  # touches nothing
    b = touching(ids)
    assert b.sum() == 2 * 16 and b[1:5, 1:5, 2].all() and b[1:5, 1:5, 3].all()
    crop = CropSource.open(_entry(root, 1, CROP1), ("mito", "ecs"), boundaries=True)
    grid = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(24, 24, 24), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    assert target.shape == (3, 24, 24, 24) and crop.aux_classes == (0,)
    mito_ids = crop.image("mito").read_level("s0")
    np.testing.assert_array_equal(target[2], touching(mito_ids))
    assert known[2].all()


def test_label_group_without_zattrs_is_named_and_unannotated(tmp_path, caplog):
    root = write_root(tmp_path)
    zattrs = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1" / "labels" / "groundtruth" / "crop1" / "ecs" / ".zattrs"
    zattrs.unlink()
    with caplog.at_level(logging.WARNING, logger="cellseg.data.targets"):
        crop = CropSource.open(_entry(root, 1, (*CROP1, "er")), ("mito", "ecs"))
    assert "ecs" not in crop.on_disk and not crop.plans[1].known
    assert f"{zattrs} is missing: label group ecs is treated as unannotated" in caplog.text
    assert "listed but not on disk, treated as unannotated: ['er']" in caplog.text  # no folder at all


def _write_ecs_crop(root, crop, start_nm):
    """A 16³ ecs crop at 8 nm whose box starts at `start_nm` (the 4 nm EM covers [-2, 254) nm on every axis)."""
    gt = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1" / "labels" / "groundtruth"
    write_multiscale(gt / f"crop{crop}" / "ecs", np.ones((16, 16, 16), np.uint8), voxel_size_nm=(8.0, 8.0, 8.0),
                     translation_nm=tuple(s + 4.0 for s in start_nm), kind="labels")


def test_annotated_box_outside_the_em_is_reported(tmp_path, caplog):
    root = write_root(tmp_path)
    _write_ecs_crop(root, 3, (64.0, 64.0, 190.0))  # x in [190, 318) nm: half of the box past the EM
    with caplog.at_level(logging.WARNING, logger="cellseg.data.targets"):
        CropSource.open(_entry(root, 3, ("ecs",)), ("ecs",))
    assert "crop3: 50.0% of its annotated box lies outside its EM" in caplog.text and "fibsem-uint8" in caplog.text
    _write_ecs_crop(root, 4, (64.0, 64.0, 510.0))
    with pytest.raises(ValueError, match=r"crop4: its annotated box lies wholly outside its EM .*fibsem-uint8"):
        CropSource.open(_entry(root, 4, ("ecs",)), ("ecs",))


def test_crop_is_a_value_whose_handles_reopen_after_pickling(root):
    crop = CropSource.open(_entry(root, 1, CROP1), ("mito", "ecs", "golgi"), boundaries=True)
    grid = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(8, 8, 8), voxel_size_nm=(8.0, 8.0, 8.0))
    before = crop.read_targets(grid)
    with pytest.raises(dataclasses.FrozenInstanceError):
        crop.has_all = False  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(crop))  # what a DataLoader worker receives
    assert copy == crop and copy.image("mito") is not crop.image("mito")
    for a, b in zip(before, copy.read_targets(grid), strict=True):
        np.testing.assert_array_equal(a, b)
