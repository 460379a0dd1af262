"""The anisotropic pyramid: in-plane halving until isotropic, then all axes; translations; labels by mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.write import downsample_2x
from cellseg.ingest.pyramid import (
    level_chunks,
    level_factors,
    pyramid_sections,
    write_label_pyramid,
    write_pyramid,
)


def test_sbem_halves_in_plane_until_isotropic_then_everything() -> None:
    factors = level_factors((40, 5, 5), (400, 4096, 4096))
    assert factors[:4] == [(1, 2, 2), (1, 2, 2), (1, 2, 2), (2, 2, 2)]
    assert set(factors[3:]) == {(2, 2, 2)}
    # 4 x 4 x 30 nm: 8, 16, then 32 (closer to 30 than 16 is), then all axes.
    assert level_factors((30, 4, 4), (512, 512, 512))[:4] == [(1, 2, 2), (1, 2, 2), (1, 2, 2), (2, 2, 2)]
    assert level_factors((8, 8, 8), (128, 128, 128)) == [(2, 2, 2)] * 3  # isotropic: as data.write does
    assert level_factors((4, 8, 8), (256, 256, 256))[0] == (2, 1, 1)  # z finer: halve z first


def test_pyramid_stops_before_an_axis_drops_below_16() -> None:
    assert level_factors((40, 5, 5), (10, 96, 96)) == [(1, 2, 2), (1, 2, 2)]  # 96 → 48 → 24, never 12
    assert level_factors((8, 8, 8), (20, 500, 500)) == []  # z would go to 10
    assert pyramid_sections((40, 5, 5), (10, 96, 96)) == 30


def test_chunks_are_about_isotropic_in_nm() -> None:
    assert level_chunks((40, 5, 5), (400, 4096, 4096)) == (8, 64, 64)
    assert level_chunks((40, 40, 40), (400, 512, 512)) == (64, 64, 64)
    assert level_chunks((40, 5, 5), (3, 40, 4096)) == (3, 40, 64)  # clipped to the array


def test_levels_voxel_sizes_translations_and_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    em = rng.integers(1, 255, (40, 136, 144), dtype=np.uint8)
    group = tmp_path / "em.zarr" / "fibsem-uint8"
    factors = write_pyramid(group, lambda z0, z1: em[z0:z1], shape_vox=em.shape, dtype=np.uint8,
                            voxel_size_nm=(20, 5, 5), translation_nm=(0, 0, 0), kind="em")
    assert factors == [(1, 2, 2), (1, 2, 2), (2, 2, 2)]
    image = MultiscaleImage(str(group), backend="zarr")
    assert [lv.voxel_size_nm for lv in image.levels] == [(20, 5, 5), (20, 10, 10), (20, 20, 20), (40, 40, 40)]
    # Centre of voxel 0 moves by half a new voxel minus half an old one, on the halved axes only.
    assert [lv.translation_nm for lv in image.levels] == [(0, 0, 0), (0, 2.5, 2.5), (0, 7.5, 7.5), (10, 17.5, 17.5)]
    assert [lv.shape_vox for lv in image.levels] == [(40, 136, 144), (40, 68, 72), (40, 34, 36), (20, 17, 18)]
    expected = em
    for level, step in zip(image.levels[1:], factors, strict=True):
        expected = downsample_2x(expected, "em", factors=step)  # slab by slab equals all at once
        np.testing.assert_array_equal(image.read_level(level.path), expected)


def test_label_ids_are_never_averaged(tmp_path: Path) -> None:
    ids = np.zeros((8, 64, 64), np.uint32)
    ids[:, :32, :] = 3
    ids[:, 32:, :] = 7  # an average of 3 and 7 would be 5
    ids[:, 30:34, 10:20] = 1_000_000
    group = tmp_path / "c.zarr" / "mito"
    write_label_pyramid(group, ids, voxel_size_nm=(40, 5, 5), translation_nm=(20, 2.5, 2.5))
    image = MultiscaleImage(str(group), backend="zarr")
    assert len(image.levels) == 3 and image.levels[1].voxel_size_nm == (40, 10, 10)
    for level in image.levels:
        data = image.read_level(level.path)
        assert data.dtype == np.uint32 and set(np.unique(data)) <= {3, 7, 1_000_000}


def test_group_must_not_exist(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    with pytest.raises(FileExistsError):
        write_label_pyramid(tmp_path / "g", np.zeros((4, 16, 16), np.uint8), voxel_size_nm=(1, 1, 1),
                            translation_nm=(0, 0, 0))


def test_slabs_along_z_equal_one_pass_odd_sizes_included(tmp_path: Path) -> None:
    em = np.random.default_rng(2).integers(1, 255, (147, 32, 33), dtype=np.uint8)  # s1 has 2 slabs of z
    group = tmp_path / "iso.zarr" / "em"
    assert write_pyramid(group, lambda z0, z1: em[z0:z1], shape_vox=em.shape, dtype=np.uint8,
                         voxel_size_nm=(8, 8, 8), translation_nm=(0, 0, 0), kind="em") == [(2, 2, 2)]
    image = MultiscaleImage(str(group), backend="zarr")
    np.testing.assert_array_equal(image.read_level("s0"), em)
    np.testing.assert_array_equal(image.read_level("s1"), downsample_2x(em, "em"))
