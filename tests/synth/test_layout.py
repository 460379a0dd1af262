"""The synthetic root follows the CellMap layout: paths, OME-NGFF metadata, translations, manifests,
datasplit, ground_truth.zarr."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from cellseg import classes
from cellseg.data.crops import Catalog
from cellseg.data.inspect import EM_PATH, GT_PATH
from cellseg.data.ngff import parse_multiscales


def _attrs(path: Path) -> dict:
    return json.loads((path / ".zattrs").read_text())


@pytest.fixture(scope="module")
def catalog(tiny_synth_root: Path) -> Catalog:
    return Catalog.from_dir(tiny_synth_root)


def test_catalog_loads_every_dataset_and_crop(catalog: Catalog) -> None:
    assert catalog.datasets == ("synth-aniso-1", "synth-iso4-1", "synth-iso8-1")
    assert len(catalog.train) == 6 and len(catalog.test()) == 2
    assert set(catalog.train).isdisjoint(catalog.test())


def test_manifest_urls_are_relative_and_resolve(tiny_synth_root: Path, catalog: Catalog) -> None:
    header = (tiny_synth_root / "manifest.csv").read_text().splitlines()[0]
    assert header == "crop_number,collection,alignment,crop_url,em_url"
    for crop in catalog.train.values():
        assert not crop.crop_url.startswith("/") and crop.crop_url.endswith(f"{GT_PATH}/crop{crop.id}")
        assert Path(catalog.locate(crop.crop_url).url.removeprefix("file://")).is_dir()
        assert (tiny_synth_root / crop.em_url / ".zattrs").is_file()


def test_em_pyramid_follows_the_voxel_centre_convention(tiny_synth_root: Path) -> None:
    for dataset in ("synth-iso4-1", "synth-aniso-1", "synth-iso8-1"):
        group = tiny_synth_root / dataset / f"{dataset}.zarr" / EM_PATH
        levels = parse_multiscales(_attrs(group), source=str(group))
        assert [lv.path for lv in levels][:3] == ["s0", "s1", "s2"]
        for lv in levels[1:]:
            expected = np.add(levels[0].translation_nm,
                              (np.array(lv.voxel_size_nm) - levels[0].voxel_size_nm) / 2)
            np.testing.assert_allclose(lv.translation_nm, expected)
        meta = json.loads((group / "s0" / ".zarray").read_text())
        assert meta["dtype"] == "|u1"


def test_datasets_cover_anisotropic_and_coarse_crops(catalog: Catalog, tiny_synth_root: Path) -> None:
    em_vs = {"synth-iso4-1": (4, 4, 4), "synth-aniso-1": (5.24, 4, 4), "synth-iso8-1": (8, 8, 8)}
    em_origin = {"synth-iso4-1": (0, 0, 0), "synth-aniso-1": (0, 0, 0), "synth-iso8-1": (800, 400, 1200)}
    coarse = 0
    for crop in [*catalog.train.values(), *catalog.test().values()]:
        g = crop.geometry
        evs, origin = np.array(em_vs[crop.dataset]), np.array(em_origin[crop.dataset])
        scale = np.array(g.voxel_size_nm) / evs
        k = (np.array(g.translation_nm) - origin - (np.array(g.voxel_size_nm) - evs) / 2) / g.voxel_size_nm
        np.testing.assert_allclose(k, np.round(k), atol=1e-6)  # translation = origin + (cvs - evs)/2 + k·cvs
        coarse += bool(np.all(scale > 1.5))
    assert coarse >= 2
    assert len(set(em_vs["synth-aniso-1"])) == 2


def test_label_groups_are_multiscale_with_crop_geometry(tiny_synth_root: Path, catalog: Catalog) -> None:
    crop = catalog.train[2]  # annotated at 8 nm from a 4 nm EM
    g = crop.geometry
    base = tiny_synth_root / crop.crop_url
    for name in [*crop.classes, "all"]:
        levels = parse_multiscales(_attrs(base / name), source=name)
        assert levels[0].voxel_size_nm == g.voxel_size_nm and levels[0].translation_nm == g.translation_nm
        assert json.loads((base / name / "s0" / ".zarray").read_text())["shape"] == list(g.shape_vox)
        assert json.loads((base / name / "s0" / ".zattrs").read_text())["class_counts"][name] >= 0


def test_label_arrays_carry_cellmap_annotation_metadata(tiny_synth_root: Path, catalog: Catalog) -> None:
    import zarr

    from cellseg.data.annotation import read_annotation
    from cellseg.data.arrays import MultiscaleImage

    crop = catalog.train[2]
    base = tiny_synth_root / crop.crop_url
    for name in crop.classes:
        group = _attrs(base / name)["cellmap"]["annotation"]
        instance = classes.get_class(name).instance
        assert group == {"class_name": name, "annotation_type": {
            "type": "instance_segmentation" if instance else "semantic_segmentation",
            "encoding": {"absent": 0, "unknown": 255, **({} if instance else {"present": 1})}}}
        for level in parse_multiscales(_attrs(base / name), source=name):
            data = zarr.open_array(str(base / name / level.path), mode="r")[...]
            counts = _attrs(base / name / level.path)["cellmap"]["annotation"]["complement_counts"]
            assert counts == {"absent": int((data == 0).sum()), "unknown": 0}
        note = read_annotation(MultiscaleImage(base / name))
        assert note.positives == _attrs(base / name / "s0")["class_counts"][name] and not note.may_hold_unknown
    assert "cellmap" not in _attrs(base / "all")  # not a class


def test_unannotated_classes_are_absent(tiny_synth_root: Path, catalog: Catalog) -> None:
    partial = [c for c in catalog.train.values() if len(c.classes) < 48]
    assert len(partial) >= 2
    for crop in partial:
        on_disk = {p.name for p in (tiny_synth_root / crop.crop_url).iterdir() if p.is_dir()}
        assert on_disk == {*crop.classes, "all"}
        assert set(classes.tested_classes()) - on_disk  # some tested class missing on purpose


def test_datasplit_is_the_quoted_five_column_form(tiny_synth_root: Path, catalog: Catalog) -> None:
    text = (tiny_synth_root / "datasplit.csv").read_text()
    rows = list(csv.reader(text.splitlines()))
    assert {r[0] for r in rows} == {"train", "validate"} and len(rows) == len(catalog.train)
    for line, row in zip(text.splitlines(), rows, strict=True):
        assert line == ",".join(f'"{field}"' for field in row)
        _, raw, raw_name, gt, gt_name = row
        assert not Path(raw).is_absolute() and raw == gt and raw_name == EM_PATH  # relative: a copy reads its own
        crop_id = int(gt_name.split("/crop")[1].split("/")[0])
        listed = gt_name.split("[")[1].rstrip("]").split(",")
        assert set(listed) == set(catalog.train[crop_id].classes)
        assert (tiny_synth_root / gt / gt_name.split("/[")[0]).is_dir()


def test_validation_crops_cover_every_class(tiny_synth_root: Path) -> None:
    info = json.loads((tiny_synth_root / "synth.json").read_text())
    gt = tiny_synth_root
    present: dict[str, set[str]] = {"train": set(), "validate": set()}
    for crop in info["crops"]:
        if crop["split"] == "test":
            continue
        folder = gt / crop["dataset"] / f"{crop['dataset']}.zarr" / GT_PATH / f"crop{crop['id']}"
        for name in crop["classes"]:
            if json.loads((folder / name / "s0" / ".zattrs").read_text())["class_counts"][name]:
                present[crop["split"]].add(name)
    assert present["validate"] == present["train"] | present["validate"] == set(classes.tested_classes())


def test_test_crops_live_only_in_ground_truth_zarr(tiny_synth_root: Path, catalog: Catalog) -> None:
    for crop in catalog.test().values():
        assert not list(tiny_synth_root.glob(f"*/*.zarr/{GT_PATH}/crop{crop.id}"))
        g = crop.geometry
        for name in crop.classes:
            attrs = _attrs(tiny_synth_root / "ground_truth.zarr" / f"crop{crop.id}" / name)
            assert attrs == {"voxel_size": list(g.voxel_size_nm), "translation": list(g.translation_nm),
                             "shape": list(g.shape_vox)}
    assert (tiny_synth_root / "ground_truth.zarr" / ".zgroup").is_file()
