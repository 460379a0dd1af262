"""Targets and known-masks on a crafted crop: groups, unknown vs known-negative, borders, black EM."""

import numpy as np
import pytest
from crafted import checker_labels, write_root

from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry
from cellseg.data.targets import CropSource, plan_class, touching


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
    crop = CropSource(entry=_entry(root, 1, CROP1), classes=("mito", "ecs", "golgi", "er"))
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
    crop = CropSource(entry=_entry(root, 1, ("mito_mem", "mito_lum", "mito_ribo", "ecs")), classes=("mito",))
    grid = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(24, 24, 24), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    np.testing.assert_array_equal(target[0], checker_labels((32, 32, 32))[4:28, 4:28, 4:28])
    assert known.all()


def test_outside_the_crop_is_unknown(root):
    crop = CropSource(entry=_entry(root, 2, ("ecs",)), classes=("ecs", "mito"))
    # A grid starting 4 voxels before crop 2 (which starts at 8 nm voxel 8).
    grid = Grid(translation_nm=(2.0 + 8 * 4,) * 3, shape_vox=(8, 8, 8), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    assert not known[0, :4].any() and known[0, 4:, 4:, 4:].all()
    # mito is unannotated in crop 2 and no exclusive evidence beyond ecs: known only where ecs is positive.
    np.testing.assert_array_equal(known[1], target[0])


def test_crop_without_requested_classes_is_a_clear_error(root):
    with pytest.raises(ValueError, match=r"crop2: annotates none of the requested classes \['ld'\]"):
        CropSource(entry=_entry(root, 2, ("ecs",)), classes=("ld",))
    with pytest.raises(FileNotFoundError, match="crop9"):
        CropSource(entry=_entry(root, 9, ("ecs",)), classes=("ecs",))


def test_touching_boundary_channel(root):
    ids = np.zeros((6, 6, 6), np.uint32)
    ids[1:5, 1:5, 1:3] = 1
    ids[1:5, 1:5, 3:5] = 2  # touches object 1 across x = 2|3
    ids[0, 0, 0] = 3  # touches nothing
    b = touching(ids)
    assert b.sum() == 2 * 16 and b[1:5, 1:5, 2].all() and b[1:5, 1:5, 3].all()
    crop = CropSource(entry=_entry(root, 1, CROP1), classes=("mito", "ecs"), boundaries=True)
    grid = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(24, 24, 24), voxel_size_nm=(8.0, 8.0, 8.0))
    target, known = crop.read_targets(grid)
    assert target.shape == (3, 24, 24, 24) and crop.aux_classes == (0,)
    mito_ids = crop.image("mito").read_level("s0")
    np.testing.assert_array_equal(target[2], touching(mito_ids))
    assert known[2].all()
