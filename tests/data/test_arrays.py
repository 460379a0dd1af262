"""World-coordinate reads of multiscale groups, both backends, padding, resampling and bad input."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellseg.data.arrays import BACKENDS, MultiscaleImage, choose_level
from cellseg.data.ngff import pyramid_levels
from cellseg.data.write import downsample_2x, write_multiscale


@pytest.fixture(scope="module")
def em_volume():
    rng = np.random.default_rng(7)
    return rng.integers(1, 256, size=(40, 48, 56), dtype=np.uint8)


@pytest.fixture(scope="module")
def em_path(tmp_path_factory, em_volume):
    path = tmp_path_factory.mktemp("io") / "ds.zarr" / "recon-1" / "em" / "fibsem-uint8"
    return write_multiscale(path, em_volume, voxel_size_nm=(4, 4, 4), translation_nm=(100, 200, 300),
                            kind="em", num_levels=3, chunks=(16, 16, 16))


@pytest.fixture(scope="module")
def labels_path(tmp_path_factory):
    ids = np.zeros((20, 24, 28), dtype=np.uint32)
    ids[2:8, 3:9, 4:10] = 70000  # an id beyond uint16, never to be wrapped or averaged
    ids[10:18, 10:20, 12:26] = 3
    path = tmp_path_factory.mktemp("io") / "ds.zarr" / "recon-1" / "labels" / "groundtruth" / "crop1" / "mito"
    return write_multiscale(path, ids, voxel_size_nm=(8, 8, 8), translation_nm=(4, 4, 4), kind="labels")


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_levels_and_translations(em_path, em_volume, backend):
    img = MultiscaleImage(em_path, backend=backend, expected_dtype="uint8")
    assert [lv.voxel_size_nm for lv in img.levels] == [(4, 4, 4), (8, 8, 8), (16, 16, 16)]
    assert [lv.translation_nm for lv in img.levels] == [(100, 200, 300), (102, 202, 302), (106, 206, 306)]
    assert [lv.shape_vox for lv in img.levels] == [(40, 48, 56), (20, 24, 28), (10, 12, 14)]
    np.testing.assert_array_equal(img.read_level("s0"), em_volume)
    np.testing.assert_array_equal(img.read_level("s1"), downsample_2x(em_volume, "em"))
    # The s1 grid read by world coordinates is exactly level s1, no resampling.
    s1 = img.read(translation_nm=(102, 202, 302), shape_vox=(20, 24, 28), voxel_size_nm=(8, 8, 8))
    assert s1.dtype == np.uint8
    np.testing.assert_array_equal(s1, img.read_level("s1"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("face", range(6))
def test_padding_at_every_border(em_path, em_volume, backend, face):
    img = MultiscaleImage(em_path, backend=backend)
    axis, side = divmod(face, 2)
    start = [100 + 4 * 5, 200 + 4 * 5, 300 + 4 * 5]
    n = em_volume.shape[axis]
    start[axis] = (100, 200, 300)[axis] + 4 * (-3 if side == 0 else n - 7)  # 3 voxels before / after
    out, inside = img.read(translation_nm=start, shape_vox=(10, 10, 10), voxel_size_nm=(4, 4, 4),
                           pad_value=np.nan, dtype="float32", return_mask=True)
    outside = np.take(out, range(3) if side == 0 else range(7, 10), axis=axis)
    assert np.isnan(outside).all() and not np.isnan(out[inside]).any()
    assert inside.sum() == 700
    src = [slice(5, 15)] * 3
    src[axis] = slice(0, 7) if side == 0 else slice(n - 7, n)
    np.testing.assert_array_equal(out[inside].reshape(np.asarray(em_volume[tuple(src)]).shape), em_volume[tuple(src)])


def test_pad_modes_and_errors(em_path):
    img = MultiscaleImage(em_path)
    zeros = img.read(translation_nm=(0, 0, 0), shape_vox=(4, 4, 4), voxel_size_nm=(4, 4, 4))
    assert zeros.dtype == np.uint8 and not zeros.any()
    with pytest.raises(ValueError, match="reaches outside the volume") as info:
        img.read(translation_nm=(0, 0, 0), shape_vox=(4, 4, 4), voxel_size_nm=(4, 4, 4), pad_value=None)
    assert "fibsem-uint8/s0" in str(info.value)
    with pytest.raises(ValueError, match="does not fit output dtype uint8"):
        img.read(translation_nm=(0, 0, 0), shape_vox=(4, 4, 4), voxel_size_nm=(4, 4, 4), pad_value=np.nan)


@settings(max_examples=25, deadline=None)
@given(offset=st.tuples(*[st.integers(-20, 60)] * 3), shape=st.tuples(*[st.integers(1, 24)] * 3),
       level=st.sampled_from([4, 8, 16]), shift_nm=st.sampled_from([0.0, 1.0, 2.5]),
       interp=st.sampled_from(["nearest", "linear", "area"]))
def test_backends_return_identical_arrays(em_path, offset, shape, level, shift_nm, interp):
    kwargs = dict(translation_nm=[100 + level * o + shift_nm for o in offset], shape_vox=shape,
                  voxel_size_nm=(level, level, level), interpolation=interp, pad_value=0, level="s0")
    a = MultiscaleImage(em_path, backend="tensorstore").read(**kwargs)
    b = MultiscaleImage(em_path, backend="zarr").read(**kwargs)
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def test_area_down_sampling_is_block_mean(em_path, em_volume):
    img = MultiscaleImage(em_path)
    out = img.read(translation_nm=(102, 202, 302), shape_vox=(20, 24, 28), voxel_size_nm=(8, 8, 8),
                   level="s0", interpolation="area")
    assert out.dtype == np.float32
    expected = em_volume.reshape(20, 2, 24, 2, 28, 2).mean(axis=(1, 3, 5))
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_linear_half_voxel_shift_averages_neighbours(em_path, em_volume):
    img = MultiscaleImage(em_path)
    out = img.read(translation_nm=(100 + 4 * 5 + 2, 200 + 4 * 5, 300 + 4 * 5), shape_vox=(3, 3, 3),
                   voxel_size_nm=(4, 4, 4), interpolation="linear")
    vol = em_volume.astype(np.float64)
    np.testing.assert_allclose(out, (vol[5:8, 5:8, 5:8] + vol[6:9, 5:8, 5:8]) / 2, rtol=1e-6)


def test_label_resampling_never_averages_ids(labels_path):
    img = MultiscaleImage(labels_path)
    # Finer than any level and off-grid: must be nearest from s0 with values from {0, 3, 70000}.
    out = img.read(translation_nm=(3, 3, 3), shape_vox=(40, 48, 56), voxel_size_nm=(4, 4, 4),
                   interpolation="nearest")
    assert out.dtype == np.uint32
    assert set(np.unique(out)) == {0, 3, 70000}
    # Every 4 nm voxel centre lies in the 8 nm voxel containing it.
    coarse = img.read_level("s0")
    idx = np.floor((3 + 4 * np.arange(40) - 4) / 8 + 0.5).astype(int).clip(0, 19)
    np.testing.assert_array_equal(out[:, 0, 0], coarse[idx, 0, 0])


def test_reading_at_a_size_that_needs_a_coarser_level(em_path):
    img = MultiscaleImage(em_path)
    assert img.choose_level((16, 16, 16)).path == "s2"
    assert img.choose_level((12, 12, 12)).path == "s1"  # closest by summed relative difference
    assert img.choose_level((12, 12, 12), policy="finer").path == "s1"
    assert img.choose_level((15, 15, 15), policy="finer").path == "s1"
    assert img.choose_level((15, 15, 15)).path == "s2"
    out = img.read(translation_nm=(106, 206, 306), shape_vox=(10, 12, 14), voxel_size_nm=(16, 16, 16))
    np.testing.assert_array_equal(out, img.read_level("s2"))


def test_choose_level_rules():
    levels = pyramid_levels((4, 4, 4), (0, 0, 0), 4)
    assert choose_level(levels, (8.04, 8, 8)) == 1  # within 1 %: the same resolution
    assert choose_level(levels, (6, 6, 6)) == 0  # tie between 4 and 8 goes to the finer level
    assert choose_level(levels, (2, 2, 2), policy="finer") == 0  # nothing fine enough: finest
    aniso = pyramid_levels((2.62, 2, 2), (0, 0, 0), 3)
    assert choose_level(aniso, (8, 8, 8)) == 2


def test_anisotropic_level_read_to_isotropic_grid(tmp_path):
    vol = np.arange(12 * 16 * 16, dtype=np.float32).reshape(12, 16, 16)
    path = write_multiscale(tmp_path / "a.zarr" / "em", vol, voxel_size_nm=(2.62, 2, 2), translation_nm=(0, 0, 0),
                            kind="em", num_levels=1)
    # 2x2x2 blocks: the output voxel centre is the midpoint of the first two source centres.
    out = MultiscaleImage(path).read(translation_nm=(1.31, 1, 1), shape_vox=(4, 8, 8), voxel_size_nm=(5.24, 4, 4),
                                     interpolation="area")
    np.testing.assert_allclose(out, vol[0:8].reshape(4, 2, 8, 2, 8, 2).mean(axis=(1, 3, 5)), rtol=1e-5)


def test_bad_input_errors_name_the_path(tmp_path, em_path, labels_path):
    with pytest.raises(ValueError, match="dtype is uint32, expected uint8") as info:
        MultiscaleImage(labels_path, expected_dtype="uint8")
    assert str(labels_path) in str(info.value)
    plain = tmp_path / "plain.zarr"
    plain.mkdir()
    (plain / ".zgroup").write_text('{"zarr_format": 2}')
    with pytest.raises(ValueError, match="no OME-NGFF 'multiscales'") as info:
        MultiscaleImage(plain)
    assert str(plain) in str(info.value)
    (plain / ".zattrs").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        MultiscaleImage(plain)
    # A level listed in the metadata but missing on disk.
    attrs = json.loads((em_path / ".zattrs").read_text())
    attrs["multiscales"][0]["datasets"].append({"path": "s9", "coordinateTransformations": [
        {"type": "scale", "scale": [64, 64, 64]}]})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ".zattrs").write_text(json.dumps(attrs))
    with pytest.raises(FileNotFoundError, match=r"missing \.zarray"):
        MultiscaleImage(broken)
    with pytest.raises(ValueError, match="no level 's7'"):
        MultiscaleImage(em_path).level("s7")
    with pytest.raises(ValueError, match="unknown array backend"):
        MultiscaleImage(em_path, backend="h5py")
