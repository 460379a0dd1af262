"""Reading OME-NGFF multiscale zarr (v2) volumes in world coordinates, with two interchangeable backends.

`ArrayReader` is the small interface both backends implement (shape, dtype, chunks, `read(slices)`):
`TensorStoreReader` (default; asynchronous, bounded chunk cache, fastest on many small reads) and
`ZarrReader` (zarr-python 2; simple and widely installed). Both return identical numpy arrays.

`MultiscaleImage` opens a multiscale group (EM or one label class) at a local path, `file://`,
anonymous `s3://` or `http(s)://` location, lists its levels (voxel size and translation in nm,
z, y, x) and reads any box of world space at any voxel size.

Level choice (`choose_level`), the rule shared with the challenge's tools:
1. a level whose voxel size equals the request (within 1 % per axis, the tolerance below which
   cellmap-data does not resample) is used directly — the common case, where every tool agrees;
2. otherwise `policy="closest"` (default) takes the level minimising the summed relative voxel-size
   difference over axes, ties going to the finer level: exactly cellmap-data's `CellMapImage` rule;
   `policy="finer"` takes the coarsest level that is not coarser than the request on any axis (the
   official evaluator's rule for non-OME groups), falling back to the finest level;
3. a read of a local array skips a level whose chunks covering the box were never downloaded (a partial
   `cellseg fetch` mirrors every level's metadata but only some levels' chunks, and a missing chunk file
   reads as 0: an all-black volume), taking the next level in order of preference with a warning, or fails
   naming the level and the fetch option that brings it (`cellseg.data.chunks`).
Resampling happens only when the chosen level's grid differs from the requested one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from cellseg.data import chunks, resample
from cellseg.data.ngff import LevelMeta, parse_multiscales
from cellseg.data.stores import HTTPStore, Location, resolve

log = logging.getLogger(__name__)

Backend = Literal["tensorstore", "zarr"]
BACKENDS: tuple[str, ...] = ("tensorstore", "zarr")
LevelPolicy = Literal["closest", "finer"]
VOXEL_SIZE_RTOL = 0.01  # relative voxel-size difference treated as "the same resolution"
GRID_ATOL_VOX = 1e-3  # offsets within this fraction of a voxel count as on-grid (float noise in manifests)
DEFAULT_CACHE_BYTES = 256 * 2**20  # tensorstore chunk cache shared by every array of a process
# A level holds data for a box when at least this share of its chunks there is on disk (or known absent at the
# source): a box at the edge of a fetched region keeps its level, a level fetched elsewhere only does not.
MIN_CHUNK_COVERAGE = 0.5


class ArrayReader(Protocol):
    """What a backend exposes for one zarr array."""

    location: Location
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]

    def read(self, region: tuple[slice, ...]) -> np.ndarray:
        """Read `region` (in-bounds slices with step 1) into a new numpy array."""
        ...


def _zarray(location: Location) -> dict[str, Any]:
    meta = location.read_json(".zarray")
    if meta is None:
        raise FileNotFoundError(f"{location}: no zarr array here (missing .zarray)")
    return meta


_CONTEXTS: dict[tuple[int, int], Any] = {}


def shared_context(cache_bytes: int) -> Any:
    """One tensorstore context (chunk cache pool, thread pools) per process and cache size.

    All arrays a process opens share the pool, so host memory for cached chunks is bounded by
    `cache_bytes` per process however many crops and classes are open — not per array. The key includes
    the process id: a context must never cross a fork.
    """
    import tensorstore as ts

    key = (os.getpid(), int(cache_bytes))
    if key not in _CONTEXTS:
        _CONTEXTS[key] = ts.Context({"cache_pool": {"total_bytes_limit": int(cache_bytes)}})
    return _CONTEXTS[key]


class TensorStoreReader:
    """A zarr v2 array read through tensorstore."""

    def __init__(self, location: Location, *, cache_bytes: int = DEFAULT_CACHE_BYTES):
        import tensorstore as ts

        meta = _zarray(location)
        spec = {"driver": "zarr", "kvstore": location.tensorstore_kvstore()}
        try:
            self._array = ts.open(spec, read=True, context=shared_context(cache_bytes)).result()
        except ValueError as err:
            raise ValueError(f"{location}: tensorstore cannot open this array ({err})") from None
        self.location = location
        self.shape = tuple(int(s) for s in self._array.shape)
        self.dtype = np.dtype(self._array.dtype.numpy_dtype)
        self.chunks = tuple(int(c) for c in meta["chunks"])

    def read(self, region: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(self._array[region].read().result())


class ZarrReader:
    """A zarr v2 array read through zarr-python."""

    def __init__(self, location: Location):
        import zarr

        _zarray(location)  # a clear FileNotFoundError before zarr's own
        store = location.url if location.kind == "file" else zarr.storage.KVStore(HTTPStore(location))
        self._array = zarr.open_array(store=store, mode="r")
        self.location = location
        self.shape = tuple(int(s) for s in self._array.shape)
        self.dtype = np.dtype(self._array.dtype)
        self.chunks = tuple(int(c) for c in self._array.chunks)

    def read(self, region: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(self._array[region])


def open_array(url: str | Location, *, backend: Backend = "tensorstore", cache_bytes: int = DEFAULT_CACHE_BYTES
               ) -> ArrayReader:
    """Open one zarr array for reading with the chosen backend.

    Raises:
        FileNotFoundError: no `.zarray` at `url`.
        ValueError: unknown backend.
    """
    location = resolve(url)
    if backend == "tensorstore":
        return TensorStoreReader(location, cache_bytes=cache_bytes)
    if backend == "zarr":
        return ZarrReader(location)
    raise ValueError(f"unknown array backend {backend!r}; choose one of {BACKENDS}")


@dataclass(frozen=True, kw_only=True)
class Level(LevelMeta):
    """A level of an opened multiscale group: metadata plus the array's shape and dtype."""

    shape_vox: tuple[int, int, int]
    dtype: np.dtype


def _same_size(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(abs(x - y) <= VOXEL_SIZE_RTOL * y for x, y in zip(a, b, strict=True))


def rank_levels(levels: Sequence[LevelMeta], voxel_size_nm: Sequence[float], *,
                policy: LevelPolicy = "closest") -> list[int]:
    """Every level's index, best first for a requested voxel size: `choose_level`'s pick, then the others by
    summed relative voxel-size difference (finer first on ties)."""
    first = choose_level(levels, voxel_size_nm, policy=policy)
    target = [float(v) for v in voxel_size_nm]
    scores = [sum(abs(v - t) / t for v, t in zip(lv.voxel_size_nm, target, strict=True)) for lv in levels]
    return [first, *sorted((i for i in range(len(levels)) if i != first), key=lambda i: (scores[i], i))]


def choose_level(levels: Sequence[LevelMeta], voxel_size_nm: Sequence[float], *,
                 policy: LevelPolicy = "closest") -> int:
    """Index of the level to read for a requested voxel size (rules 1 and 2 in the module docstring)."""
    target = [float(v) for v in voxel_size_nm]
    for i, lv in enumerate(levels):
        if _same_size(lv.voxel_size_nm, target):
            return i
    if policy == "finer":
        ok = [i for i, lv in enumerate(levels)
              if all(v <= t * (1 + VOXEL_SIZE_RTOL) for v, t in zip(lv.voxel_size_nm, target, strict=True))]
        return max(ok, key=lambda i: np.prod(levels[i].voxel_size_nm)) if ok else 0
    if policy != "closest":
        raise ValueError(f"unknown level policy {policy!r}; choose 'closest' or 'finer'")
    scores = [sum(abs(v - t) / t for v, t in zip(lv.voxel_size_nm, target, strict=True)) for lv in levels]
    return int(np.argmin(scores))  # argmin keeps the first (finest) of equal scores


class MultiscaleImage:
    """An OME-NGFF multiscale group opened for reading in world coordinates (z, y, x; nm).

    Args:
        url: local path, `file://`, `s3://` or `http(s)://` location of the group.
        backend: "tensorstore" (default) or "zarr".
        expected_dtype: if given, every level must have this dtype (e.g. uint8 for EM).
        cache_bytes: tensorstore chunk-cache budget of the process (shared by all opened arrays).

    Example:
        >>> em = MultiscaleImage("data/jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8")
        >>> patch = em.read(translation_nm=(4000, 4000, 4000), shape_vox=(64, 64, 64),
        ...                 voxel_size_nm=(8, 8, 8), interpolation="area", pad_value=np.nan)
    """

    def __init__(self, url: str | Location, *, backend: Backend = "tensorstore",
                 expected_dtype: np.dtype | str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.location = resolve(url)
        self.backend = backend
        self._cache_bytes = cache_bytes
        self._readers: dict[str, ArrayReader] = {}
        self._warned: set[tuple[str, str]] = set()  # (skipped level, level read instead), warned once each
        self._zarrays: dict[str, dict[str, Any]] = {}  # level path -> its .zarray, read once
        attrs = self.location.read_json(".zattrs")
        if attrs is None and self.location.read_json(".zgroup") is None:
            raise FileNotFoundError(f"{self.location}: no zarr group here (missing .zgroup and .zattrs)")
        metas = parse_multiscales(attrs, source=str(self.location))
        levels = []
        for meta in metas:
            reader = self._reader(meta.path)
            if len(reader.shape) != 3:
                raise ValueError(f"{reader.location}: array has {len(reader.shape)} dimensions; expected 3 (z, y, x)")
            if expected_dtype is not None and reader.dtype != np.dtype(expected_dtype):
                raise ValueError(f"{reader.location}: dtype is {reader.dtype}, expected {np.dtype(expected_dtype)}")
            levels.append(Level(path=meta.path, voxel_size_nm=meta.voxel_size_nm, translation_nm=meta.translation_nm,
                                shape_vox=reader.shape, dtype=reader.dtype))  # type: ignore[arg-type]
        self.levels: tuple[Level, ...] = tuple(levels)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{lv.path}@{'x'.join(f'{v:g}' for v in lv.voxel_size_nm)}nm" for lv in self.levels)
        return f"MultiscaleImage({self.location}, {sizes})"

    def _reader(self, path: str) -> ArrayReader:
        # One handle per level, opened on first use and kept: never re-open per read.
        if path not in self._readers:
            self._readers[path] = open_array(self.location.join(path), backend=self.backend,
                                             cache_bytes=self._cache_bytes)
        return self._readers[path]

    def __getstate__(self) -> dict[str, Any]:
        # Array handles do not travel to DataLoader workers; each process re-opens its own.
        return {**self.__dict__, "_readers": {}}

    def level(self, path: str) -> Level:
        """The level named `path` (e.g. "s1")."""
        for lv in self.levels:
            if lv.path == path:
                return lv
        raise ValueError(f"{self.location}: no level {path!r}; levels are {[lv.path for lv in self.levels]}")

    def choose_level(self, voxel_size_nm: Sequence[float], *, policy: LevelPolicy = "closest") -> Level:
        """The level `read` uses for this voxel size (see the module docstring)."""
        return self.levels[choose_level(self.levels, voxel_size_nm, policy=policy)]

    def read_level(self, path: str, region: tuple[slice, ...] | None = None) -> np.ndarray:
        """Raw voxels of one level (optionally a sub-region in that level's voxel indices)."""
        lv = self.level(path)
        return self._reader(path).read(region or tuple(slice(0, n) for n in lv.shape_vox))

    def read(
        self,
        *,
        translation_nm: Sequence[float],
        shape_vox: Sequence[int],
        voxel_size_nm: Sequence[float],
        interpolation: resample.Interpolation = "nearest",
        pad_value: float | None = 0,
        level: str | None = None,
        policy: LevelPolicy = "closest",
        dtype: np.dtype | str | None = None,
        return_mask: bool = False,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Read the grid `translation_nm + i * voxel_size_nm`, `i < shape_vox`, into a numpy array.

        Args:
            translation_nm: world position of the centre of output voxel (0, 0, 0).
            shape_vox: output shape (z, y, x).
            voxel_size_nm: output voxel size; picks the level unless `level` is given.
            interpolation: "nearest" (labels), "linear" or "area" (EM); used only if the grids differ.
            pad_value: value for voxels outside the array; None forbids reading outside.
            level: read this level (e.g. "s0") instead of choosing one.
            policy: level-choice policy when no level matches exactly.
            dtype: output dtype. Default: the array's dtype when no interpolation is needed (nearest or
                on-grid) and float32 otherwise. Conversion is explicit (rounded for integer outputs).
            return_mask: also return the boolean mask of voxels inside the array.

        Raises:
            ValueError: box outside the volume with `pad_value=None`, or a pad value that the output
                dtype cannot hold (e.g. NaN in uint8: pass `dtype="float32"`).
        """
        lv = self.level(level) if level else self._read_level(translation_nm, shape_vox, voxel_size_nm, policy)
        taps, direct = self._plan(lv, translation_nm, shape_vox, voxel_size_nm, interpolation)
        inside = resample.inside_mask(taps)
        if pad_value is None and not inside.all():
            raise ValueError(f"{self.location}/{lv.path}: box at {tuple(translation_nm)} nm, shape "
                             f"{tuple(shape_vox)} reaches outside the volume and padding is not allowed")
        out_dtype = np.dtype(dtype) if dtype is not None else (lv.dtype if direct else np.dtype(np.float32))
        self._check_pad(out_dtype, pad_value, inside, lv)
        if inside.all():  # the common case in training: no padding, no extra copy
            out = _cast(self._gather(lv, taps, inside)[0], out_dtype)
            return (out, inside) if return_mask else out
        out = np.full(tuple(shape_vox), pad_value if pad_value is not None else 0, dtype=out_dtype)
        if inside.any():
            values, where = self._gather(lv, taps, inside)
            out[where] = _cast(values, out_dtype)
        return (out, inside) if return_mask else out

    def chunk_coverage(self, lv: Level, translation_nm: Sequence[float], shape_vox: Sequence[int],
                       voxel_size_nm: Sequence[float]) -> float:
        """Share of the chunks of level `lv` under the box that hold data (1.0 for remote arrays; see
        `cellseg.data.chunks`)."""
        if self.location.kind != "file":
            return 1.0
        ranges = []
        for t, n, v, lt, lvs in zip(translation_nm, shape_vox, voxel_size_nm, lv.translation_nm, lv.voxel_size_nm,
                                    strict=True):
            lo = (t - v / 2 - lt) / lvs + 0.5  # the box's edges in the level's voxel indices
            hi = (t + (n - 0.5) * v - lt) / lvs + 0.5
            ranges.append((int(np.floor(lo)), int(np.ceil(hi))))
        path = self.location.join(lv.path)
        if lv.path not in self._zarrays:
            self._zarrays[lv.path] = _zarray(path)
        return chunks.coverage(path.url, self._zarrays[lv.path], ranges)

    def level_with_data(self, translation_nm: Sequence[float], shape_vox: Sequence[int],
                        voxel_size_nm: Sequence[float], *, policy: LevelPolicy = "closest") -> Level | None:
        """The best level (rules 1-2) whose chunks under the box were downloaded (rule 3); None if no level's were."""
        order = rank_levels(self.levels, voxel_size_nm, policy=policy)
        for i in order:
            lv = self.levels[i]
            if self.chunk_coverage(lv, translation_nm, shape_vox, voxel_size_nm) >= MIN_CHUNK_COVERAGE:
                best = self.levels[order[0]]
                if lv is not best and (best.path, lv.path) not in self._warned:
                    self._warned.add((best.path, lv.path))
                    log.warning("%s/%s: its chunks under the requested box were never downloaded (metadata only); "
                                "reading level %s (%s nm) instead", self.location, best.path, lv.path,
                                _nm(lv.voxel_size_nm))
                return lv
        return None

    def require_data(self, translation_nm: Sequence[float], shape_vox: Sequence[int],
                     voxel_size_nm: Sequence[float], *, what: str = "the box") -> Level:
        """The level a read of this box uses (`level_with_data`).

        Raises:
            ValueError: no level's chunks under the box were downloaded, naming `what` (e.g. the crop), the
                level and the `cellseg fetch` option that brings it.
        """
        lv = self.level_with_data(translation_nm, shape_vox, voxel_size_nm)
        if lv is not None:
            return lv
        best = self.choose_level(voxel_size_nm)
        raise ValueError(f"{what}: {self.location}: no level holds data there: level {best.path} "
                         f"({_nm(best.voxel_size_nm)} nm) has metadata but its chunks were never downloaded (nor any "
                         "other level's); fetch them with `cellseg fetch --crops <id> --em-levels all` (or more "
                         "`--padding-vox` for context)")

    def _read_level(self, translation_nm: Sequence[float], shape_vox: Sequence[int], voxel_size_nm: Sequence[float],
                    policy: LevelPolicy) -> Level:
        """The level `read` uses: one with data (rule 3), else the best one (it reads as the fill value, warned)."""
        lv = self.level_with_data(translation_nm, shape_vox, voxel_size_nm, policy=policy)
        if lv is not None:
            return lv
        best = self.choose_level(voxel_size_nm, policy=policy)
        if (best.path, "") not in self._warned:
            self._warned.add((best.path, ""))
            log.warning("%s: no level's chunks under the box at %s nm were downloaded: it reads as the fill value "
                        "(fetch them with `cellseg fetch --em-levels all` or more `--padding-vox`)", self.location,
                        tuple(round(float(t), 1) for t in translation_nm))
        return best

    def _plan(self, lv: Level, translation_nm: Sequence[float], shape_vox: Sequence[int],
              voxel_size_nm: Sequence[float], interpolation: resample.Interpolation
              ) -> tuple[list[resample.AxisTaps], bool]:
        if len(translation_nm) != 3 or len(shape_vox) != 3 or len(voxel_size_nm) != 3:
            raise ValueError("translation_nm, shape_vox and voxel_size_nm need 3 values each (z, y, x)")
        u0 = [(t - lt) / lvs for t, lt, lvs in zip(translation_nm, lv.translation_nm, lv.voxel_size_nm, strict=True)]
        steps = [v / lvs for v, lvs in zip(voxel_size_nm, lv.voxel_size_nm, strict=True)]
        on_grid = all(abs(s - 1) <= VOXEL_SIZE_RTOL / 10 and abs(u - round(u)) <= GRID_ATOL_VOX
                      for s, u in zip(steps, u0, strict=True))
        if on_grid:  # a plain slice: round away float noise, one tap per voxel
            u0, steps, interpolation = [float(round(u)) for u in u0], [1.0] * 3, "nearest"
        taps = [resample.axis_taps(u, s, int(n), int(ns), interpolation)
                for u, s, n, ns in zip(u0, steps, shape_vox, lv.shape_vox, strict=True)]
        return taps, interpolation == "nearest"

    def _gather(self, lv: Level, taps: list[resample.AxisTaps], inside: np.ndarray
                ) -> tuple[np.ndarray, tuple[slice, ...]]:
        # Output voxels inside the array form a box; read only the source range its taps touch.
        where = tuple(slice(int(np.argmax(t.inside)), int(len(t.inside) - np.argmax(t.inside[::-1]))) for t in taps)
        sub = [resample.AxisTaps(t.index[w], t.weight[w], t.inside[w]) for t, w in zip(taps, where, strict=True)]
        region = tuple(slice(int(t.index.min()), int(t.index.max()) + 1) for t in sub)
        volume = self._reader(lv.path).read(region)
        return resample.apply_taps(volume, sub, offsets=tuple(r.start for r in region)), where

    def _check_pad(self, out_dtype: np.dtype, pad_value: float | None, inside: np.ndarray, lv: Level) -> None:
        if pad_value is None or inside.all():
            return
        if np.issubdtype(out_dtype, np.integer) and (
            not float(pad_value).is_integer() or not np.iinfo(out_dtype).min <= pad_value <= np.iinfo(out_dtype).max
        ):
            raise ValueError(f"{self.location}/{lv.path}: pad value {pad_value} does not fit output dtype {out_dtype}; "
                             "pass dtype='float32' (or a representable pad value)")


def _nm(voxel_size_nm: Sequence[float]) -> str:
    return "x".join(f"{v:g}" for v in voxel_size_nm)


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Explicit conversion: round floats going to integers, clip to the integer range."""
    if values.dtype == dtype:
        return values
    if np.issubdtype(dtype, np.integer) and np.issubdtype(values.dtype, np.floating):
        info = np.iinfo(dtype)
        return np.clip(np.rint(values), info.min, info.max).astype(dtype)
    return values.astype(dtype)
