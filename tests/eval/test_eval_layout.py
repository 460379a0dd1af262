"""How submissions are discovered (zip layouts, crop names, groups) and the truth's `_mask` arrays."""

import shutil

import numpy as np
import pytest

from cellseg.data.write import write_array, write_multiscale
from cellseg.eval import evaluate


@pytest.fixture
def truth(stores, three_balls):
    return stores.truth({"crop1": {"mito": three_balls, "er": (three_balls > 0).astype(np.uint8)}})


def _perfect(stores, three_balls, **kw):
    return stores.submission({"crop1": {"mito": three_balls, "er": (three_balls > 0).astype(np.uint8)}}, **kw)


@pytest.mark.parametrize("era", ["2025", "2026"])
def test_zip_with_the_store_at_the_root(stores, three_balls, truth, era):
    path = stores.zip(_perfect(stores, three_balls))
    ev = evaluate(path, truth, metric=era)
    assert ev.overall_score == 1.0 and not ev.official_failures


def test_store_zipped_inside_a_folder(stores, three_balls, truth):
    path = stores.zip(_perfect(stores, three_balls), prefix="results/submission.zarr/")
    e26, e25 = evaluate(path, truth, metric="2026"), evaluate(path, truth, metric="2025")
    assert e26.overall_score == e25.overall_score == 1.0
    assert not e26.official_failures
    assert any("not at the root" in f for f in e25.official_failures)


def test_bare_crop_numbers(stores, three_balls, truth):
    sub = _perfect(stores, three_balls)
    shutil.move(sub / "crop1", sub / "1")
    e26, e25 = evaluate(sub, truth, metric="2026"), evaluate(sub, truth, metric="2025")
    assert e26.overall_score == e25.overall_score == 1.0
    assert any("prefix" in f for f in e25.official_failures) and not e26.official_failures


def test_crop_folder_without_zgroup(stores, three_balls, truth):
    sub = _perfect(stores, three_balls)
    (sub / "crop1" / ".zgroup").unlink()
    e25 = evaluate(sub, truth, metric="2025")
    assert e25.overall_score == 1.0 and any(".zgroup" in f for f in e25.official_failures)


@pytest.mark.parametrize("era", ["2025", "2026"])
def test_multiscale_groups_are_never_read(stores, three_balls, truth, era):
    sub = stores.submission({"crop1": {"er": (three_balls > 0).astype(np.uint8)}})
    write_multiscale(sub / "crop1" / "mito", three_balls, voxel_size_nm=(8, 8, 8), translation_nm=(0, 0, 0),
                     kind="labels", num_levels=2)
    ev = evaluate(sub, truth, metric=era)
    assert ev.crop_scores["crop1"]["mito"]["is_missing"]
    assert ev.missing["multiscale_groups"] == {"crop1": ["mito"]}
    assert any("multiscale groups" in n for n in ev.notes)


@pytest.mark.parametrize("era", ["2025", "2026"])
def test_masks_apply_and_are_scored_as_labels(stores, three_balls, era):
    er = (three_balls > 0).astype(np.uint8)
    mask = np.zeros_like(er)
    mask[:24] = 1  # only the first half is annotated
    crops = {"crop1": {"mito": three_balls, "er": er, "er_mask": mask}}
    truth = stores.truth(crops)
    pred = er.copy()
    pred[30:] = 1  # wrong only where the mask is 0
    ev = evaluate(stores.submission({"crop1": {"mito": three_balls, "er": pred}}), truth, metric=era)
    assert ev.label_scores["er"]["iou"] == 1.0  # masked out
    assert ev.label_scores["er_mask"]["iou"] == 0.0  # a truth array, so a label; absent from the submission
    assert ev.overall_semantic_score == 0.5


def test_mask_without_voxel_size_borrows_the_crops(stores, three_balls, tmp_path):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"er": er}})
    write_array(truth / "crop1" / "er_mask", np.ones_like(er))
    ev = evaluate(stores.submission({"crop1": {"er": er}}), truth, metric="2025")
    assert ev.label_scores["er"]["iou"] == 1.0
    assert any("KeyError" in n for n in ev.notes)


def test_crops_not_in_the_truth_are_ignored(stores, three_balls, truth):
    sub = _perfect(stores, three_balls)
    write_array(sub / "crop99" / "mito", three_balls, attrs={"voxel_size": [8, 8, 8], "translation": [0, 0, 0]})
    ev = evaluate(sub, truth, metric="2026")
    assert ev.overall_score == 1.0 and ev.missing["folders_not_in_truth"] == ["crop99"]
