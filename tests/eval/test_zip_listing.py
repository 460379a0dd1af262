"""Listing a zipped submission parses the zip's member list once (per process), however many arrays it holds:
each parse reads the whole archive, and a test-set submission has tens of thousands of members."""

from __future__ import annotations

import zipfile

import numpy as np

from cellseg.data.write import write_array
from cellseg.eval import io
from cellseg.eval.io import list_crop, open_source


def test_every_array_of_a_zip_is_listed_from_one_parse_of_its_members(tmp_path):
    store = tmp_path / "submission"
    labels = ["mito", "er", "nuc", "ecs", "pm", "ld"]
    for crop in ("crop1", "crop2"):
        for label in labels:
            write_array(store / crop / label, np.zeros((8, 8, 8), np.uint8), attrs={"voxel_size": [8, 8, 8]})
    archive = tmp_path / "submission.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(store.rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(store).as_posix())
    source = open_source(archive)
    io._zip_mapping.cache_clear()
    for crop in ("crop1", "crop2"):
        listing = list_crop(source, crop)
        assert sorted(listing.arrays) == sorted(labels)
        assert all(a.problem is None and a.attrs["voxel_size"] == [8, 8, 8] for a in listing.arrays.values())
    assert io._zip_mapping.cache_info().misses == 1
