"""Writing zarr v2 arrays and OME-NGFF multiscale groups, atomically.

Every writer builds its output under a hidden temporary sibling (`.<name>.tmp-<random>`) and renames it
into place only when complete, so a crash never leaves a half-written array that looks valid. An
existing target is never replaced unless `overwrite=True`. Missing parent groups (`.zgroup`) are
created from the enclosing `*.zarr` directory down, so the hierarchy stays readable by zarr and the
challenge's tools.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.data.ngff import build_multiscales, pyramid_levels

LabelKind = Literal["em", "labels"]
DEFAULT_CHUNK = 64  # voxels per axis; 64³ uint8 = 256 KiB, a good unit for patch reads and HTTP fetches
MIN_LEVEL_SIZE = 16  # stop the pyramid before any axis drops below this many voxels


def _compressor() -> Any:
    from numcodecs import Blosc

    return Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE)


def ensure_groups(path: str | os.PathLike[str]) -> None:
    """Make `path` and its ancestors up to the enclosing `*.zarr` directory zarr groups (`.zgroup`).

    Without a `*.zarr` ancestor only `path` itself becomes a group.
    """
    path = Path(path)
    chain = [path]
    for parent in path.parents:
        if chain[-1].name.endswith(".zarr"):
            break
        chain.append(parent)
    else:
        chain = [path]
    for directory in chain:
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / ".zgroup"
        if not marker.exists() and not (directory / ".zarray").exists():
            marker.write_text(json.dumps({"zarr_format": 2}))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` when the block exits without error.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (--overwrite) to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _chunks_for(shape: Sequence[int], chunks: Sequence[int] | None) -> tuple[int, ...]:
    if chunks is None:
        chunks = [DEFAULT_CHUNK] * len(shape)
    return tuple(max(1, min(int(c), int(s))) for c, s in zip(chunks, shape, strict=True))


def _write_zarr_array(path: Path, data: np.ndarray, *, chunks: Sequence[int] | None,
                      attrs: Mapping[str, Any] | None) -> None:
    import zarr

    array = zarr.open_array(
        str(path), mode="w-", shape=data.shape, dtype=data.dtype, chunks=_chunks_for(data.shape, chunks),
        compressor=_compressor(), fill_value=0, dimension_separator="/",
    )
    array[...] = data
    if attrs:
        array.attrs.update(dict(attrs))


def create_multiscale_level(path: str | os.PathLike[str], shape: Sequence[int], dtype: np.dtype | str, *,
                            voxel_size_nm: Sequence[float], translation_nm: Sequence[float],
                            chunks: Sequence[int] | None = None) -> Any:
    """Create an empty one-level OME-NGFF multiscale group (`s0` filled with 0) to be written region by
    region; returns the writable zarr array of `s0`. The caller owns atomicity (build it inside a temporary
    directory and rename the whole thing)."""
    import zarr

    path = Path(path)
    path.mkdir(parents=True)
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    level = pyramid_levels(voxel_size_nm, translation_nm, 1)
    (path / ".zattrs").write_text(json.dumps(build_multiscales(level, name=path.name), indent=2))
    shape = tuple(int(n) for n in shape)
    return zarr.open_array(str(path / level[0].path), mode="w-", shape=shape, dtype=np.dtype(dtype),
                           chunks=_chunks_for(shape, chunks), compressor=_compressor(), fill_value=0,
                           dimension_separator="/")


def write_array(path: str | os.PathLike[str], data: np.ndarray, *, attrs: Mapping[str, Any] | None = None,
                chunks: Sequence[int] | None = None, overwrite: bool = False) -> Path:
    """Write one single-scale zarr v2 array (e.g. a submission's `crop<N>/<label>` with voxel_size attrs)."""
    path = Path(path)
    with atomic_dir(path, overwrite=overwrite) as tmp:
        _write_zarr_array(tmp, np.asarray(data), chunks=chunks, attrs=attrs)
    ensure_groups(path.parent)
    return path


def downsample_2x(data: np.ndarray, kind: LabelKind, factors: Sequence[int] = (2, 2, 2)) -> np.ndarray:
    """Down-sample a (z, y, x) volume by integer factors.

    `em`: block mean, rounded back to the input dtype (explicitly). `labels`: block mode, ties going to
    the larger id so that thin structures (membranes, pores) survive one level down.
    Odd sizes are padded by repeating the edge, so an n-voxel axis becomes ceil(n / factor).
    """
    pad = [(0, (-n) % f) for n, f in zip(data.shape, factors, strict=True)]
    if any(p for _, p in pad):
        data = np.pad(data, pad, mode="edge")
    fz, fy, fx = factors
    z, y, x = (n // f for n, f in zip(data.shape, factors, strict=True))
    blocks = data.reshape(z, fz, y, fy, x, fx).transpose(0, 2, 4, 1, 3, 5).reshape(z, y, x, fz * fy * fx)
    if kind == "em":
        mean = blocks.mean(axis=-1, dtype=np.float64)
        if np.issubdtype(data.dtype, np.integer):
            return np.rint(mean).astype(data.dtype)
        return mean.astype(data.dtype)
    if kind != "labels":
        raise ValueError(f"kind must be 'em' or 'labels', got {kind!r}")
    out = np.empty((z, y, x), dtype=data.dtype)
    for zi in range(z):  # slab by slab: the pairwise comparison is (y, x, n, n) booleans
        s = -np.sort(-blocks[zi].astype(np.int64), axis=-1) if np.issubdtype(data.dtype, np.signedinteger) \
            else np.sort(blocks[zi], axis=-1)[..., ::-1]
        counts = (s[..., :, None] == s[..., None, :]).sum(axis=-1)
        out[zi] = np.take_along_axis(s, counts.argmax(axis=-1)[..., None], axis=-1)[..., 0]
    return out


def default_num_levels(shape: Sequence[int], min_size: int = MIN_LEVEL_SIZE, max_levels: int = 8) -> int:
    """Levels of a 2× pyramid until an axis would drop below `min_size` voxels (at least 1)."""
    n, size = 1, min(shape)
    while n < max_levels and size // 2 >= min_size:
        size //= 2
        n += 1
    return n


def write_multiscale(
    path: str | os.PathLike[str],
    data: np.ndarray,
    *,
    voxel_size_nm: Sequence[float],
    translation_nm: Sequence[float],
    kind: LabelKind,
    num_levels: int | None = None,
    chunks: Sequence[int] | None = None,
    name: str | None = None,
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a (z, y, x) volume as an OME-NGFF 0.4 multiscale group `s0, s1, ...` (2× pyramid).

    Args:
        path: the group directory to create (e.g. `.../labels/groundtruth/crop1/mito`).
        data: level `s0`.
        voxel_size_nm, translation_nm: grid of `s0` (translation = centre of voxel 0).
        kind: "em" (mean down-sampling) or "labels" (mode down-sampling).
        num_levels: pyramid depth; default until an axis would fall below 16 voxels.
        chunks: chunk shape (default 64³, clipped to the array).
        name: `multiscales[0].name`; default the directory name.
        attrs: extra group attributes.
        overwrite: replace an existing group.
    """
    path = Path(path)
    data = np.asarray(data)
    if data.ndim != 3:
        raise ValueError(f"{path}: expected a 3D (z, y, x) volume, got shape {data.shape}")
    num_levels = num_levels or default_num_levels(data.shape)
    levels = pyramid_levels(voxel_size_nm, translation_nm, num_levels)
    with atomic_dir(path, overwrite=overwrite) as tmp:
        tmp.mkdir()
        (tmp / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        (tmp / ".zattrs").write_text(json.dumps({**build_multiscales(levels, name=name or path.name),
                                                 **dict(attrs or {})}, indent=2))
        level_data = data
        for i, level in enumerate(levels):
            if i:
                level_data = downsample_2x(level_data, kind)
            _write_zarr_array(tmp / level.path, level_data, chunks=chunks, attrs=None)
    ensure_groups(path.parent)
    return path
