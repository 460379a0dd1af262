"""`merge_classes`: each class (and its boundary channel) copied bit for bit from the store chosen for it."""

from __future__ import annotations

import numpy as np
import pytest

from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore, quantise
from cellseg.infer.merge import merge_classes

GRID = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(6, 8, 10), voxel_size_nm=(8.0, 8.0, 8.0))
FINE = Grid(translation_nm=(2.0, 2.0, 2.0), shape_vox=(12, 16, 20), voxel_size_nm=(4.0, 4.0, 4.0))
CHANNELS = ("mito", "er", "mito_boundary")


def probabilities(path, seed, *, quantised=False, crops=("crop1", "crop2"), channels=CHANNELS):
    store = PredictionStore.create(path, kind="probabilities", channels=channels, instance_channels=("mito",),
                                   provenance={"data_root": "/data", "seed": seed})
    rng = np.random.default_rng(seed)
    for crop in crops:
        arrays = {c: rng.random(GRID.shape_vox, dtype=np.float32) for c in channels}
        store.write_crop(crop, GRID, {c: quantise(a) if quantised else a for c, a in arrays.items()},
                         attrs={"dataset": "synth"})
    return store


def test_each_class_and_its_boundary_come_from_the_store_picked(tmp_path):
    a, b = probabilities(tmp_path / "a.zarr", 0), probabilities(tmp_path / "b.zarr", 1, quantised=True)
    merged = merge_classes([a, b], {"mito": 1}, tmp_path / "m.zarr")
    assert merged.completed() == ["crop1", "crop2"] and merged.channels == CHANNELS
    assert merged.provenance["data_root"] == "/data"  # where annotation grids are looked up stays known
    assert merged.provenance["merged"] == {"mito": str(b.path), "er": str(a.path), "mito_boundary": str(b.path)}
    for crop in ("crop1", "crop2"):
        assert merged.grid(crop) == GRID and merged.crop_attrs(crop)["dataset"] == "synth"
        for channel, src in (("mito", b), ("mito_boundary", b), ("er", a)):
            raw = merged.image(crop, channel).read_level("s0")
            expected = src.image(crop, channel).read_level("s0")
            assert raw.dtype == expected.dtype and np.array_equal(raw, expected)  # uint8 stays uint8
    # The same merge again resumes (nothing to do); another one into the same path is refused.
    assert merge_classes([a, b], {"mito": 1}, tmp_path / "m.zarr").completed() == ["crop1", "crop2"]
    with pytest.raises(ValueError, match="a merge of"):
        merge_classes([a, b], {"er": 1}, tmp_path / "m.zarr")


def test_segmentations_on_their_own_grids_keep_them(tmp_path):
    stores = []
    for k in range(2):
        store = PredictionStore.create(tmp_path / f"s{k}.zarr", kind="segmentation", channels=("mito", "er"),
                                       instance_channels=("mito",))
        ids = np.full(FINE.shape_vox, k + 1, dtype=np.uint32)
        store.write_crop("crop1", GRID, {"mito": ids, "er": np.full(GRID.shape_vox, k, dtype=np.uint8)},
                         grids={"mito": FINE})
        stores.append(store)
    merged = merge_classes(stores, {"mito": 1}, tmp_path / "m.zarr")
    assert merged.grid("crop1", "mito") == FINE and merged.grid("crop1", "er") == GRID
    assert (merged.read("crop1", "mito") == 2).all() and (merged.read("crop1", "er") == 0).all()


def test_a_store_with_other_channels_gives_those_taken_from_it(tmp_path):
    """A member beside its ensemble: channels in another order, one more, one fewer; the merged store keeps the
    first store's channels and order."""
    a = probabilities(tmp_path / "a.zarr", 0)
    member = probabilities(tmp_path / "member.zarr", 1, channels=("er", "golgi", "mito", "mito_boundary"))
    merged = merge_classes([a, member], {"mito": 1}, tmp_path / "m.zarr")
    assert merged.channels == CHANNELS
    for crop in ("crop1", "crop2"):
        for ch, source in (("mito", member), ("mito_boundary", member), ("er", a)):
            assert np.array_equal(merged.read(crop, ch), source.read(crop, ch))
    # only er taken from a store without mito's boundary channel: nothing else is needed from it
    assert merge_classes([a, probabilities(tmp_path / "e.zarr", 2, channels=("mito", "er"))], {"er": 1},
                         tmp_path / "m2.zarr").channels == CHANNELS


def test_bad_merges_are_clear_errors(tmp_path):
    a, b = probabilities(tmp_path / "a.zarr", 0), probabilities(tmp_path / "b.zarr", 1, crops=("crop1",))
    other = probabilities(tmp_path / "o.zarr", 2, channels=("mito", "er"))
    with pytest.raises(ValueError, match=r"o\.zarr.*lacks \['mito_boundary'\]"):
        merge_classes([a, other], {"mito": 1}, tmp_path / "m.zarr")
    segmentation = PredictionStore.create(tmp_path / "s.zarr", kind="segmentation", channels=CHANNELS,
                                          instance_channels=("mito",), provenance={})
    with pytest.raises(ValueError, match=r"s\.zarr \(segmentation\).*same kind"):
        merge_classes([a, segmentation], {"er": 1}, tmp_path / "m.zarr")
    with pytest.raises(ValueError, match=r"\['golgi'\] are not classes"):
        merge_classes([a, b], {"golgi": 1}, tmp_path / "m.zarr")
    with pytest.raises(ValueError, match="indices"):
        merge_classes([a, b], {"er": 2}, tmp_path / "m.zarr")
    with pytest.raises(ValueError, match=r"missing from the stores: .*b\.zarr.*crop2"):
        merge_classes([a, b], {"er": 1}, tmp_path / "m.zarr", crops=["crop1", "crop2"])
    assert merge_classes([a, b], {"er": 1}, tmp_path / "m.zarr").completed() == ["crop1"]  # crops in every store


def test_a_channel_copied_file_by_file_must_lie_on_the_writers_grid(tmp_path):
    a = probabilities(tmp_path / "a.zarr", 0)
    out = PredictionStore.create(tmp_path / "o.zarr", kind="probabilities", channels=CHANNELS)
    writer = out.crop_writer("crop1", FINE)
    with pytest.raises(ValueError, match=r"a\.zarr/crop1/mito lies on .*this crop writes it on"):
        writer.copy("mito", a, "crop1")
    with pytest.raises(ValueError, match="not a channel of this crop"):
        writer.copy("golgi", a, "crop1")
    segmentation = PredictionStore.create(tmp_path / "s.zarr", kind="segmentation", channels=CHANNELS)
    with pytest.raises(ValueError, match="cannot copy probabilities"):
        segmentation.crop_writer("crop1", GRID).copy("mito", a, "crop1")
    writer = out.crop_writer("crop1", GRID)
    for channel in CHANNELS:
        writer.copy(channel, a, "crop1")
    writer.commit()
    assert all(np.array_equal(out.read("crop1", c), a.read("crop1", c)) for c in CHANNELS)
