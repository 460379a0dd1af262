"""The EM padding mask: black regions connected to the volume's edge are padding, black holes inside cells are data."""

import numpy as np
import pytest
import torch
from crafted import write_root

from cellseg.config.schema import AugmentConfig, DataConfig, LoaderConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.loader import build_train_data
from cellseg.data.padding import EdgeRegion, edge_seeds, padding_mask
from cellseg.data.write import write_multiscale

VS = (8.0, 8.0, 8.0)


def _volume():
    """64³ EM at 8 nm: grey 120, a black wedge at x < 16 for y < 32 (it reaches the volume's x = 0 face) and a
    black 6³ hole in the middle (a lipid droplet)."""
    em = np.full((64, 64, 64), 120, np.uint8)
    em[:, :32, :16] = 0
    em[29:35, 29:35, 29:35] = 0
    return em


@pytest.fixture
def em(tmp_path):
    path = tmp_path / "ds.zarr" / "recon-1" / "em" / "fibsem-uint8"
    write_multiscale(path, _volume(), voxel_size_nm=VS, translation_nm=(4, 4, 4), kind="em", num_levels=2)
    return MultiscaleImage(path)


def _read(em, translation_vox, shape_vox):
    grid = Grid.of(translation_nm=[4 + 8 * t for t in translation_vox], shape_vox=shape_vox, voxel_size_nm=VS)
    data, inside = em.read(**grid.read_kwargs(), pad_value=0, return_mask=True)
    return grid, data, inside


def test_modes_on_a_whole_volume():
    em = _volume()
    faces = np.zeros(em.shape, bool)
    faces[[0, -1]] = faces[:, [0, -1]] = faces[:, :, [0, -1]] = True  # the whole volume: its faces are the edge
    wedge = np.zeros(em.shape, bool)
    wedge[:, :32, :16] = True
    np.testing.assert_array_equal(padding_mask(em, pad_value=0, mode="edge", seeds=faces), wedge)
    assert padding_mask(em, pad_value=0, mode="value")[29:35, 29:35, 29:35].all()
    assert not padding_mask(em, pad_value=0, mode="off").any()
    assert not padding_mask(em, pad_value=0, mode="edge").any()  # no seeds: nothing known to reach the edge
    with pytest.raises(ValueError, match="unknown padding mode 'black'"):
        padding_mask(em, pad_value=0, mode="black")  # type: ignore[arg-type]


@pytest.mark.parametrize("levels", [1, 2], ids=["fine", "coarse"])
def test_a_border_entering_a_patch_from_inside_the_volume_is_padding_a_hole_is_not(em, levels):
    # The crop's region: voxels 8..56 on every axis (inside the volume); the wedge crosses its x = 8 face.
    region = EdgeRegion.compute(em, (64.0,) * 3, (448.0,) * 3, pad_value=0,
                                max_voxels=48**3 if levels == 1 else 24**3)
    assert region.grid.voxel_size_nm == (VS if levels == 1 else (16.0, 16.0, 16.0))
    # A patch at voxels 20..44 in z and y, 10..40 in x: the wedge enters it across its x = 10 face, inside the volume.
    grid, data, inside = _read(em, (20, 20, 10), (24, 24, 30))
    assert inside.all()
    mask = padding_mask(data, pad_value=0, mode="edge", seeds=edge_seeds(grid, inside=inside, region=region))
    np.testing.assert_array_equal(mask[:, :12, :6], True)  # the wedge: y 20..32, x 10..16
    assert not mask[9:15, 9:15, 19:25].any() and (data[9:15, 9:15, 19:25] == 0).all()  # the hole stays data
    assert mask.sum() == 24 * 12 * 6


def test_reads_outside_the_volume_are_padding(em):
    region = EdgeRegion.compute(em, (320.0,) * 3, (384.0,) * 3, pad_value=0)  # a small box of grey voxels
    assert region.grid is None  # nothing padding-valued touches its faces: nothing kept
    grid, data, inside = _read(em, (56, 40, 40), (16, 8, 8))  # half of it beyond z = 64
    mask = padding_mask(data, pad_value=0, mode="edge", seeds=edge_seeds(grid, inside=inside, region=region))
    np.testing.assert_array_equal(mask, ~inside)


def _data(root, **kw):
    return DataConfig(root=str(root), classes=("mito", "ecs"), voxel_size_nm=VS, patch_shape_vox=(24, 24, 24), **kw)


def _known_black(td, n=8):
    """Per sample voxel: known (mito channel), black EM, and the world position (z, y, x; nm) of its centre."""
    samples = [td.dataset[i] for i in range(n)]
    _, _, known = td.augment(torch.utils.data.default_collate(samples), 0)
    black = torch.stack([s["image"][0] == 0 for s in samples])
    grids = [td.dataset.grid_for(td.dataset.sampler(i), td.dataset.patch_shape_vox) for i in range(n)]
    zyx = torch.stack([torch.from_numpy(np.stack(np.meshgrid(*[t + v * np.arange(k) for t, v, k in zip(
        g.translation_nm, g.voxel_size_nm, g.shape_vox, strict=True)], indexing="ij"))) for g in grids])
    return known[:, 0], black, zyx


def test_training_masks_the_black_border_and_keeps_a_black_hole(tmp_path):
    root = write_root(tmp_path, black_slab=True)  # EM black at x < 24 nm: the volume's border
    em_path = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1" / "em" / "fibsem-uint8"
    volume = MultiscaleImage(em_path).read_level("s0")
    volume[28:34, 28:34, 28:34] = 0  # a black hole inside crop 1: 112-136 nm on every axis
    write_multiscale(em_path, volume, voxel_size_nm=(4, 4, 4), translation_nm=(0, 0, 0), kind="em", overwrite=True)
    args = dict(loader=LoaderConfig(num_workers=0), augment=AugmentConfig(enabled=False), batch_size=2, seed=0)
    known, black, zyx = _known_black(build_train_data(_data(root), **args))
    in_crop = ((zyx >= 32) & (zyx < 224)).all(dim=1)  # labelled, and inside the EM volume
    border = black & (zyx[:, 2] < 24) & ((zyx[:, :2] >= 0) & (zyx[:, :2] < 256)).all(dim=1)
    hole = black & in_crop
    assert border.any() and hole.any()
    assert not known[border].any() and known[hole].all()
    known, *_ = _known_black(build_train_data(_data(root, padding_mask_by_dataset={"jrc_test-1": "value"}), **args))
    assert not known[black].any()
    dataset = build_train_data(_data(root, padding_mask="off"), **args).dataset
    spec = dataset.sampler(0)
    crop, grid = dataset.crops[spec.crop], dataset.grid_for(spec)
    em, inside = crop.em().read(**grid.read_kwargs(), pad_value=0, return_mask=True)
    assert (em == 0).any() and not dataset.padding(crop, grid, em, inside).any()


def test_padding_mode_is_checked():
    with pytest.raises(ValueError, match=r"data.padding_mask_by_dataset.jrc_x=.*choose one of"):
        DataConfig(root=".", classes=("mito",), padding_mask_by_dataset={"jrc_x": "black"})  # type: ignore[dict-item]
