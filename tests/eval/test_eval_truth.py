"""The one truth reader of validation, tuning and fitting equals reading every class's targets at once."""

from __future__ import annotations

import numpy as np
import pytest
from crafted import write_root

from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry
from cellseg.data.targets import CropSource
from cellseg.eval.relabel import relabel_26
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.truth import open_crop, read_class_truth
from cellseg.postprocess.tune import split_entry

CROP1 = ("mito_mem", "mito_lum", "mito_ribo", "ecs", "nuc", "mito")


def _targets_reference(crop: CropSource, k: int, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Class k's truth as scoring read it from all of the crop's targets (ids on disk, else components)."""
    target, known = crop.read_targets(grid, use_all=False)
    plan, inside = crop.plans[k], known[k]
    if not is_scored_as_instance(plan.name):
        return target[k] & inside, inside
    if len(plan.read) == 1:
        ids = crop.image(plan.read[0]).read(**grid.read_kwargs(), interpolation="nearest", pad_value=0)
    else:
        ids = relabel_26(target[k])[0]
    return np.where(inside, ids, 0).astype(ids.dtype), inside


def _grids(crop: CropSource) -> list[Grid]:
    """The annotated box at the label voxel size, and a coarser box shifted half out of the crop."""
    start, stop = np.asarray(crop.start_nm), np.asarray(crop.stop_nm)
    vs = np.asarray(crop.label_voxel_size_nm)
    shape = np.round((stop - start) / vs).astype(int)
    box = Grid.of(translation_nm=start + vs / 2, shape_vox=shape, voxel_size_nm=vs)
    shifted = Grid.of(translation_nm=start + (stop - start) / 2 + vs, shape_vox=np.maximum(shape // 2, 1),
                      voxel_size_nm=2 * vs)
    return [box, shifted]


@pytest.mark.parametrize("crop_id", [1, 4, 6])
def test_read_class_truth_equals_the_targets_of_the_crop(tiny_synth_root, crop_id):
    entry = split_entry(Catalog.from_dir(tiny_synth_root), crop_id)
    classes = ("mito", "er", "nuc", "ld", "ecs", "cell", "ves", "perox", "mito_mem")
    crop = CropSource.open(entry, classes, backend="zarr")
    kinds = set()
    for grid in _grids(crop):
        for k, name in enumerate(classes):
            got = read_class_truth(crop, name, grid)
            alone = read_class_truth(entry, name, grid)
            if not crop.plans[k].read:
                assert got is None and alone is None
                continue
            want_truth, want_inside = _targets_reference(crop, k, grid)
            for truth, inside in (got, alone):
                assert truth.dtype == want_truth.dtype and inside.dtype == bool
                np.testing.assert_array_equal(truth, want_truth)
                np.testing.assert_array_equal(inside, want_inside)
            kinds.add((is_scored_as_instance(name), len(crop.plans[k].read) > 1, bool(want_inside.all())))
    assert {(True, False), (False, False)} <= {k[:2] for k in kinds}  # ids on disk and semantic arrays seen
    assert any(not k[2] for k in kinds)  # some truth only partly annotated on the shifted grid


@pytest.mark.parametrize("on_disk", [("mito_mem", "mito_lum", "mito_ribo", "ecs"), CROP1])
def test_read_class_truth_of_groups_and_of_ids_on_disk(tmp_path, on_disk):
    """mito from its atoms (components of their union) or from its ids on disk, on two grids."""
    root = write_root(tmp_path)
    gt = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1"
    entry = SplitEntry(split="train", em_url=str(gt / "em" / "fibsem-uint8"),
                       crop_url=str(gt / "labels" / "groundtruth" / "crop1"), classes=on_disk)
    crop = open_crop(entry, ("mito", "ecs"))
    assert len(crop.plans[0].read) == (3 if "mito" not in on_disk else 1)
    for grid in _grids(crop):
        for k, name in enumerate(("mito", "ecs")):
            truth, inside = read_class_truth(crop, name, grid)
            want_truth, want_inside = _targets_reference(crop, k, grid)
            assert truth.dtype == want_truth.dtype
            np.testing.assert_array_equal(truth, want_truth)
            np.testing.assert_array_equal(inside, want_inside)
    ids, _ = read_class_truth(crop, "mito", _grids(crop)[0])
    assert ids.dtype.kind == "u" and ids.max() >= 1  # object ids, not a mask


def test_read_class_truth_refuses_a_class_the_crop_was_not_opened_for(tiny_synth_root):
    crop = open_crop(split_entry(Catalog.from_dir(tiny_synth_root), 6), ("mito",))
    with pytest.raises(ValueError, match="not for 'nuc'"):
        read_class_truth(crop, "nuc", _grids(crop)[0])
