"""Label arrays agree with each other and with the EM: groups are unions of atoms, instance ids are
connected components, `all` matches the atoms, and the EM looks like EM (dark membranes, black borders)."""

from __future__ import annotations

from pathlib import Path

import cc3d
import numpy as np
import pytest
import zarr

from cellseg import classes
from cellseg.classes import get_class
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.crops import Catalog, Crop
from cellseg.synth.atoms import ATOM_NAMES, check_coverage, scene_atom_ids


@pytest.fixture(scope="module")
def crops(tiny_synth_root: Path) -> list[tuple[Crop, dict[str, np.ndarray]]]:
    catalog = Catalog.from_dir(tiny_synth_root)
    loaded = []
    for crop in catalog.train.values():
        base = tiny_synth_root / crop.crop_url
        arrays = {name: zarr.open_array(str(base / name / "s0"), mode="r")[...] for name in [*crop.classes, "all"]}
        loaded.append((crop, arrays))
    return loaded


def test_dtypes_and_values(crops: list) -> None:
    for _, arrays in crops:
        for name, data in arrays.items():
            if name == "all":
                assert data.dtype == np.uint8
            elif get_class(name).instance:
                assert data.dtype == np.uint32
            else:
                assert data.dtype == np.uint8 and set(np.unique(data)) <= {0, 1}


def test_groups_are_unions_of_their_atoms(crops: list) -> None:
    checked = 0
    for _, arrays in crops:
        for name in arrays:
            if name == "all" or not get_class(name).is_group:
                continue
            atoms = [get_class(i).name for i in scene_atom_ids(name)]
            if all(a in arrays for a in atoms):
                union = np.any([arrays[a] > 0 for a in atoms], axis=0)
                np.testing.assert_array_equal(arrays[name] > 0, union, err_msg=name)
                checked += 1
    assert checked >= 30


def test_instance_ids_are_connected_components(crops: list) -> None:
    for crop, arrays in crops:
        for name, data in arrays.items():
            if name == "all" or not get_class(name).instance:
                continue
            ids = np.unique(data[data > 0])
            _, num = cc3d.connected_components(data, connectivity=26, return_N=True)
            assert num == len(ids), f"crop{crop.id}/{name}: {len(ids)} ids but {num} components"
            if len(ids):
                assert ids[0] == 1 and ids[-1] == len(ids)


def test_all_array_matches_annotated_atoms(crops: list) -> None:
    for crop, arrays in crops:
        for name, data in arrays.items():
            if name != "all" and not get_class(name).is_group:
                np.testing.assert_array_equal(arrays["all"] == get_class(name).id, data > 0, err_msg=name)
        known = {get_class(n).id for n in crop.classes}
        assert set(np.unique(arrays["all"])) <= known | {0}


def test_every_tested_class_occurs(crops: list) -> None:
    present = {name for _, arrays in crops for name, data in arrays.items() if name != "all" and data.any()}
    assert present == set(classes.tested_classes())


def test_a_tested_class_no_painted_atom_covers_is_refused() -> None:
    check_coverage()  # the atoms scenes paint cover every tested class (also checked when the module is imported)
    with pytest.raises(RuntimeError, match="mt_in"):
        check_coverage(tuple(a for a in ATOM_NAMES if a != "mt_in"))


def test_em_and_labels_read_on_the_crop_grid(tiny_synth_root: Path, crops: list) -> None:
    membrane, lumen, cytosol = [], [], []
    for crop, arrays in crops:
        g = crop.geometry
        em = MultiscaleImage(tiny_synth_root / crop.em_url, expected_dtype="uint8").read(
            translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm,
            interpolation="area", dtype="float32")
        label = MultiscaleImage(tiny_synth_root / crop.crop_url / "cell").read(
            translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm)
        np.testing.assert_array_equal(label, arrays["cell"])
        if "pm" in arrays and "cyto" in arrays and g.voxel_size_nm[-1] < 6:
            membrane.append(em[(arrays["pm"] > 0) | (arrays.get("er_mem", 0) > 0)])
            lumen.append(em[arrays["ecs"] > 0])
            cytosol.append(em[arrays["cyto"] > 0])
    mem, cyto, ecs = (np.concatenate(v).mean() for v in (membrane, cytosol, lumen))
    assert mem + 30 < cyto < ecs


def test_em_has_black_regions_and_texture(tiny_synth_root: Path) -> None:
    for dataset in ("synth-iso4-1", "synth-aniso-1", "synth-iso8-1"):
        em = zarr.open_array(str(tiny_synth_root / dataset / f"{dataset}.zarr/recon-1/em/fibsem-uint8/s0"), mode="r")[...]
        black = em == 0
        assert 0.01 < black.mean() < 0.3
        assert em[~black].min() >= 1 and em[~black].std() > 20
