"""Splits grouped by space, the data root's datasplit.csv honoured by default, validation roles tuning/report."""

import logging

import numpy as np
import pytest

from cellseg import classes as catalogue
from cellseg.config.schema import DataConfig
from cellseg.data.crops import Catalog
from cellseg.data.loader import make_split
from cellseg.data.split import (
    ROLES_FILE,
    assign_roles,
    crop_box_nm,
    read_datasplit,
    spatial_groups,
    split_catalog,
    write_datasplit,
)

PATCH_EDGE_NM = 128 * 8.0  # one 128³ patch at 8 nm


def _gap_nm(a, b):
    (lo_a, hi_a), (lo_b, hi_b) = crop_box_nm(a), crop_box_nm(b)
    return float(np.max(np.maximum(lo_a - hi_b, lo_b - hi_a)))  # < 0: the boxes overlap


def test_official_manifest_no_validation_crop_overlaps_a_training_crop():
    catalog = Catalog.official()
    entries = split_catalog(catalog, catalogue.tested_classes(), validation_fraction=0.15, seed=0, max_voxel_size_nm=8.0,
                            margin_nm=PATCH_EDGE_NM)
    by_name = {c.name: c for c in catalog.train.values()}
    val = [by_name[e.crop_name] for e in entries if e.split == "validate"]
    train = [by_name[e.crop_name] for e in entries if e.split == "train"]
    assert 0.1 < len(val) / len(entries) < 0.3
    close = [(v.name, t.name) for v in val for t in train if v.dataset == t.dataset and _gap_nm(v, t) < PATCH_EDGE_NM]
    assert close == []
    # Split crop by crop, the same manifest pairs validation with overlapping training crops: crop 247 alone
    # overlaps nine others.
    crops = [c for c in catalog.train.values() if max(max(g.voxel_size_nm) for g in c.labels.values()) <= 8.08]
    overlapping = sum(1 for i, a in enumerate(crops) for b in crops[i + 1:] if a.dataset == b.dataset and _gap_nm(a, b) < 0)
    assert overlapping == 35
    group_247 = next(g for g in spatial_groups(crops) if any(c.id == 247 for c in g))
    assert len(group_247) >= 10
    roles = {e.role for e in entries if e.split == "validate"}
    assert roles == {"tuning", "report"} and all(not e.role for e in entries if e.split == "train")


def test_roles_put_a_class_seen_twice_on_both_sides_and_a_class_seen_once_in_tuning():
    groups = [[(1, ("mito", "er"))], [(2, ("mito",)), (3, ("nuc",))], [(4, ("er",))], [(5, ("ecs",))]]
    roles = assign_roles(groups, ["mito", "er", "nuc", "ecs"], report_fraction=0.5)
    assert roles[2] == roles[3]  # a group never straddles the roles
    for name, crops in (("mito", (1, 2)), ("er", (1, 4))):
        assert {roles[c] for c in crops} == {"tuning", "report"}, name
    assert set(roles) == {1, 2, 3, 4, 5}


def test_root_datasplit_is_honoured_by_default_and_auto_resplits(tiny_synth_root, tmp_path, caplog):
    classes = ("mito", "er", "ecs", "nuc")
    cfg = DataConfig(root=str(tiny_synth_root), classes=classes, patch_shape_vox=(16, 16, 16))
    on_disk = read_datasplit(tiny_synth_root / "datasplit.csv")
    with caplog.at_level(logging.INFO, logger="cellseg.data.loader"):
        entries = make_split(cfg)
    assert f"using {tiny_synth_root / 'datasplit.csv'}" in caplog.text
    assert {(e.crop_name, e.split) for e in entries} <= {(e.crop_name, e.split) for e in on_disk}
    assert all(e.role in ("tuning", "report") for e in entries if e.split == "validate")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cellseg.data.loader"):
        auto = make_split(DataConfig(root=str(tiny_synth_root), classes=classes, patch_shape_vox=(16, 16, 16),
                                     datasplit="auto"))
    assert "automatic split" in caplog.text and {e.split for e in auto} == {"train", "validate"}
    # The roles travel beside the official 5-column file and come back with it.
    write_datasplit(auto, tmp_path / "datasplit.csv")
    assert (tmp_path / ROLES_FILE).is_file()
    assert read_datasplit(tmp_path / "datasplit.csv") == auto


def test_bad_roles_file_is_a_clear_error(tiny_synth_root, tmp_path):
    entries = read_datasplit(tiny_synth_root / "datasplit.csv")
    write_datasplit(entries, tmp_path / "datasplit.csv")
    (tmp_path / ROLES_FILE).write_text("crop_name,role\ncrop1,holdout\n")
    with pytest.raises(ValueError, match=rf"{ROLES_FILE}, line 2: expected crop_name,role"):
        read_datasplit(tmp_path / "datasplit.csv")
