"""The per-crop boundary cache gives the per-sample boundary channels (inside the patch), built once."""

import numpy as np
import pytest

from cellseg.config.schema import AugmentConfig, DataConfig, LoaderConfig
from cellseg.data.boundary_cache import resolve_cache_dir
from cellseg.data.grid import Grid
from cellseg.data.loader import build_train_data

NO_AUG = AugmentConfig(enabled=False)
EDGE = 1  # voxels at a patch's faces may differ: the cache sees the neighbour outside the patch


def _dataset(root, cache_dir, *, run_dir=None):
    data = DataConfig(root=str(root), classes=("mito", "ves", "nuc", "er"), voxel_size_nm=(8.0, 8.0, 8.0),
                      patch_shape_vox=(16, 16, 16), boundary_cache=cache_dir)
    return build_train_data(data, LoaderConfig(num_workers=0, samples_per_epoch=16), NO_AUG, batch_size=2, seed=3,
                            run_dir=run_dir).dataset


@pytest.fixture(scope="module")
def pair(tiny_synth_root, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return _dataset(tiny_synth_root, None), _dataset(tiny_synth_root, str(cache)), cache


def test_cached_boundaries_equal_per_sample_ones_inside_the_patch(pair):
    plain, cached, _ = pair
    assert plain.target_mode == cached.target_mode == "ids"
    interior = (slice(None),) + (slice(EDGE, -EDGE),) * 3
    checked = 0
    for i in range(12):
        a, b = plain[i], cached[i]
        assert np.array_equal(a["ids"], b["ids"])
        for key in ("target_bits", "known_bits"):
            assert np.array_equal(a[key].numpy()[interior], b[key].numpy()[interior]), (i, key)
        checked += int(a["target_bits"].numpy().any())
    assert checked > 0  # some samples do contain boundary voxels


def test_cache_files_are_built_once_per_crop_and_reused(pair, tiny_synth_root):
    _, cached, cache = pair
    for i in range(8):
        cached[i]
    files = sorted(cache.glob("*.zarr"))
    assert files and len(files) == len({f.name.split("-")[0] for f in files})  # one file per crop
    stamps = {f: (f / ".zarray").stat().st_mtime_ns for f in files}
    again = _dataset(tiny_synth_root, str(cache))
    for i in range(8):
        again[i]
    assert {f: (f / ".zarray").stat().st_mtime_ns for f in files} == stamps


def test_rank0_warms_every_training_crop(tiny_synth_root, tmp_path):
    (tmp_path / "run").mkdir()
    ds = _dataset(tiny_synth_root, str(tmp_path / "c"), run_dir=tmp_path / "run")
    with_aux = [c for c in ds.crops if c.aux_classes]
    assert len(list((tmp_path / "c").glob("*.zarr"))) == len(with_aux)


def test_off_lattice_grid_falls_back(pair):
    _, cached, _ = pair
    crop = next(c for c in cached.crops if c.aux_classes)
    cache = crop.boundary_cache((8.0, 8.0, 8.0))
    lattice = cache.grid
    shifted = Grid(translation_nm=tuple(t + 3.0 for t in lattice.translation_nm), shape_vox=(4, 4, 4),
                   voxel_size_nm=(8.0, 8.0, 8.0))
    assert cache.read(shifted) is None
    coarser = Grid(translation_nm=lattice.translation_nm, shape_vox=(4, 4, 4), voxel_size_nm=(16.0, 16.0, 16.0))
    assert cache.read(coarser) is None
    outside = Grid(translation_nm=tuple(t - 1000 * 8.0 for t in lattice.translation_nm), shape_vox=(4, 4, 4),
                   voxel_size_nm=(8.0, 8.0, 8.0))
    t, k = cache.read(outside)
    assert not t.any() and not k.any()


def test_cache_dir_setting(monkeypatch, tmp_path):
    assert resolve_cache_dir(None) is None
    assert resolve_cache_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "x"))
    assert resolve_cache_dir("auto") == tmp_path / "x" / "boundaries"
