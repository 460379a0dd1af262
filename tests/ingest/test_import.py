"""An imported root opens with the readers cellseg trains from: catalogue, datasplit (with its gap), EM pyramid,
label crops (ids kept, mapped classes, `all`), the uint8 conversion and the ready-to-train configs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from cellseg import classes
from cellseg.classes import get_class
from cellseg.cli import main
from cellseg.config import load_run_config
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.crops import Catalog
from cellseg.data.split import read_datasplit
from cellseg.ingest.labels import MappedVolume, parse_class_map

GT = "sections/sections.zarr/recon-1/labels/groundtruth"
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke" / "imported_unet_2d.yaml")


def _crops(root: Path) -> dict[str, list]:
    catalog = Catalog.from_dir(root)
    roles = {e.crop_name: e.split for e in read_datasplit(root / "datasplit.csv")}
    out: dict[str, list] = {"train": [], "validate": []}
    for crop in catalog.train.values():
        out[roles[crop.name]].append(crop)
    return out


def test_root_opens_with_catalogue_datasplit_and_multiscale_reader(tmp_path, import_args, arrays) -> None:
    out = tmp_path / "root"
    assert main(import_args(out)) == 0
    catalog = Catalog.from_dir(out)
    assert catalog.datasets == ("sections",) and len(catalog.train) == 5
    split = read_datasplit(out / "datasplit.csv")
    assert sorted(e.split for e in split) == ["train"] * 4 + ["validate"]
    for entry, crop in zip(sorted(split, key=lambda e: e.crop_name), catalog.train.values(), strict=True):
        assert entry.classes == ("mito", "er") and crop.classes == ("er", "mito")
        assert Path(entry.crop_url) == Path(str(catalog.locate(crop.crop_url)))
        assert entry.em_url == str(out / "sections/sections.zarr/recon-1/em/fibsem-uint8")
    em = MultiscaleImage(split[0].em_url, backend="zarr", expected_dtype="uint8")
    assert [lv.voxel_size_nm for lv in em.levels] == [(40, 5, 5), (40, 10, 10), (40, 20, 20)]
    assert [lv.translation_nm for lv in em.levels] == [(0, 0, 0), (0, 2.5, 2.5), (0, 7.5, 7.5)]
    record = json.loads((out / "import.json").read_text())
    low, high = record["uint8"]["low"], record["uint8"]["high"]
    expected = np.rint(np.clip((arrays["em"] - low) * 254 / (high - low) + 1, 1, 255)).astype(np.uint8)
    np.testing.assert_array_equal(em.read_level("s0"), expected)
    assert record["uint8"]["percentiles"] == [0.1, 99.9] and record["generator"] == "cellseg import"


@pytest.mark.parametrize(("axis", "side"), [("z", "end"), ("z", "start"), ("y", "end")])
def test_validation_crops_keep_the_gap_from_training_crops(tmp_path, import_args, axis, side) -> None:
    out = tmp_path / "root"
    gap = "80" if axis == "z" else "40"
    args = import_args(out, "--split-axis", axis, "--val-side", side, "--val-fraction", "0.2")
    args[args.index("--gap-nm") + 1] = gap
    assert main(args) == 0
    a = "zyx".index(axis)
    crops = _crops(out)
    train_lo = min(c.geometry.start_nm[a] for c in crops["train"])
    train_hi = max(c.geometry.stop_nm[a] for c in crops["train"])
    val_lo = min(c.geometry.start_nm[a] for c in crops["validate"])
    val_hi = max(c.geometry.stop_nm[a] for c in crops["validate"])
    distance = val_lo - train_hi if side == "end" else train_lo - val_hi
    assert float(gap) <= distance < float(gap) + 40  # at least the gap, rounded up to whole voxels
    other = [b for b in range(3) if b != a]
    for crop in crops["train"] + crops["validate"]:  # crops span the labelled box on the other axes
        assert [crop.geometry.extent_nm[b] for b in other] == [[960, 480, 480][b] for b in other]


def test_labels_round_trip_ids_kept_masks_binary(tmp_path, import_args, arrays) -> None:
    out = tmp_path / "root"
    assert main(import_args(out)) == 0
    for crop in Catalog.from_dir(out).train.values():
        z0 = round(crop.geometry.translation_nm[0] / 40)
        box = slice(z0, z0 + crop.geometry.shape_vox[0])
        folder = out / GT / crop.name
        assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["er", "mito"]  # no `all` here
        mito = MultiscaleImage(str(folder / "mito"), backend="zarr")
        np.testing.assert_array_equal(mito.read_level("s0"), arrays["mito_ids"][box])
        assert mito.read_level("s0").dtype == np.uint32
        for level in mito.levels[1:]:
            assert set(np.unique(mito.read_level(level.path))) <= {0, 3, 7}  # mode, never an average
        er = MultiscaleImage(str(folder / "er"), backend="zarr").read_level("s0")
        assert er.dtype == np.uint8 and np.array_equal(er, arrays["er"][box])
        counts = json.loads((folder / "mito" / "s0" / ".zattrs").read_text())["class_counts"]
        assert counts == {"mito": int(np.count_nonzero(arrays["mito_ids"][box]))}


def test_mapped_volume_gives_components_masks_and_all(tmp_path, inputs, arrays) -> None:
    out = tmp_path / "root"
    (tmp_path / "map.yaml").write_text("1: mito\n2: er\n")
    assert main(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(out), "--labels", inputs["seg"],
                 "--class-map", str(tmp_path / "map.yaml"), "--gap-nm", "80", "--experiments", SMOKE]) == 0
    crop = Catalog.from_dir(out).train[1]
    folder = out / GT / crop.name
    mito = MultiscaleImage(str(folder / "mito"), backend="zarr").read_level("s0")
    assert mito.dtype == np.uint32 and set(np.unique(mito)) == {0, 1, 2}  # two objects, connected components
    np.testing.assert_array_equal(mito > 0, arrays["mito_ids"][: crop.geometry.shape_vox[0]] > 0)
    ids = MultiscaleImage(str(folder / "all"), backend="zarr").read_level("s0")
    assert set(np.unique(ids)) == {0, get_class("mito").id, get_class("er").id}
    assert parse_class_map("1=mito,2=er") == {1: "mito", 2: "er"}


def test_mapped_group_contains_its_parts() -> None:
    mapped = MappedVolume(volume=None, mapping={1: "mito_mem", 2: "mito_lum", 3: "er", 4: "mito"})  # type: ignore[arg-type]
    assert mapped.values_of("mito") == [1, 2, 4] and mapped.values_of("mito_mem") == [1]


def test_binary_mask_of_an_instance_class_becomes_ids(tmp_path, inputs, arrays) -> None:
    np.save(tmp_path / "mask.npy", (arrays["mito_ids"] > 0).astype(np.uint8))
    out = tmp_path / "root"
    assert main(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(out), "--label",
                 f"mito={tmp_path / 'mask.npy'}", "--gap-nm", "0", "--experiments", SMOKE]) == 0
    mito = MultiscaleImage(str(out / GT / "crop1" / "mito"), backend="zarr").read_level("s0")
    assert set(np.unique(mito)) == {0, 1, 2}


def test_explicit_window_and_uint8_input(tmp_path, inputs, arrays, caplog) -> None:
    out = tmp_path / "windowed"
    caplog.set_level(logging.INFO, logger="cellseg.ingest")
    assert main(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(out), "--window", "500,1500"]) == 0
    assert "uint16 → uint8: [500, 1500] (given window)" in caplog.text
    em = MultiscaleImage(str(out / "sections/sections.zarr/recon-1/em/fibsem-uint8"), backend="zarr")
    expected = np.rint(np.clip((arrays["em"] - 500.0) * 254 / 1000 + 1, 1, 255)).astype(np.uint8)
    np.testing.assert_array_equal(em.read_level("s0"), expected)
    assert Catalog.from_dir(out).train == {} and not (out / "datasplit.csv").exists()  # EM only
    raw = arrays["er"] * 200  # uint8 with zeros: copied, and the zeros are pointed out
    np.save(tmp_path / "u8.npy", raw)
    caplog.clear()
    assert main(["import", str(tmp_path / "u8.npy"), "--voxel-size", "8,8,8", "--out", str(tmp_path / "u8")]) == 0
    assert "copied unchanged" in caplog.text and "of the EM voxels are 0" in caplog.text
    em = MultiscaleImage(str(tmp_path / "u8/u8/u8.zarr/recon-1/em/fibsem-uint8"), backend="zarr")
    np.testing.assert_array_equal(em.read_level("s0"), raw)


def test_labels_of_a_sub_region_on_their_own_grid_and_a_test_box(tmp_path, inputs, arrays) -> None:
    coarse = arrays["mito_ids"][4:20, ::2, ::2]  # z 160-800 nm, at 40 x 10 x 10 nm
    np.save(tmp_path / "coarse.npy", coarse)
    out = tmp_path / "root"
    assert main(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(out), "--label",
                 f"mito={tmp_path / 'coarse.npy'}", "--labels-voxel-size", "40,10,10", "--labels-offset", "160,0,0",
                 "--gap-nm", "40", "--test-box", "20:24,0:96,0:96", "--experiments", SMOKE]) == 0
    catalog = Catalog.from_dir(out)
    first = catalog.train[1].geometry
    assert first.voxel_size_nm == (40, 10, 10) and first.translation_nm == (160, 2.5, 2.5)
    test = catalog.test("2026")
    assert list(test) == [max(catalog.train) + 1]
    geometry = next(iter(test.values())).geometry
    assert geometry.translation_nm == (800, 0, 0) and geometry.shape_vox == (4, 96, 96)
    assert next(iter(test.values())).classes == ("mito",)
    em_only = tmp_path / "em_only"
    assert main(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(em_only), "--test-box",
                 "0:4,0:32,0:32"]) == 0
    assert set(next(iter(Catalog.from_dir(em_only).test("2026").values())).classes) == set(classes.tested_classes())


def test_configs_train_without_overrides(tmp_path, inputs) -> None:
    out = tmp_path / "root"
    assert main(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(out), "--label",
                 f"mito={inputs['mito']}", "--gap-nm", "80"]) == 0  # default experiments: the checkout's
    names = sorted(p.name for p in out.glob("train_*.yaml"))
    assert names == ["train_resnet_2d.yaml", "train_unet_2d.yaml"]
    cfg = load_run_config(out / "train_unet_2d.yaml")
    assert cfg.data.root == str(out) and cfg.data.datasplit == str(out / "datasplit.csv")
    assert cfg.data.classes == ("mito",) and cfg.data.voxel_size_nm == (40, 5, 5)
    assert cfg.data.slice_axes == ("z",) and cfg.data.patch_shape_vox == (1, 256, 256)
    assert cfg.model.name == "unet_2d" and cfg.run_dir == "runs/sections/unet_2d"
    iso = tmp_path / "iso"
    assert main(["import", inputs["em"], "--voxel-size", "8,8,8", "--out", str(iso), "--label",
                 f"mito={inputs['mito']}", "--gap-nm", "16"]) == 0
    assert load_run_config(iso / "train_unet_2d.yaml").data.slice_axes == ("z", "y", "x")


def test_float_em_nan_is_no_data_and_a_constant_volume_is_refused(tmp_path) -> None:
    from cellseg.ingest.intensity import choose_window
    from cellseg.ingest.readers import open_volume

    em = np.linspace(-1, 1, 8 * 32 * 32, dtype=np.float32).reshape(8, 32, 32)
    em[:, :4] = np.nan
    np.save(tmp_path / "f.npy", em)
    window = choose_window(open_volume(str(tmp_path / "f.npy")), percentiles=(0, 100))
    assert (window.low, window.high) == (np.nanmin(em), np.nanmax(em))  # every section sampled; NaN ignored
    converted = window.apply(em)
    assert np.all(converted[:, :4] == 0) and converted[:, 4:].min() == 1 and converted.max() == 255
    np.save(tmp_path / "c.npy", np.full((4, 8, 8), 7, np.int16))
    with pytest.raises(ValueError, match="constant; give --window"):
        choose_window(open_volume(str(tmp_path / "c.npy")))


@pytest.mark.parametrize("fmt", ["tif", "npy", "zarr", "h5"])
def test_every_em_format_imports_with_mapped_labels(tmp_path, arrays, fmt) -> None:
    em, seg = arrays["em"], arrays["seg"]
    if fmt == "tif":
        import tifffile

        tifffile.imwrite(tmp_path / "em.tif", em)
        tifffile.imwrite(tmp_path / "seg.tif", seg)
        em_spec, seg_spec = str(tmp_path / "em.tif"), str(tmp_path / "seg.tif")
    elif fmt == "npy":
        np.save(tmp_path / "em.npy", em)
        np.save(tmp_path / "seg.npy", seg)
        em_spec, seg_spec = str(tmp_path / "em.npy"), str(tmp_path / "seg.npy")
    elif fmt == "zarr":
        import zarr

        group = zarr.open_group(str(tmp_path / "em.zarr"), mode="w")
        group.create_dataset("raw", data=em, chunks=(8, 32, 32))
        group.create_dataset("seg", data=seg, chunks=(8, 32, 32))
        em_spec, seg_spec = f"{tmp_path / 'em.zarr'}:raw", f"{tmp_path / 'em.zarr'}:seg"
    else:
        h5py = pytest.importorskip("h5py")  # optional (cellseg[hdf5]); the dev extra installs it
        with h5py.File(tmp_path / "em.h5", "w") as f:
            f.create_dataset("raw", data=em)
            f.create_dataset("seg", data=seg)
        em_spec, seg_spec = f"{tmp_path / 'em.h5'}:/raw", f"{tmp_path / 'em.h5'}:/seg"
    out = tmp_path / "root"
    assert main(["import", em_spec, "--voxel-size", "40,5,5", "--out", str(out), "--labels", seg_spec,
                 "--class-map", "1=mito,2=er", "--gap-nm", "80", "--window", "0,2000", "--experiments", SMOKE]) == 0
    catalog = Catalog.from_dir(out)
    assert catalog.datasets == ("em",) and {c.classes for c in catalog.train.values()} == {("er", "mito")}
    em_group = MultiscaleImage(str(out / "em/em.zarr/recon-1/em/fibsem-uint8"), backend="zarr")
    expected = np.rint(np.clip((em - 0.0) * 254 / 2000 + 1, 1, 255)).astype(np.uint8)
    np.testing.assert_array_equal(em_group.read_level("s0"), expected)
    assert len(read_datasplit(out / "datasplit.csv")) == len(catalog.train)
