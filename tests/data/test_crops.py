"""The crop catalogue against the official manifests (packaged in `cellseg/manifests/`)."""

from collections import Counter

import pytest

from cellseg.data.crops import Catalog, Geometry, format_vector, parse_vector

# Crops per dataset in the official `train_crop_manifest.csv`.
PER_DATASET = {
    "cos7-1a": 12, "cos7-1b": 11, "ctl-id8-1": 5, "fly-mb-1a": 6, "fly-vnc-1": 6, "hela-2": 26, "hela-3": 19,
    "jurkat-1": 20, "macrophage-2": 18, "mus-heart-1": 2, "mus-kidney": 23, "mus-kidney-3": 1,
    "mus-kidney-glomerulus-2": 1, "mus-liver": 24, "mus-liver-3": 1, "mus-liver-zon-1": 42, "mus-liver-zon-2": 19,
    "mus-nacc-1": 1, "sum159-1": 12, "sum159-4": 18, "ut21-1413-003": 18, "zf-cardiac-1": 4,
}


@pytest.fixture(scope="module")
def catalog():
    return Catalog.official()


def test_official_counts(catalog):
    assert len(catalog.datasets) == 22
    assert len(catalog.train) == 289
    assert len(catalog.test("2025")) == len(catalog.test("2026")) == 16
    assert sum(len(c.labels) for c in catalog.test("2025").values()) == 420
    assert sum(len(c.labels) for c in catalog.test("2026").values()) == 413
    assert sum(len(c.labels) for c in catalog.train.values()) == 11786
    assert not set(catalog.train) & set(catalog.test("2026"))


def test_crops_per_dataset(catalog):
    assert {ds.removeprefix("jrc_"): len(catalog.crops_of(ds)) for ds in catalog.datasets} == PER_DATASET


def test_voxel_size_histogram(catalog):
    sizes = Counter(c.geometry.voxel_size_nm for c in catalog.train.values())
    assert sizes[(4.0, 4.0, 4.0)] == 102
    assert sizes[(32.0, 32.0, 32.0)] == 36
    assert sizes[(2.62, 2.0, 2.0)] == 26
    assert sizes[(64.0, 64.0, 64.0)] == 2


def test_pr212_removed_rows(catalog):
    old = {(c.id, label) for c in catalog.test("2025").values() for label in c.labels}
    new = {(c.id, label) for c in catalog.test("2026").values() for label in c.labels}
    assert new < old
    assert old - new == {(984, "mito"), (984, "np"), (984, "ne"), (984, "ne_mem_all"), (984, "chrom"),
                         (983, "ne_mem_all"), (981, "mt_in")}


def test_test_crop_geometry(catalog):
    crop = catalog.test("2026")[982]
    assert crop.dataset == "jrc_mus-nacc-1"
    assert crop.geometry == Geometry(voxel_size_nm=(16.0, 16.0, 16.0), translation_nm=(6.0, 6.0, 6.0),
                                     shape_vox=(140, 400, 400))
    assert crop.geometry.start_nm == (-2.0, -2.0, -2.0)
    assert crop.geometry.extent_nm == (2240.0, 6400.0, 6400.0)


def test_urls(catalog):
    crop = catalog.train[234]
    assert crop.crop_url.endswith("jrc_cos7-1a.zarr/recon-1/labels/groundtruth/crop234")
    assert catalog.locate(crop.em_url).url.startswith("https://janelia-cosem-datasets.s3.amazonaws.com/")


def test_vectors_round_trip():
    assert parse_vector("[1.74;2.0;2.0]") == (1.74, 2.0, 2.0)
    assert parse_vector(format_vector((23837.13, 7599, 1))) == (23837.13, 7599.0, 1.0)
    with pytest.raises(ValueError, match="malformed manifest vector"):
        parse_vector("[1,2,3]")


def test_from_dir_with_relative_urls(tmp_path):
    (tmp_path / "train_crop_manifest.csv").write_text(
        "crop_name,dataset,class_label,voxel_size,translation,shape\n"
        "7,ds-a,mito,[8.0;8.0;8.0],[4.0;4.0;4.0],[10;10;10]\n"
        "7,ds-a,er,[8.0;8.0;8.0],[4.0;4.0;4.0],[10;10;10]\n")
    (tmp_path / "manifest.csv").write_text(
        "crop_number,collection,alignment,crop_url,em_url\n"
        "7,ds-a,recon-1,ds-a/ds-a.zarr/recon-1/labels/groundtruth/crop7,ds-a/ds-a.zarr/recon-1/em/fibsem-uint8\n")
    cat = Catalog.from_dir(tmp_path)
    assert cat.train[7].classes == ("er", "mito")
    assert cat.locate(cat.train[7].em_url).url == str(tmp_path / "ds-a/ds-a.zarr/recon-1/em/fibsem-uint8")
    with pytest.raises(ValueError, match="no test manifest"):
        cat.test("2026")


def test_bad_manifests(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train_crop_manifest\.csv"):
        Catalog.from_dir(tmp_path)
    (tmp_path / "train_crop_manifest.csv").write_text("crop,dataset\n1,a\n")
    with pytest.raises(ValueError, match="expected columns"):
        Catalog.from_dir(tmp_path)
    (tmp_path / "train_crop_manifest.csv").write_text(
        "crop_name,dataset,class_label,voxel_size,translation,shape\n1,a,mito,[8;8],[0;0;0],[1;1;x]\n")
    with pytest.raises(ValueError, match="line 2"):
        Catalog.from_dir(tmp_path)


def test_crop_ids_and_names_parse_the_same_way_everywhere():
    from cellseg.data.crops import crop_id, crop_name

    assert crop_id(12) == crop_id("12") == crop_id(" crop12 ") == 12
    assert crop_name("012") == crop_name(12) == "crop12"
    for bad in ("mito", "crop", "12a", "-3"):
        with pytest.raises(ValueError, match="is not a crop id"):
            crop_id(bad)
