"""The automatic split balances classes by foreground, not by listing: a crop that lists a class it does not
hold gives no decision anything to learn about that class. Both validation roles keep crops all the same."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from cellseg.config.schema import DataConfig
from cellseg.data.crops import Catalog, format_vector
from cellseg.data.loader import make_split
from cellseg.data.split import assign_roles, foreground_classes, spatial_groups, split_catalog

VOXEL_NM = (8.0, 8.0, 8.0)
SHAPE = (8, 8, 8)  # voxels of every crafted crop
SEMANTIC = {"type": "semantic_segmentation", "encoding": {"absent": 0, "unknown": 255, "present": 1}}
SMOKE_CLASSES = ("mito", "er", "nuc", "ecs", "pm", "ld")  # configs/smoke/*.yaml


def _write_crop(gt: Path, name: str, data: np.ndarray, *, counted: bool) -> None:
    """One semantic label group `gt/name/s0` (a single level), with complement counts when `counted`."""
    group = zarr.open_group(str(gt / name), mode="w")
    group.attrs["multiscales"] = [{"version": "0.4", "name": name, "axes": [
        {"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"], "datasets": [
        {"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": list(VOXEL_NM)},
                                                     {"type": "translation", "translation": [0.0, 0.0, 0.0]}]}]}]
    if counted:
        group.attrs["cellmap"] = {"annotation": {"class_name": name, "annotation_type": SEMANTIC,
                                                 "complement_counts": {"absent": int((data == 0).sum())}}}
    group.create_dataset("s0", data=data, chunks=SHAPE)


def _write_root(root: Path, holds: dict[int, set[str]], *, listed=("mito", "er"), uncounted=()) -> Path:
    """One dataset per crop (so each crop is a spatial group of its own), every crop listing `listed`; crop N
    has foreground of the classes `holds[N]` (a block of ones) and none of the others (all zeros). Crops in
    `uncounted` carry no annotation metadata."""
    rows, urls = [], []
    for n, held in holds.items():
        ds = f"jrc_crafted-{n}"
        gt = root / ds / f"{ds}.zarr" / "recon-1" / "labels" / "groundtruth" / f"crop{n}"
        for name in listed:
            data = np.zeros(SHAPE, np.uint8)
            data[2:6, 2:6, 2:6] = 1 if name in held else 0
            _write_crop(gt, name, data, counted=n not in uncounted)
            rows.append(f"{n},{ds},{name},{format_vector(VOXEL_NM)},{format_vector((0.0, 0.0, 0.0))},"
                        f"{format_vector(SHAPE).replace('.0', '')}")
        gt_rel = f"{ds}/{ds}.zarr/recon-1/labels/groundtruth/crop{n}"
        urls.append(f"{n},{ds},recon-1,{gt_rel},{ds}/{ds}.zarr/recon-1/em/fibsem-uint8")
    (root / "train_crop_manifest.csv").write_text(
        "crop_name,dataset,class_label,voxel_size,translation,shape\n" + "\n".join(rows) + "\n")
    (root / "manifest.csv").write_text("crop_number,collection,alignment,crop_url,em_url\n" + "\n".join(urls) + "\n")
    return root


def _validation(entries):
    return [e.crop_name for e in entries if e.split == "validate"]


def test_a_class_listed_everywhere_gets_a_validation_crop_holding_it(tmp_path):
    """mito is listed on six crops and held by two: whatever the seed, validation holds some mito (by listing
    alone, the first crop of the shuffled order would go, four times in six without mito)."""
    holds = {n: {"er", "mito"} if n in (5, 6) else {"er"} for n in range(1, 7)}
    catalog = Catalog.from_dir(_write_root(tmp_path, holds))
    assert foreground_classes(catalog.train[1], catalog) == ("er",)
    assert set(foreground_classes(catalog.train[5], catalog)) == {"mito", "er"}
    for seed in range(12):
        entries = split_catalog(catalog, ["mito", "er"], validation_fraction=1 / 6, seed=seed)
        val = _validation(entries)
        assert any(name in val for name in ("crop5", "crop6")), (seed, val)
        assert [set(e.classes) for e in entries] == [{"mito", "er"}] * 6  # the datasplit still lists what is listed


def test_crops_without_foreground_metadata_fall_back_to_their_listing(tmp_path):
    holds = {n: {"er"} for n in range(1, 7)}
    catalog = Catalog.from_dir(_write_root(tmp_path, holds, uncounted=(3, 4)))
    assert set(foreground_classes(catalog.train[3], catalog)) == {"mito", "er"}  # all zeros, but nothing says so
    assert foreground_classes(catalog.train[1], catalog) == ("er",)
    # The only crops that may hold mito are the uncounted ones: one of them validates.
    for seed in range(6):
        val = _validation(split_catalog(catalog, ["mito", "er"], validation_fraction=1 / 6, seed=seed))
        assert {"crop3", "crop4"} & set(val), (seed, val)
    # Labels not on disk (an unfetched catalogue): the listing.
    shutil.rmtree(catalog.locate(catalog.train[2].crop_url).url)
    assert set(foreground_classes(catalog.train[2], catalog)) == {"mito", "er"}


def test_foreground_classes_are_those_whose_s0_holds_positive_voxels(tiny_synth_root):
    catalog = Catalog.from_dir(tiny_synth_root)
    absent_listed = 0
    for crop in list(catalog.train.values())[:4]:
        where = catalog.locate(crop.crop_url).url
        held = []
        for name in crop.classes:
            arr = zarr.open(f"{where}/{name}/s0", mode="r")
            encoding = zarr.open(f"{where}/{name}", mode="r").attrs.get("cellmap", {}).get("annotation", {}).get(
                "annotation_type", {}).get("encoding", {})
            data = arr[...]
            positive = data != encoding.get("absent", 0)
            if encoding.get("unknown") is not None:
                positive &= data != encoding["unknown"]
            held += [name] if positive.any() else []
        assert foreground_classes(crop, catalog) == tuple(held)
        absent_listed += len(crop.classes) - len(held)
    assert absent_listed > 0  # some listed classes are absent: the case this exists for


def test_every_validation_class_choice_rests_on_foreground(tiny_synth_root):
    """Each class with foreground in two or more spatial groups has a validation crop holding it."""
    catalog = Catalog.from_dir(tiny_synth_root)
    classes = ["mito", "er", "nuc", "ecs", "pm", "lyso"]
    crops = {c.name: c for c in catalog.train.values()}
    for seed in range(3):
        entries = split_catalog(catalog, classes, validation_fraction=0.3, seed=seed)
        val = [crops[e.crop_name] for e in entries if e.split == "validate"]
        groups = spatial_groups(list(crops.values()))
        for name in classes:
            holding = [g for g in groups if any(name in foreground_classes(c, catalog) for c in g)]
            if len(holding) >= 2:
                assert any(name in foreground_classes(c, catalog) for c in val), (seed, name)


@pytest.mark.parametrize("datasplit", [None, "auto"], ids=["root_datasplit", "automatic"])
@pytest.mark.parametrize("classes", [SMOKE_CLASSES, ("mito", "er", "nuc", "ecs", "pm", "lyso")])
def test_tiny_root_keeps_a_report_and_a_tuning_crop(tiny_synth_root, datasplit, classes):
    """On the tiny root, classes held by one validation crop each (ecs and pm by crop 2, nuc by crop 3 of the
    root's own split) would claim every crop for tuning; the report part keeps one. (The automatic split
    validates one spatial group at the default 15 %: 0.3 gives it several.)"""
    cfg = DataConfig(root=str(tiny_synth_root), classes=classes, patch_shape_vox=(16, 16, 16), datasplit=datasplit,
                     validation_fraction=0.3)
    entries = make_split(cfg)
    roles = [e.role for e in entries if e.split == "validate"]
    assert len(roles) >= 2 and {"tuning", "report"} <= set(roles), roles


def test_roles_keep_both_parts_when_single_group_classes_claim_every_group():
    # Every class is held by one group: the class rule alone puts all three in tuning.
    groups = [[(1, ("ecs", "pm"))], [(2, ("nuc",))], [(3, ("er", "mito")), (4, ("er",))]]
    roles = assign_roles(groups, ["mito", "er", "nuc", "ecs", "pm"])
    assert roles == {1: "tuning", 2: "report", 3: "tuning", 4: "tuning"}  # the group losing one class moves
    # No class held at all: the share decides, and still both parts exist.
    roles = assign_roles([[(1, ())], [(2, ())]], ["mito"], report_fraction=0.9)
    assert set(roles.values()) == {"tuning", "report"}
    assert set(assign_roles([[(1, ("mito",))]], ["mito"]).values()) == {"tuning"}  # one group: one part


def test_split_is_deterministic_for_a_seed(tiny_synth_root, tmp_path):
    classes = ["mito", "er", "nuc", "ecs", "pm", "lyso"]
    catalog = Catalog.from_dir(tiny_synth_root)
    first = split_catalog(catalog, classes, validation_fraction=0.3, seed=3)
    assert split_catalog(Catalog.from_dir(tiny_synth_root), classes, validation_fraction=0.3, seed=3) == first
    crafted = Catalog.from_dir(_write_root(tmp_path, {n: {"er", "mito"} if n % 3 == 0 else {"er"}
                                                      for n in range(1, 10)}))
    runs = {seed: [split_catalog(crafted, ["mito", "er"], validation_fraction=0.3, seed=seed) for _ in range(2)]
            for seed in range(5)}
    assert all(a == b for a, b in runs.values())
    assert len({tuple(_validation(a)) for a, _ in runs.values()}) > 1  # the seed does choose
