"""Multiscale levels s1..sN of a whole-volume output, block by block (OME-NGFF v0.4, 2× per level).

Level k+1 is computed from level k only, one block of level k+1 at a time: block `p` of `block_vox` voxels
reads the 2·`block_vox` voxels of level k starting at 2·p·`block_vox` (clipped to the level), so a block of level
k+1 and its source on level k both start on chunk corners when `block_vox` is a multiple of the chunks, and no two
blocks write one chunk. An axis of n voxels becomes ceil(n / 2) (the last, odd voxel stands alone), as in
`cellseg.data.write.downsample_2x`, so the blockwise pyramid equals down-sampling the whole array.

Methods (`METHODS`):
- "mean": the 2×2×2 mean rounded back to the dtype (`downsample_2x(kind="em")`): uint8 probabilities;
- "stride": voxel (2i, 2j, 2k) of level k (ids: no id is ever invented or blended);
- "mode": the most frequent value, ties to the larger (`downsample_2x(kind="labels")`): 0/1 masks, where thin
  structures then survive one level down.

Example:
    >>> level_shapes((100, 64, 33), 3)
    [(100, 64, 33), (50, 32, 17), (25, 16, 9)]
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.data.ngff import build_multiscales, parse_multiscales, pyramid_levels
from cellseg.data.write import default_num_levels, downsample_2x

Method = Literal["mean", "stride", "mode"]
METHODS: tuple[str, ...] = ("mean", "stride", "mode")
Vec3i = tuple[int, int, int]


def level_shapes(shape_vox: Sequence[int], num_levels: int) -> list[Vec3i]:
    """Shapes of s0..s{num_levels-1}: each axis halved, rounded up."""
    shapes = [tuple(int(n) for n in shape_vox)]
    for _ in range(1, num_levels):
        shapes.append(tuple(-(-n // 2) for n in shapes[-1]))
    return shapes  # type: ignore[return-value]


def num_levels_for(shape_vox: Sequence[int]) -> int:
    """Pyramid depth of a volume: `cellseg.data.write.default_num_levels` (until an axis would drop below 16)."""
    return default_num_levels(shape_vox)


def method_for(dtype: np.dtype | str, *, label: bool) -> Method:
    """Default method: "mean" for probabilities (`label=False`), "stride" for uint32/uint64 ids, "mode" for uint8
    masks."""
    if not label:
        return "mean"
    return "mode" if np.dtype(dtype) == np.uint8 else "stride"


def downsample(data: np.ndarray, method: Method) -> np.ndarray:
    """One 2× step of a (z, y, x) array by `method` (module docstring).

    Raises:
        ValueError: an unknown method.
    """
    if method == "stride":
        return data[::2, ::2, ::2].copy()
    if method == "mean":
        return downsample_2x(data, "em")
    if method == "mode":
        return downsample_2x(data, "labels")
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def level_positions(shape_vox: Sequence[int], block_vox: Sequence[int]) -> Iterator[Vec3i]:
    """Block positions (raster order) of a level of `shape_vox` voxels cut in blocks of `block_vox`."""
    yield from np.ndindex(*(-(-int(n) // int(b)) for n, b in zip(shape_vox, block_vox, strict=True)))  # type: ignore[misc]


def downsample_block(src: Any, dst: Any, position: Sequence[int], *, block_vox: Sequence[int],
                     method: Method) -> None:
    """Write block `position` of level k+1 (`dst`, zarr or numpy) from level k (`src`): reads only `src`.

    Raises:
        ValueError: `dst` is not the halved shape of `src`, or the block lies outside `dst`.
    """
    if tuple(dst.shape) != level_shapes(src.shape, 2)[1]:
        raise ValueError(f"level shapes {list(src.shape)} → {list(dst.shape)}: the coarser must be the finer halved "
                         "(rounded up)")
    out = tuple(slice(int(p) * int(b), min(int(n), (int(p) + 1) * int(b)))
                for p, b, n in zip(position, block_vox, dst.shape, strict=True))
    if any(s.start >= s.stop for s in out):
        raise ValueError(f"block {list(position)} of {list(block_vox)} vox lies outside the level {list(dst.shape)}")
    source = tuple(slice(2 * s.start, min(int(n), 2 * s.stop)) for s, n in zip(out, src.shape, strict=True))
    dst[out] = downsample(np.asarray(src[source]), method)


def multiscale_attrs(voxel_size_nm: Sequence[float], translation_nm: Sequence[float], num_levels: int, *,
                     name: str, label: bool) -> dict[str, Any]:
    """The group's `.zattrs`: OME-NGFF v0.4 `multiscales` (s0 at `voxel_size_nm`, translation = the centre of voxel
    0 in nm), plus `image-label` for a label group."""
    attrs = build_multiscales(pyramid_levels(voxel_size_nm, translation_nm, num_levels), name=name)
    if label:
        attrs["image-label"] = {"version": "0.4", "source": {"image": "../../probabilities/" + name}}
    return attrs


def create_levels(group: str | os.PathLike[str], num_levels: int | None = None, *,
                  extra_attrs: Mapping[str, Any] | None = None) -> list[Vec3i]:
    """Add empty arrays s1..s{n-1} (dtype, chunks and compressor of `s0`) to a multiscale group whose `s0` exists,
    and rewrite its `multiscales` attribute to list them (other attributes kept). Levels that exist with the
    right shape and dtype are kept (a resumed run). Returns the level shapes.

    Raises:
        FileNotFoundError: no `s0`.
        ValueError: a level exists with another shape or dtype.
    """
    import zarr

    group = Path(group)
    if not (group / "s0" / ".zarray").is_file():
        raise FileNotFoundError(f"{group}/s0: no such array (create the level-0 array first)")
    s0 = zarr.open_array(str(group / "s0"), mode="r")
    attrs_path = group / ".zattrs"
    attrs = json.loads(attrs_path.read_text()) if attrs_path.is_file() else {}
    level0 = next(lv for lv in parse_multiscales(attrs, source=str(group)) if lv.path == "s0")
    n = num_levels or num_levels_for(s0.shape)
    shapes = level_shapes(s0.shape, n)
    for i, shape in enumerate(shapes[1:], start=1):
        path = group / f"s{i}"
        if (path / ".zarray").is_file():
            existing = zarr.open_array(str(path), mode="r")
            if tuple(existing.shape) != shape or existing.dtype != s0.dtype:
                raise ValueError(f"{path}: exists as {existing.dtype} {list(existing.shape)}, expected {s0.dtype} "
                                 f"{list(shape)}")
            continue
        chunks = tuple(min(c, s) for c, s in zip(s0.chunks, shape, strict=True))
        zarr.open_array(str(path), mode="w-", shape=shape, dtype=s0.dtype, chunks=chunks, compressor=s0.compressor,
                        fill_value=0, dimension_separator="/")
    levels = pyramid_levels(level0.voxel_size_nm, level0.translation_nm, n)
    name = attrs.get("multiscales", [{}])[0].get("name", group.name)
    attrs.update(build_multiscales(levels, name=name))
    attrs.update(dict(extra_attrs or {}))
    tmp = attrs_path.with_name(".zattrs.tmp")
    tmp.write_text(json.dumps(attrs, indent=2))
    tmp.replace(attrs_path)
    return shapes


def downsample_store_block(group: str | os.PathLike[str], level: int, offset_vox: Sequence[int], *,
                           block_vox: Sequence[int], method: Method | None = None) -> None:
    """One block of level `level` (≥ 1) of a multiscale group from level `level - 1`; `offset_vox` is the block's
    corner in voxels of `level` (a multiple of `block_vox`). `method` defaults to `method_for` the group
    (`image-label` in its attributes → a label group).

    Raises:
        ValueError: level < 1, an offset off the block grid, a block that is not whole chunks of the level.
    """
    import zarr

    group = Path(group)
    if level < 1:
        raise ValueError(f"{group}: level {level}: s0 is written by the prediction, not down-sampled")
    src = zarr.open_array(str(group / f"s{level - 1}"), mode="r")
    dst = zarr.open_array(str(group / f"s{level}"), mode="r+")
    if any(int(o) % int(b) for o, b in zip(offset_vox, block_vox, strict=True)):
        raise ValueError(f"{group}/s{level}: offset {list(offset_vox)} is not on the {list(block_vox)} block grid")
    if any(int(b) % c and int(b) < n for b, c, n in zip(block_vox, dst.chunks, dst.shape, strict=True)):
        raise ValueError(f"{group}/s{level}: block {list(block_vox)} vox is not whole chunks {list(dst.chunks)}")
    if method is None:
        attrs = json.loads((group / ".zattrs").read_text()) if (group / ".zattrs").is_file() else {}
        method = method_for(src.dtype, label="image-label" in attrs)
    position = tuple(int(o) // int(b) for o, b in zip(offset_vox, block_vox, strict=True))
    downsample_block(src, dst, position, block_vox=block_vox, method=method)


def level_block_count(shape_vox: Sequence[int], block_vox: Sequence[int]) -> int:
    """How many blocks a level of `shape_vox` has (for progress bars)."""
    return math.prod(-(-int(n) // int(b)) for n, b in zip(shape_vox, block_vox, strict=True))
