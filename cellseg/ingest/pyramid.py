"""OME-NGFF pyramids for anisotropic volumes: halve the fine axes until the voxels are isotropic, then all.

`cellseg.data.write.write_multiscale` halves every axis at every level, which for 5 × 5 × 40 nm SBEM
(z coarse) would give 10 × 10 × 80, 20 × 20 × 160, ...: z gets coarser still and in-plane never catches
up. Here each level halves only the axes whose voxel is finer than `1/√2` of the coarsest one (the axes
for which halving brings the voxel closer to the coarsest in log scale); once no axis is, every axis is
halved. 5 × 5 × 40 nm gives 10 × 10 × 40, 20 × 20 × 40, 40 × 40 × 40, 80 × 80 × 80, ...

Levels follow the translation convention of `cellseg.data.ngff` (translation = centre of voxel 0, so a
level shifts by half a new voxel minus half an old one on the halved axes only). The volume is written
slab by slab along z (a slab = one chunk row), so the whole volume never has to fit in memory; EM is
block-mean down-sampled, labels block-mode (ids are never averaged), both by `data.write.downsample_2x`.
Chunks are about isotropic in nm (`level_chunks`), so a 2D read of one section decompresses few planes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cellseg.data.ngff import build_multiscales, pyramid_levels
from cellseg.data.write import (
    DEFAULT_CHUNK,
    MIN_LEVEL_SIZE,
    LabelKind,
    create_multiscale_level,
    downsample_2x,
)

MAX_LEVELS = 8  # as data.write.default_num_levels
Factors = tuple[int, int, int]
ReadSlab = Callable[[int, int], np.ndarray]  # (z0, z1) → sections z0:z1 of s0, (z, y, x)


def level_factors(voxel_size_nm: Sequence[float], shape_vox: Sequence[int], *, min_size: int = MIN_LEVEL_SIZE,
                  max_levels: int = MAX_LEVELS) -> list[Factors]:
    """Per-level (z, y, x) down-sampling factors relative to the previous level (module docstring).

    The pyramid stops before a halved axis would fall below `min_size` voxels, or at `max_levels` levels.
    """
    vs, shape = [float(v) for v in voxel_size_nm], [int(n) for n in shape_vox]
    factors: list[Factors] = []
    while len(factors) + 1 < max_levels:
        coarsest = max(vs)
        fine = [v < coarsest / math.sqrt(2) for v in vs]
        step = tuple(2 if (f or not any(fine)) else 1 for f in fine)
        if any(k == 2 and n // 2 < min_size for k, n in zip(step, shape, strict=True)):
            break
        factors.append(step)  # type: ignore[arg-type]
        vs = [v * k for v, k in zip(vs, step, strict=True)]
        shape = [-(-n // k) for n, k in zip(shape, step, strict=True)]
    return factors


def level_chunks(voxel_size_nm: Sequence[float], shape_vox: Sequence[int], base: int = DEFAULT_CHUNK
                 ) -> tuple[int, int, int]:
    """A chunk about isotropic in nm: `base` voxels along the finest axis, fewer along coarser ones."""
    finest = min(voxel_size_nm)
    return tuple(max(1, min(int(n), round(base * finest / v)))  # type: ignore[return-value]
                 for v, n in zip(voxel_size_nm, shape_vox, strict=True))


def _new_level(group: Path, path: str, shape: Sequence[int], dtype: np.dtype, chunks: Sequence[int],
               like: Any) -> Any:
    import zarr

    return zarr.open_array(str(group / path), mode="w-", shape=tuple(shape), dtype=dtype, chunks=tuple(chunks),
                           compressor=like.compressor, fill_value=0, dimension_separator="/")


def write_pyramid(group: str | Path, read_slab: ReadSlab, *, shape_vox: Sequence[int], dtype: np.dtype | str,
                  voxel_size_nm: Sequence[float], translation_nm: Sequence[float], kind: LabelKind,
                  on_slab: Callable[[np.ndarray], None] | None = None, progress: Callable[[int], None] | None = None,
                  attrs: dict[str, Any] | None = None) -> list[Factors]:
    """Write an OME-NGFF 0.4 multiscale group `s0, s1, ...` with the anisotropic rule (module docstring).

    Args:
        group: the group directory to create; it must not exist (build inside a temporary root).
        read_slab: returns sections `z0:z1` of level s0 as (z, y, x) in `dtype`.
        shape_vox, voxel_size_nm, translation_nm: the grid of s0 (translation = centre of voxel 0).
        kind: "em" (block mean) or "labels" (block mode).
        on_slab: called with every s0 slab (e.g. to count voxels).
        progress: called with the number of sections written, level by level.
        attrs: extra group attributes.

    Returns:
        The per-level factors (one fewer than the levels).
    """
    group, shape, dtype = Path(group), tuple(int(n) for n in shape_vox), np.dtype(dtype)
    factors = level_factors(voxel_size_nm, shape)
    metas = pyramid_levels(voxel_size_nm, translation_nm, len(factors) + 1, factors=factors)
    chunks = level_chunks(metas[0].voxel_size_nm, shape)
    previous = create_multiscale_level(group, shape, dtype, voxel_size_nm=voxel_size_nm,
                                       translation_nm=translation_nm, chunks=chunks)
    s0 = previous
    for z0 in range(0, shape[0], chunks[0]):
        z1 = min(shape[0], z0 + chunks[0])
        slab = np.asarray(read_slab(z0, z1), dtype=dtype)
        if slab.shape != (z1 - z0, *shape[1:]):
            raise ValueError(f"{group}: slab {z0}:{z1} has shape {slab.shape}, expected {(z1 - z0, *shape[1:])}")
        previous[z0:z1] = slab
        if on_slab:
            on_slab(slab)
        if progress:
            progress(z1 - z0)
    for meta, step in zip(metas[1:], factors, strict=True):
        new_shape = tuple(-(-n // k) for n, k in zip(previous.shape, step, strict=True))
        level = _new_level(group, meta.path, new_shape, dtype, level_chunks(meta.voxel_size_nm, new_shape), s0)
        rows = level.chunks[0]
        for z0 in range(0, new_shape[0], rows):
            z1 = min(new_shape[0], z0 + rows)
            source = previous[z0 * step[0]:min(previous.shape[0], z1 * step[0])]
            level[z0:z1] = downsample_2x(source, kind, factors=step)
            if progress:
                progress(z1 - z0)
        previous = level
    (group / ".zattrs").write_text(json.dumps({**build_multiscales(metas, name=group.name), **(attrs or {})},
                                              indent=2))
    return factors


def pyramid_sections(voxel_size_nm: Sequence[float], shape_vox: Sequence[int]) -> int:
    """Sections `write_pyramid` writes over all levels (the total of its `progress` calls)."""
    total, shape = int(shape_vox[0]), [int(n) for n in shape_vox]
    for step in level_factors(voxel_size_nm, shape_vox):
        shape = [-(-n // k) for n, k in zip(shape, step, strict=True)]
        total += shape[0]
    return total


def write_label_pyramid(group: str | Path, data: np.ndarray, *, voxel_size_nm: Sequence[float],
                        translation_nm: Sequence[float], attrs: dict[str, Any] | None = None) -> list[Factors]:
    """`write_pyramid` of an in-memory label array (block-mode down-sampling)."""
    return write_pyramid(group, lambda z0, z1: data[z0:z1], shape_vox=data.shape, dtype=data.dtype,
                         voxel_size_nm=voxel_size_nm, translation_nm=translation_nm, kind="labels", attrs=attrs)
