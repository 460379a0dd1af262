"""The automatic split balances classes by foreground, not by listing: a crop that lists a class it does not
hold gives no decision anything to learn about that class."""

from __future__ import annotations

import numpy as np
import zarr

from cellseg.data.crops import Catalog
from cellseg.data.split import foreground_classes, split_catalog


def test_foreground_classes_are_those_whose_s0_holds_positive_voxels(tiny_synth_root):
    catalog = Catalog.from_dir(tiny_synth_root)
    checked = 0
    for crop in list(catalog.train.values())[:4]:
        where = catalog.locate(crop.crop_url).url
        held = []
        for name in crop.classes:
            arr = zarr.open(f"{where}/{name}/s0", mode="r")
            absent = zarr.open(f"{where}/{name}", mode="r").attrs.get("cellmap", {}).get("annotation", {}).get(
                "annotation_type", {}).get("encoding", {}).get("absent", 0)
            unknown = 255 if arr.dtype == np.uint8 else None  # the synthetic semantic arrays' unknown value
            data = arr[...]
            positive = (data != absent) & (data != unknown) if unknown is not None else data != absent
            held += [name] if positive.any() else []
        assert foreground_classes(crop, catalog) == tuple(held)
        checked += len(crop.classes) - len(held)
    assert checked > 0  # some listed classes are absent: the case this exists for


def test_every_validation_class_choice_rests_on_foreground(tiny_synth_root):
    """Each class with foreground in two or more spatial groups has a validation crop holding it."""
    catalog = Catalog.from_dir(tiny_synth_root)
    classes = ["mito", "er", "nuc", "ecs", "pm", "lyso"]
    entries = split_catalog(catalog, classes, validation_fraction=0.3, seed=0)
    crops = {c.name: c for c in catalog.train.values()}
    val = [crops[e.crop_name] for e in entries if e.split == "validate"]
    train = [crops[e.crop_name] for e in entries if e.split == "train"]
    for name in classes:
        holders = [c for c in val + train if name in foreground_classes(c, catalog)]
        if len(holders) >= 2:
            assert any(name in foreground_classes(c, catalog) for c in val), name
