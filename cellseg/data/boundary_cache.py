"""Per-crop cache of the instance-boundary channels, computed once instead of once per sample.

A boundary channel ("voxels of an object with a 6-neighbour in another object", `target_bits.touching`) needs
the crop's instance-id arrays of every instance class: computed per sample that is ~10 uint64 reads and
neighbour comparisons, 5× the cost of everything else a worker does (docs/benchmarks.md). It depends only
on the crop and the training voxel size, so it is computed once over the whole annotated box and stored
as a zarr array next to nothing of the user's: `<cache_dir>/<crop>-<key>.zarr`, uint8
`(2, ceil(A / 8), z, y, x)` = packed (target, known) bits of the A boundary channels, in the layout of
`CropSource.read_ids_and_boundaries`, on the EM lattice at the training voxel size (`lattice_grid`: the
lattice every training sample is snapped to). A sample then reads one small uint8 box.

Computing over the whole crop is also more correct at patch borders: a voxel at the edge of a patch is
a boundary if its neighbour just outside the patch belongs to another object.

The cache knows nothing of crops: whoever opens one passes the file (`cache_path`, whose key hashes
everything the bits depend on: label array locations and metadata, classes, voxel size, grid; so a
changed crop or setting gets a new file) and the function that computes the bits on a grid. The file is
written to a temporary name and renamed, and concurrent workers that race to build it both end with the
same complete file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from cellseg.cache import cache_root
from cellseg.data.arrays import DEFAULT_CACHE_BYTES, Backend, open_array
from cellseg.data.grid import Grid
from cellseg.data.write import write_array

log = logging.getLogger(__name__)
FORMAT_VERSION = 1  # bump when the bits' meaning changes: old cache files are then ignored
CHUNK_VOX = 64  # spatial chunk edge of the cache arrays

PackedBits = tuple[np.ndarray, np.ndarray]  # (target, known), each (ceil(A / 8), z, y, x) uint8


def default_cache_dir() -> Path:
    """`$CELLSEG_CACHE/boundaries`, else `~/.cache/cellseg/boundaries`."""
    return cache_root() / "boundaries"


def resolve_cache_dir(setting: str | None) -> Path | None:
    """`data.boundary_cache`: null (no cache), "auto" (`default_cache_dir`) or a folder."""
    if setting is None:
        return None
    return default_cache_dir() if setting == "auto" else Path(setting)


def lattice_grid(start_nm: Sequence[float], stop_nm: Sequence[float], *, lattice_translation_nm: Sequence[float],
                 voxel_size_nm: Sequence[float]) -> Grid:
    """The voxels of the lattice (`lattice_translation_nm` + i · `voxel_size_nm`) whose centres lie inside the
    box `[start_nm, stop_nm)` (z, y, x; at least one voxel per axis)."""
    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    start, stop = np.asarray(start_nm, dtype=np.float64), np.asarray(stop_nm, dtype=np.float64)
    t = np.asarray(lattice_translation_nm, dtype=np.float64)
    first = np.floor((start + vs / 2 - t) / vs + 1e-6)  # first lattice voxel whose centre is inside the box
    last = np.ceil((stop - vs / 2 - t) / vs - 1e-6)
    shape = np.maximum(1, last - first + 1).astype(int)
    return Grid.of(translation_nm=t + first * vs, shape_vox=shape, voxel_size_nm=vs)


def cache_path(cache_dir: Path, crop_name: str, grid: Grid, *, inputs: Mapping[str, object]) -> Path:
    """`<cache_dir>/<crop_name>-<key>.zarr`, the key hashing `FORMAT_VERSION`, the grid and `inputs` (what the
    bits are computed from; JSON-able values, others by `repr`)."""
    meta = {"version": FORMAT_VERSION, **inputs, "grid": [grid.translation_nm, grid.shape_vox, grid.voxel_size_nm]}
    key = hashlib.sha1(json.dumps(meta, sort_keys=True, default=repr).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{crop_name}-{key}.zarr"


class BoundaryCache:
    """The cached boundary bits of one crop on one lattice grid, built with `compute` if the file is missing.

    Args:
        path: the cache file (`cache_path`).
        grid: the lattice grid the bits cover (`lattice_grid` of the crop's annotated box).
        compute: `grid -> (target_bits, known_bits)`, each `(ceil(A / 8), z, y, x)` uint8; called only to build.
        channels: the A class names, recorded in the file's attributes.
        backend, cache_bytes: how the file is read (see `cellseg.data.arrays.open_array`).

    Example:
        >>> cache = BoundaryCache(path, grid, compute=crop.boundary_bits, channels=["mito", "ves"])
        >>> target_bits, known_bits = cache.read(sample_grid)
    """

    def __init__(self, path: Path, grid: Grid, *, compute: Callable[[Grid], PackedBits], channels: Sequence[str],
                 backend: Backend = "tensorstore", cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.path, self.grid = Path(path), grid
        if not (self.path / ".zarray").is_file():
            self._build(compute, channels)
        self._reader = open_array(str(self.path), backend=backend, cache_bytes=cache_bytes)

    def _build(self, compute: Callable[[Grid], PackedBits], channels: Sequence[str]) -> None:
        grid = self.grid
        log.info("computing %d boundary channels once (%s voxels at %s nm) into %s", len(channels),
                 "x".join(map(str, grid.shape_vox)), grid.voxel_size_nm, self.path)
        bits = np.stack(compute(grid))
        try:
            write_array(self.path, bits, chunks=(*bits.shape[:2], CHUNK_VOX, CHUNK_VOX, CHUNK_VOX),
                        attrs={"translation_nm": list(grid.translation_nm), "voxel_size_nm": list(grid.voxel_size_nm),
                               "channels": list(channels), "format": FORMAT_VERSION})
        except FileExistsError:  # another worker finished the same file first: it is identical
            pass

    def read(self, grid: Grid) -> PackedBits | None:
        """(target, known) packed bits on `grid`, zero outside the crop; None if `grid` is off this lattice."""
        vs = np.asarray(self.grid.voxel_size_nm)
        if not np.allclose(grid.voxel_size_nm, vs, rtol=1e-6):
            return None
        offset_f = (np.asarray(grid.translation_nm) - np.asarray(self.grid.translation_nm)) / vs
        offset = np.rint(offset_f).astype(int)
        if not np.allclose(offset_f, offset, atol=1e-3):
            return None
        shape = np.asarray(grid.shape_vox)
        lo, hi = np.maximum(offset, 0), np.minimum(offset + shape, self.grid.shape_vox)
        nbytes = self._reader.shape[1]
        out = np.zeros((2, nbytes, *grid.shape_vox), np.uint8)
        if np.all(hi > lo):
            block = self._reader.read((slice(None), slice(None), *(slice(a, b) for a, b in zip(lo, hi, strict=True))))
            dst = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offset, strict=True))
            out[(slice(None), slice(None), *dst)] = block
        return out[0], out[1]
