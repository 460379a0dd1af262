"""Reading a user's 3D volume lazily, in (z, y, x) order, from TIFF, NumPy, HDF5 or zarr.

A volume is named by one string (`open_volume`):

| spec | what it is |
|---|---|
| `DIR/` holding `*.tif`/`*.tiff` | a stack of 2D images, one section per file, in natural order (`s2` before `s10`) |
| `FILE.tif` | a multi-page (or single 3D) TIFF |
| `FILE.npy` | a NumPy array (memory-mapped) |
| `FILE.h5:/path/in/file` | an HDF5 dataset (needs h5py: `pip install cellseg[hdf5]`) |
| `DIR.zarr` or `DIR.zarr:path/in/group` | a zarr array |

The input's axis order is given as a permutation of "zyx" (`axes="xyz"` for an array indexed `[x, y, z]`;
a TIFF stack's axes are (file, row, column)). Every read returns (z, y, x); only the requested region is
read where the format allows it (TIFF files and pages, memory-mapped .npy, HDF5 and zarr slicing).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
AXES = "zyx"
TIFF_SUFFIXES = (".tif", ".tiff")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
Box = tuple[slice, slice, slice]
SourceRead = Callable[[tuple[slice, slice, slice]], np.ndarray]  # region in the input's own axis order


@dataclass(frozen=True, kw_only=True, eq=False)
class Volume:
    """A 3D volume opened for reading in (z, y, x) order.

    Attributes:
        source: the spec it was opened from (quoted in error messages).
        shape: (z, y, x) voxels.
        dtype: the stored dtype.
        axes: the input's axis order, a permutation of "zyx".
    """

    source: str
    shape: tuple[int, int, int]
    dtype: np.dtype
    axes: str
    _read: SourceRead

    def read(self, box: Box | None = None) -> np.ndarray:
        """The voxels of `box` (slices with explicit, in-range bounds, in z, y, x order); default everything."""
        box = box or tuple(slice(0, n) for n in self.shape)  # type: ignore[assignment]
        source_box = tuple(box[AXES.index(a)] for a in self.axes)
        data = np.asarray(self._read(source_box))  # type: ignore[arg-type]
        return np.transpose(data, [self.axes.index(a) for a in AXES])

    def sections(self, z0: int, z1: int) -> np.ndarray:
        """Sections `z0:z1` (all of y and x)."""
        return self.read((slice(z0, z1), slice(0, self.shape[1]), slice(0, self.shape[2])))


def natural_key(name: str) -> list[object]:
    """Sort key ordering embedded numbers by value: `s2.tif` before `s10.tif`."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def split_spec(spec: str) -> tuple[Path, str]:
    """`FILE.h5:/a/b` → (`FILE.h5`, `/a/b`); a spec without an inner path → (path, "")."""
    head, sep, inner = spec.rpartition(":")
    if sep and head and Path(head).suffix.lower() in (*HDF5_SUFFIXES, ".zarr"):
        return Path(head), inner
    return Path(spec), ""


def check_axes(axes: str) -> str:
    """Validate an axis order (a permutation of "zyx").

    Raises:
        ValueError: anything else, e.g. "zyxc" or "zzx".
    """
    if sorted(axes) != sorted(AXES):
        raise ValueError(f"axis order {axes!r} must be a permutation of 'zyx' (e.g. zyx, xyz)")
    return axes


def open_volume(spec: str, *, axes: str = AXES) -> Volume:
    """Open a volume named as in the module docstring, with the input's axis order `axes`.

    Raises:
        FileNotFoundError: the file, folder or inner dataset does not exist.
        ValueError: not 3D, an unsupported format, or mismatched TIFF sections.
    """
    check_axes(axes)
    path, inner = split_spec(spec)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if path.is_dir() and ((path / ".zarray").exists() or (path / ".zgroup").exists() or suffix == ".zarr"):
        shape, dtype, read = _zarr(path, inner)
    elif path.is_dir():
        shape, dtype, read = _tiff_folder(path)
    elif suffix in TIFF_SUFFIXES:
        shape, dtype, read = _tiff_file(path)
    elif suffix == ".npy":
        array = np.load(path, mmap_mode="r")
        shape, dtype, read = array.shape, array.dtype, lambda box: array[box]
    elif suffix in HDF5_SUFFIXES:
        shape, dtype, read = _hdf5(path, inner)
    else:
        raise ValueError(f"{spec}: unsupported input; give a folder of 2D TIFFs, a .tif/.tiff, a .npy, "
                         f"FILE.h5:/dataset or a zarr array")
    if len(shape) != 3:
        raise ValueError(f"{spec}: expected a 3D volume, got shape {tuple(shape)}")
    zyx = tuple(int(shape[axes.index(a)]) for a in AXES)
    if min(zyx) < 1:
        raise ValueError(f"{spec}: empty volume, shape {tuple(shape)}")
    return Volume(source=spec, shape=zyx, dtype=np.dtype(dtype), axes=axes, _read=read)  # type: ignore[arg-type]


def _tiff_folder(path: Path) -> tuple[tuple[int, ...], np.dtype, SourceRead]:
    import tifffile

    files = sorted((p for p in path.iterdir() if p.suffix.lower() in TIFF_SUFFIXES), key=lambda p: natural_key(p.name))
    if not files:
        raise FileNotFoundError(f"{path}: a folder with no .tif/.tiff files (and not a zarr array)")
    with tifffile.TiffFile(files[0]) as tif:
        section, dtype = tuple(tif.series[0].shape), tif.series[0].dtype
    if len(section) != 2:
        raise ValueError(f"{files[0]}: a TIFF stack needs 2D images, this one has shape {section}")
    for f in files[1:]:
        with tifffile.TiffFile(f) as tif:
            if tuple(tif.series[0].shape) != section or tif.series[0].dtype != dtype:
                raise ValueError(f"{f}: shape {tuple(tif.series[0].shape)} {tif.series[0].dtype} differs from "
                                 f"{files[0].name}'s {section} {dtype}; every section must match")

    def read(box: tuple[slice, slice, slice]) -> np.ndarray:
        images = [tifffile.imread(f)[box[1], box[2]] for f in files[box[0]]]
        return np.stack(images) if images else np.zeros((0, *section), dtype)[:, box[1], box[2]]

    log.info("%s: %d TIFF sections of %s %s", path, len(files), section, dtype)
    return (len(files), *section), dtype, read


def _tiff_file(path: Path) -> tuple[tuple[int, ...], np.dtype, SourceRead]:
    import tifffile

    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        shape, dtype = tuple(series.shape), series.dtype
        paged = len(shape) == 3 and len(tif.pages) == shape[0] and tuple(tif.pages[0].shape) == shape[1:]
        if not paged:
            data = series.asarray()  # one 3D page (or an unusual layout): read it whole
    if not paged:
        log.info("%s: read whole (%s %s)", path, shape, dtype)
        return shape, dtype, lambda box: data[box]

    def read(box: tuple[slice, slice, slice]) -> np.ndarray:
        with tifffile.TiffFile(path) as tif:
            pages = [tif.pages[i].asarray()[box[1], box[2]] for i in range(*box[0].indices(shape[0]))]
        return np.stack(pages) if pages else np.zeros((0, *shape[1:]), dtype)[:, box[1], box[2]]

    return shape, dtype, read


def _hdf5(path: Path, inner: str) -> tuple[tuple[int, ...], np.dtype, SourceRead]:
    try:
        import h5py
    except ImportError:
        raise ValueError(f"{path}: reading HDF5 needs h5py; install it with `pip install cellseg[hdf5]`") from None
    with h5py.File(path, "r") as f:
        if not inner:
            names: list[str] = []
            f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
            if len(names) != 1:
                raise ValueError(f"{path}: name the dataset as {path}:/path/in/file; datasets here: {names}")
            inner = names[0]
        if inner not in f or not isinstance(f[inner], h5py.Dataset):
            raise FileNotFoundError(f"{path}: no dataset {inner!r} in the file")
        shape, dtype = tuple(f[inner].shape), f[inner].dtype

    def read(box: tuple[slice, slice, slice]) -> np.ndarray:
        with h5py.File(path, "r") as f:
            return f[inner][box]

    return shape, dtype, read


def _zarr(path: Path, inner: str) -> tuple[tuple[int, ...], np.dtype, SourceRead]:
    import zarr

    if not (path / ".zarray").exists() and not (path / ".zgroup").exists():
        raise FileNotFoundError(f"{path}: no zarr v2 array or group here (no .zarray or .zgroup)")
    node = zarr.open(str(path), mode="r")
    if inner:
        if inner.strip("/") not in node:
            raise FileNotFoundError(f"{path}: no array {inner!r} in the zarr group")
        node = node[inner.strip("/")]
    if not isinstance(node, zarr.Array):
        arrays = sorted(name for name, _ in node.arrays())
        raise ValueError(f"{path} is a zarr group: name the array as {path}:<path>; arrays here: {arrays}")
    return tuple(node.shape), node.dtype, lambda box: node[box]
