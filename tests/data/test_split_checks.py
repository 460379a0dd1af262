"""A given datasplit is checked: overlapping training and validation crops are named (and regrouped on request),
rows outside the data root are named, and relative rows resolve under the data root."""

import logging
import shutil

import pytest
from crafted import write_root

from cellseg.config.schema import DataConfig
from cellseg.data.crops import Catalog
from cellseg.data.loader import make_split
from cellseg.data.split import SplitEntry, read_datasplit, regroup, straddling_pairs, write_datasplit

CLASSES = ("mito", "ecs")


def _split(root, caplog, **data):
    cfg = DataConfig(root=str(root), classes=CLASSES, patch_shape_vox=(16, 16, 16), **data)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cellseg.data.loader"):
        return {e.crop_name: e.split for e in make_split(cfg)}


def test_overlapping_train_and_validation_crops_are_named(tmp_path, caplog):
    root = write_root(tmp_path / "root")  # crop 1 trains, crop 2 validates, and their boxes overlap
    assert straddling_pairs(read_datasplit(root / "datasplit.csv"), Catalog.from_dir(root), 0.0) == [("crop1", "crop2")]
    assert _split(root, caplog) == {"crop1": "train", "crop2": "validate"}  # kept as given ...
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "1 training~validation pairs of crops overlap" in warning.getMessage()  # ... and named
    assert "crop1~crop2" in warning.getMessage() and "data.split_overlap=train" in warning.getMessage()


def test_regrouping_moves_each_straddling_group_to_one_side(tmp_path, caplog):
    root = write_root(tmp_path / "root")
    with pytest.raises(ValueError, match="leaves no validation crop"):  # the only validation crop overlaps
        _split(root, caplog, split_overlap="train")
    entries = read_datasplit(root / "datasplit.csv")
    catalog = Catalog.from_dir(root)
    # a third crop far away keeps both sides alive: crop 1 joins crop 2 in validation
    far = SplitEntry(split="train", em_url=entries[0].em_url, crop_url=entries[0].crop_url[:-1] + "9",
                     classes=("ecs",))
    moved = regroup([*entries, far], catalog, 0.0, to="validate")
    assert [(e.crop_name, e.split) for e in moved] == [("crop1", "validate"), ("crop2", "validate"),
                                                       ("crop9", "train")]
    with pytest.raises(ValueError, match="choose 'train' or 'validate'"):
        regroup(entries, catalog, 0.0, to="test")
    with pytest.raises(ValueError, match=r"data\.split_overlap='both'"):
        DataConfig(root=str(root), classes=CLASSES, split_overlap="both")


def test_rows_outside_the_data_root_are_named_and_relative_rows_follow_a_copy(tiny_synth_root, tmp_path, caplog):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_synth_root, copy)
    text = (copy / "datasplit.csv").read_text()
    assert str(tiny_synth_root) not in text  # relative locations: the copy reads its own crops
    entries = read_datasplit(copy / "datasplit.csv")
    assert all(e.em_url.startswith(str(copy.resolve())) and e.crop_url.startswith(str(copy.resolve()))
               for e in entries)
    _split(copy, caplog)
    assert "outside the data root" not in caplog.text
    elsewhere = tmp_path / "elsewhere" / "datasplit.csv"  # a copy of the file beside no data: rows follow data.root
    elsewhere.parent.mkdir()
    shutil.copy(copy / "datasplit.csv", elsewhere)
    assert read_datasplit(elsewhere, root=copy) == entries
    _split(copy, caplog, datasplit=str(elsewhere))
    assert "outside the data root" not in caplog.text and f"using {elsewhere}" in caplog.text
    write_datasplit(read_datasplit(tiny_synth_root / "datasplit.csv"), copy / "datasplit.csv")  # absolute: original
    _split(copy, caplog)
    assert f"rows locate their crop outside the data root {copy}" in caplog.text
    assert "a copy of the data root would still read the originals" in caplog.text
