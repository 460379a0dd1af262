"""Per-crop cache of the instance-boundary channels, computed once instead of once per sample.

A boundary channel ("voxels of an object with a 6-neighbour in another object", `targets.touching`) needs
the crop's instance-id arrays of every instance class: computed per sample that is ~10 uint64 reads and
neighbour comparisons, 5× the cost of everything else a worker does (docs/benchmarks.md). It depends only
on the crop and the training voxel size, so it is computed once over the whole annotated box and stored
as a zarr array next to nothing of the user's: `<cache_dir>/<crop>-<key>.zarr`, uint8
`(2, ceil(A / 8), z, y, x)` = packed (target, known) bits of the A boundary channels, in the layout of
`CropSource.read_ids_and_boundaries`, on the EM lattice at the training voxel size (the lattice every
training sample is snapped to). A sample then reads one small uint8 box.

Computing over the whole crop is also more correct at patch borders: a voxel at the edge of a patch is
a boundary if its neighbour just outside the patch belongs to another object.

The key hashes everything the bits depend on (label array locations and metadata, classes, voxel size,
grid), so a changed crop or setting gets a new file; the file is written to a temporary name and renamed,
and concurrent workers that race to build it both end with the same complete file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cellseg.cache import cache_root
from cellseg.data.arrays import open_array
from cellseg.data.write import write_array

if TYPE_CHECKING:
    from cellseg.data.grid import Grid
    from cellseg.data.targets import CropSource

log = logging.getLogger(__name__)
FORMAT_VERSION = 1  # bump when the bits' meaning changes: old cache files are then ignored
CHUNK_VOX = 64  # spatial chunk edge of the cache arrays


def default_cache_dir() -> Path:
    """`$CELLSEG_CACHE/boundaries`, else `~/.cache/cellseg/boundaries`."""
    return cache_root() / "boundaries"


def resolve_cache_dir(setting: str | None) -> Path | None:
    """`data.boundary_cache`: null (no cache), "auto" (`default_cache_dir`) or a folder."""
    if setting is None:
        return None
    return default_cache_dir() if setting == "auto" else Path(setting)


def crop_lattice_grid(crop: CropSource, voxel_size_nm: tuple[float, float, float]) -> Grid:
    """The crop's annotated box on the EM lattice at `voxel_size_nm` (the lattice samples are snapped to)."""
    from cellseg.data.grid import Grid

    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    start, stop = np.asarray(crop.start_nm), np.asarray(crop.stop_nm)
    level = crop.em().choose_level(vs)
    t = np.asarray(level.translation_nm, dtype=np.float64)
    first = np.floor((start + vs / 2 - t) / vs + 1e-6)  # first lattice voxel whose centre is inside the box
    last = np.ceil((stop - vs / 2 - t) / vs - 1e-6)
    shape = np.maximum(1, last - first + 1).astype(int)
    return Grid(translation_nm=tuple((t + first * vs).tolist()), shape_vox=tuple(int(n) for n in shape),
                voxel_size_nm=tuple(vs.tolist()))


def _key(crop: CropSource, grid: Grid) -> str:
    names = [crop.plans[i].read[0] for i in crop.aux_classes if len(crop.plans[i].read) == 1]
    meta = {"version": FORMAT_VERSION, "crop": crop.entry.crop_url, "aux": [crop.classes[i] for i in crop.aux_classes],
            "arrays": {n: repr(crop.image(n).levels[0]) for n in names},
            "grid": [grid.translation_nm, grid.shape_vox, grid.voxel_size_nm]}
    return hashlib.sha1(json.dumps(meta, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def warm_boundary_caches(crops: Sequence[CropSource], voxel_size_nm: Sequence[float]) -> None:
    """Build the missing cache files of `crops` now (with a progress bar) rather than in the first batches."""
    from tqdm import tqdm

    todo = [c for c in crops if c.aux_classes and c.boundary_cache_dir]
    for crop in tqdm(todo, desc="boundary cache", unit="crop", disable=not todo, leave=False):
        crop._cached_boundaries_for(tuple(float(v) for v in voxel_size_nm))


class BoundaryCache:
    """The cached boundary bits of one crop at one voxel size (built on first use)."""

    def __init__(self, crop: CropSource, voxel_size_nm: tuple[float, float, float], cache_dir: Path):
        self.crop, self.grid = crop, crop_lattice_grid(crop, voxel_size_nm)
        self.path = Path(cache_dir) / f"{crop.name}-{_key(crop, self.grid)}.zarr"
        if not (self.path / ".zarray").is_file():
            self._build()
        self._reader = open_array(str(self.path), backend=crop.backend, cache_bytes=crop.cache_bytes)

    def _build(self) -> None:
        from cellseg.data.targets import _Reads

        crop, grid = self.crop, self.grid
        log.info("%s: computing its %d boundary channels once (%s voxels at %s nm) into %s", crop.name,
                 len(crop.aux_classes), "x".join(map(str, grid.shape_vox)), grid.voxel_size_nm, self.path)
        nbytes = -(-len(crop.aux_classes) // 8)
        bits = np.zeros((2, nbytes, *grid.shape_vox), np.uint8)
        crop._boundaries(_Reads(crop, grid), bits[0], bits[1], first_channel=0)
        try:
            write_array(self.path, bits, chunks=(2, nbytes, CHUNK_VOX, CHUNK_VOX, CHUNK_VOX),
                        attrs={"translation_nm": list(grid.translation_nm), "voxel_size_nm": list(grid.voxel_size_nm),
                               "channels": [crop.classes[i] for i in crop.aux_classes], "format": FORMAT_VERSION})
        except FileExistsError:  # another worker finished the same file first: it is identical
            pass

    def read(self, grid: Grid) -> tuple[np.ndarray, np.ndarray] | None:
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
