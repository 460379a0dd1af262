"""CellMap annotation metadata: "unknown" voxels and unannotated arrays, the same for training targets and
scoring truth."""

import json
import logging

import numpy as np
import pytest
from crafted import checker_labels, write_root

from cellseg.data.annotation import Encoding, parse_annotation
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry
from cellseg.data.targets import CropSource
from cellseg.data.write import write_multiscale
from cellseg.eval.truth import read_class_truth

CROP1 = ("mito_mem", "mito_lum", "mito_ribo", "ecs", "nuc", "mito")
GRID = Grid(translation_nm=(34.0, 34.0, 34.0), shape_vox=(24, 24, 24), voxel_size_nm=(8.0, 8.0, 8.0))  # crop 1
MASK = checker_labels((32, 32, 32))[4:28, 4:28, 4:28]  # mito in crop 1; ecs is its complement
SEMANTIC = {"type": "semantic_segmentation", "encoding": {"absent": 0, "unknown": 255, "present": 1}}


def _entry(root, classes=CROP1):
    gt = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1"
    return SplitEntry(split="train", em_url=str(gt / "em" / "fibsem-uint8"),
                      crop_url=str(gt / "labels" / "groundtruth" / "crop1"), classes=tuple(classes))


def _group(root, name):
    return root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1" / "labels" / "groundtruth" / "crop1" / name


def _annotate(root, name, note, *, on="s0"):
    """Add `cellmap.annotation` to the `.zattrs` of the group (`on="group"`) or of its s0 array."""
    path = _group(root, name) / ("" if on == "group" else "s0") / ".zattrs"
    attrs = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**attrs, "cellmap": {"annotation": note}}))


def _rewrite(root, name, data):
    """Replace a crop-1 label group's data (same geometry)."""
    write_multiscale(_group(root, name), data, voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(34.0, 34.0, 34.0),
                     kind="labels", overwrite=True)


@pytest.fixture(params=[True, False], ids=["with_all", "without_all"])
def root(request, tmp_path):
    return write_root(tmp_path, with_all=request.param)


def test_encoding_rule():
    values = np.array([0, 1, 7, 255])
    enc = Encoding(absent=0, unknown=255, present=1)
    np.testing.assert_array_equal(enc.known(values), [True, True, True, False])
    np.testing.assert_array_equal(enc.positive(values), [False, True, True, False])  # 7: neither, so positive
    np.testing.assert_array_equal(enc.object_ids(values), [0, 1, 7, 0])
    inside = np.array([True, True, False, True])
    np.testing.assert_array_equal(Encoding().known(values, inside), inside)  # no metadata: 0 absent, no unknown
    np.testing.assert_array_equal(Encoding().positive(values, inside), [False, True, False, True])


def test_metadata_of_the_array_wins_over_the_group_and_bad_metadata_is_named():
    group = {"cellmap": {"annotation": {"class_name": "ecs", "annotation_type": SEMANTIC}}}
    array = {"cellmap": {"annotation": {"complement_counts": {"absent": 5, "unknown": 3}}}}
    note = parse_annotation(group, array, num_voxels=10, source="g")
    assert note.encoding == Encoding(absent=0, unknown=255, present=1) and note.positives == 2
    assert note.may_hold_unknown and not note.entirely_unknown
    assert parse_annotation(None, None, num_voxels=10, source="g").encoding == Encoding()
    bad = {"cellmap": {"annotation": {"annotation_type": {"type": "semantic_segmentation", "encoding": {"maybe": 3}}}}}
    with pytest.raises(ValueError, match=r"g: cellmap.annotation.annotation_type.encoding=.*'maybe'"):
        parse_annotation(bad, None, num_voxels=10, source="g")
    with pytest.raises(ValueError, match=r"complement_counts.absent: 'many' is not an integer"):
        parse_annotation(None, {"cellmap": {"annotation": {"complement_counts": {"absent": "many"}}}},
                         num_voxels=10, source="g")


@pytest.mark.parametrize("on", ["s0", "group"])
def test_unknown_voxels_are_neither_positive_nor_negative_in_targets_and_truth(root, on):
    ecs = (~MASK).astype(np.uint8)
    ecs[:8] = 255  # the first 8 planes were not annotated
    _rewrite(root, "ecs", ecs)
    with_all = _group(root, "all").is_dir()
    if with_all:  # consistent: unknown in the id array as well (255 is no CellMap id)
        ids = np.where(MASK, 4, 1).astype(np.uint8)
        ids[:8] = 255
        _rewrite(root, "all", ids)
    counts = {"absent": int((ecs == 0).sum()), "unknown": int((ecs == 255).sum())}
    _annotate(root, "ecs", {"class_name": "ecs", "annotation_type": SEMANTIC, "complement_counts": counts}, on=on)
    crop = CropSource.open(_entry(root), ("ecs", "mito", "golgi"))
    assert not crop.ids_exact  # unknown is per class: the `all` ids cannot say it
    target, known = crop.read_targets(GRID)
    assert not known[0, :8].any() and known[0, 8:].all()
    np.testing.assert_array_equal(target[0, 8:], ~MASK[8:])
    assert not target[0, :8].any()
    # golgi is known-negative only where an exclusive class is positive: 255 is not an ecs positive (nor an id).
    np.testing.assert_array_equal(known[2, :8], np.zeros_like(MASK[:8]) if with_all else MASK[:8])
    truth, annotated = read_class_truth(crop, "ecs", GRID)
    np.testing.assert_array_equal(annotated, known[0])
    np.testing.assert_array_equal(truth, target[0])


def test_an_entirely_unknown_array_is_not_annotated(root):
    n = 24**3
    _rewrite(root, "nuc", np.full((24, 24, 24), 255, np.uint8))
    _annotate(root, "nuc", {"class_name": "nuc", "annotation_type": SEMANTIC,
                            "complement_counts": {"unknown": n}})
    crop = CropSource.open(_entry(root), ("nuc", "ecs"))
    assert "nuc" not in crop.on_disk and crop.plans[0].read == ()
    assert read_class_truth(crop, "nuc", GRID) is None


@pytest.mark.parametrize("evidence", ["counts", "coarse_level"])
def test_an_empty_group_whose_atoms_have_voxels_is_not_annotated(root, evidence, caplog):
    _rewrite(root, "mito", np.zeros((24, 24, 24), np.uint32))
    if evidence == "counts":
        for name, data in (("mito", np.zeros(MASK.shape)), ("mito_mem", MASK), ("mito_lum", MASK)):
            _annotate(root, name, {"class_name": name, "annotation_type": SEMANTIC,
                                   "complement_counts": {"absent": int((data == 0).sum())}})
    with caplog.at_level(logging.WARNING, logger="cellseg.data.annotation"):
        crop = CropSource.open(_entry(root), ("mito", "ecs"))
        CropSource.open(_entry(root), ("mito",))  # decided again, logged once
    assert "mito" not in crop.on_disk
    assert crop.plans[0].read == ("mito_mem", "mito_lum", "mito_ribo")  # the union of its atoms instead
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "crop1: treated as not annotated: mito (all zero while mito_mem, mito_lum" in lines[0]
    target, known = crop.read_targets(GRID)
    np.testing.assert_array_equal(target[0], MASK)
    assert known[0].all()
    truth, _ = read_class_truth(_entry(root), "mito", GRID)
    assert (truth > 0).sum() == MASK.sum()  # scoring reads the atoms too


def test_an_empty_atom_stays_a_known_negative(root):
    crop = CropSource.open(_entry(root), ("mito_ribo", "nuc"))  # all zero, nothing they contain has voxels
    assert crop.on_disk == CROP1
    target, known = crop.read_targets(GRID)
    assert known.all() and not target.any()
