"""Every input format reads back the same (z, y, x) volume, lazily where it can; bad inputs are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cellseg.ingest.readers import natural_key, open_volume, split_spec

BOX = (slice(3, 7), slice(10, 30), slice(0, 96))


def _check(spec: str, expected: np.ndarray, axes: str = "zyx") -> None:
    volume = open_volume(spec, axes=axes)
    assert volume.shape == expected.shape and volume.dtype == expected.dtype
    np.testing.assert_array_equal(volume.read(), expected)
    np.testing.assert_array_equal(volume.read(BOX), expected[BOX])
    np.testing.assert_array_equal(volume.sections(5, 9), expected[5:9])


def test_tiff_folder_in_natural_order(inputs: dict[str, str], arrays: dict[str, np.ndarray]) -> None:
    _check(inputs["em"], arrays["em"])  # sec2.tif before sec10.tif
    assert sorted(["s10.tif", "s2.tif", "S1.tif"], key=natural_key) == ["S1.tif", "s2.tif", "s10.tif"]


def test_multipage_tiff_and_npy(inputs: dict[str, str], arrays: dict[str, np.ndarray]) -> None:
    _check(inputs["mito"], arrays["mito_ids"])
    _check(inputs["er"], arrays["er"])


def test_single_3d_tiff_page(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    import tifffile

    path = tmp_path / "volume.tif"
    tifffile.imwrite(path, arrays["mito_ids"], photometric="minisblack", planarconfig="separate")
    _check(str(path), arrays["mito_ids"])


def test_zarr_array_and_array_in_a_group(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    import zarr

    zarr.save_array(str(tmp_path / "em.zarr"), arrays["em"], chunks=(8, 32, 32))
    _check(str(tmp_path / "em.zarr"), arrays["em"])
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_dataset("raw/s0", data=arrays["em"], chunks=(8, 32, 32))
    _check(f"{tmp_path / 'g.zarr'}:raw/s0", arrays["em"])
    with pytest.raises(ValueError, match="is a zarr group"):
        open_volume(str(tmp_path / "g.zarr"))
    with pytest.raises(FileNotFoundError, match="no array 'nope'"):
        open_volume(f"{tmp_path / 'g.zarr'}:nope")


def test_hdf5_dataset(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    h5py = pytest.importorskip("h5py")  # an optional dependency (cellseg[hdf5]; in the dev extra)
    path = tmp_path / "volume.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("volumes/raw", data=arrays["em"], chunks=(8, 32, 32))
        f.create_dataset("volumes/labels", data=arrays["seg"])
    _check(f"{path}:/volumes/raw", arrays["em"])
    _check(f"{path}:volumes/labels", arrays["seg"])
    with pytest.raises(ValueError, match="name the dataset"):
        open_volume(str(path))  # two datasets: which one?
    with pytest.raises(FileNotFoundError, match="no dataset"):
        open_volume(f"{path}:/volumes/missing")


def test_hdf5_without_h5py_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    path = tmp_path / "volume.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n")
    monkeypatch.setitem(sys.modules, "h5py", None)  # makes `import h5py` fail
    with pytest.raises(ValueError, match=r"pip install cellseg\[hdf5\]"):
        open_volume(f"{path}:/raw")


def test_axis_order_is_transposed_to_zyx(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.save(tmp_path / "xyz.npy", np.transpose(arrays["em"], (2, 1, 0)))
    _check(str(tmp_path / "xyz.npy"), arrays["em"], axes="xyz")
    np.save(tmp_path / "yxz.npy", np.transpose(arrays["em"], (1, 2, 0)))
    _check(str(tmp_path / "yxz.npy"), arrays["em"], axes="yxz")


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    np.save(tmp_path / "flat.npy", np.zeros((4, 4)))
    with pytest.raises(ValueError, match=r"flat.npy: expected a 3D volume, got shape \(4, 4\)"):
        open_volume(str(tmp_path / "flat.npy"))
    with pytest.raises(FileNotFoundError, match=r"missing\.tif: no such file"):
        open_volume(str(tmp_path / "missing.tif"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported input"):
        open_volume(str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.tif/\.tiff files"):
        open_volume(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="permutation of 'zyx'"):
        open_volume(str(tmp_path / "flat.npy"), axes="zyxc")


def test_tiff_sections_must_match(tmp_path: Path) -> None:
    import tifffile

    folder = tmp_path / "stack"
    folder.mkdir()
    tifffile.imwrite(folder / "a1.tif", np.zeros((8, 8), np.uint8))
    tifffile.imwrite(folder / "a2.tif", np.zeros((8, 9), np.uint8))
    with pytest.raises(ValueError, match=r"a2\.tif: shape"):
        open_volume(str(folder))


def test_split_spec() -> None:
    assert split_spec("/d/vol.h5:/raw/s0") == (Path("/d/vol.h5"), "/raw/s0")
    assert split_spec("/d/vol.zarr:raw") == (Path("/d/vol.zarr"), "raw")
    assert split_spec("/d/a:b/vol.npy") == (Path("/d/a:b/vol.npy"), "")
