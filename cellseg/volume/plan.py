"""What `cellseg predict-volume` will do, decided and checked before any compute: the dataset's EM level at the
members' voxel size, the ROI (world nm) and its grid, the write blocks, the context each block reads, the tile
lattice that makes the result independent of the blocking, and the disk the output needs.

Blocks are counted in voxels of the ROI's grid (s0), from the ROI's corner: block `p` writes voxels
`p · block_vox` up to the ROI's end. The scheduler's ROIs are these voxel boxes (integers, whatever the voxel
size in nm).

**The tile lattice** (why blocks do not change the result). The sliding window spreads its tiles evenly over
whatever box it is given (`cellseg.infer.sliding_window.tile_starts`), so two blockings of one ROI would put
tiles in different places and blend different predictions. Instead every block is predicted over a box that
starts on a lattice point below its write box and ends on one at or after it (`lattice_box`): the lattice of a
member is every `step = int(patch · (1 - overlap))` voxels from the ROI's corner, so the tiles of such a box
start exactly at the lattice points, the same tiles a single block over the whole ROI runs. Its predictions are
then cropped to the write box. With blocks a multiple of every member's step (64-voxel chunks and the usual
patches), the box is the write box itself except at the ROI's far end.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cellseg.data.grid import Grid, shape3

if TYPE_CHECKING:  # the workers of CPU tasks import this module: no torch or tensorstore at import
    from cellseg.data.arrays import Level, MultiscaleImage

log = logging.getLogger(__name__)
VOXEL_RTOL = 1e-3  # a level's voxel size within 0.1 % of the members' counts as theirs
PYRAMID_FACTOR = 8 / 7  # s0 + s1 + s2 + ... of a 2× pyramid: at most 8/7 of s0
Box = tuple[tuple[int, int, int], tuple[int, int, int]]  # (offset, shape) in voxels of the ROI's grid


def parse_roi_nm(text: str) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """`z0:z1,y0:y1,x0:x1` (world nm) → (offset, shape) in nm.

    Raises:
        ValueError: not three `a:b` ranges with a < b.
    """
    parts = [p.strip() for p in str(text).split(",")]
    try:
        ranges = [tuple(float(v) for v in p.split(":")) for p in parts]
    except ValueError:
        ranges = []
    if len(ranges) != 3 or any(len(r) != 2 or r[1] <= r[0] for r in ranges):
        raise ValueError(f"--roi-nm {text!r}: expected z0:z1,y0:y1,x0:x1 in nm with each start below its end, "
                         "e.g. 0:4096,0:8192,0:8192")
    offset = tuple(r[0] for r in ranges)
    shape = tuple(r[1] - r[0] for r in ranges)
    return offset, shape  # type: ignore[return-value]


def dataset_em(root: str | os.PathLike[str], dataset: str) -> str:
    """The EM group of `dataset` in a data root: where a crop of it in the root's catalogue points, else the
    challenge layout (`<root>/<dataset>/<dataset>.zarr/recon-1/em/fibsem-uint8`)."""
    from cellseg.data.crops import Catalog
    from cellseg.data.split import dataset_paths

    try:
        catalog = Catalog.from_dir(root)
    except (FileNotFoundError, ValueError):
        catalog = None
    if catalog is not None:
        for crop in catalog.crops_of(dataset):
            if crop.em_url:
                return str(catalog.locate(crop.em_url))
    return dataset_paths(root, dataset)[0]


def open_em(url: str, dataset: str) -> MultiscaleImage:
    """The dataset's EM (uint8).

    Raises:
        FileNotFoundError: naming the dataset and the location.
    """
    from cellseg.data.arrays import MultiscaleImage

    try:
        return MultiscaleImage(url, expected_dtype="uint8")
    except (FileNotFoundError, OSError) as err:
        raise FileNotFoundError(f"dataset {dataset}: cannot open its EM at {url}: {err}") from None


def em_level(em: MultiscaleImage, voxel_size_nm: Sequence[float], dataset: str) -> Level:
    """The EM level at exactly the members' voxel size (the volume is predicted on its grid, never resampled).

    Raises:
        ValueError: no such level (the levels present are named).
    """
    for lv in em.levels:
        if all(math.isclose(a, b, rel_tol=VOXEL_RTOL) for a, b in zip(lv.voxel_size_nm, voxel_size_nm, strict=True)):
            return lv
    present = ", ".join(f"{lv.path} {'×'.join(f'{v:g}' for v in lv.voxel_size_nm)} nm" for lv in em.levels)
    raise ValueError(f"dataset {dataset}: no EM level at the members' voxel size "
                     f"{'×'.join(f'{v:g}' for v in voxel_size_nm)} nm ({em.location} has {present}); predict "
                     "with members trained at one of these sizes")


def roi_of(level: Level, roi_nm: tuple[Sequence[float], Sequence[float]] | None, dataset: str) -> Grid:
    """The ROI's grid on the EM level: the whole level by default, else `roi_nm` (offset, shape in nm).

    Raises:
        ValueError: an ROI that reaches outside the volume, or is not whole voxels of the level's grid.
    """
    vs = level.voxel_size_nm
    start = [t - v / 2 for t, v in zip(level.translation_nm, vs, strict=True)]
    if roi_nm is None:
        return Grid.of(translation_nm=level.translation_nm, shape_vox=level.shape_vox, voxel_size_nm=vs)
    offset, shape = roi_nm
    first, count = [], []
    for axis, o, s, a, v, n in zip("zyx", offset, shape, start, vs, level.shape_vox, strict=True):
        i0, k = (o - a) / v, s / v
        if abs(i0 - round(i0)) > 1e-6 or abs(k - round(k)) > 1e-6:
            raise ValueError(f"--roi-nm: along {axis} {o:g}..{o + s:g} nm is not whole {v:g} nm voxels of the EM "
                             f"grid (voxel edges at {a:g} + k·{v:g} nm)")
        if round(i0) < 0 or round(i0 + k) > n:
            raise ValueError(f"--roi-nm: along {axis} {o:g}..{o + s:g} nm reaches outside the volume of dataset "
                             f"{dataset} ({a:g}..{a + n * v:g} nm at {v:g} nm)")
        first.append(round(i0))
        count.append(round(k))
    return Grid.of(translation_nm=[t + i * v for t, i, v in zip(level.translation_nm, first, vs, strict=True)],
                   shape_vox=count, voxel_size_nm=vs)


def lattice_step(patch_vox: Sequence[int], overlap: float) -> tuple[int, int, int]:
    """A member's tile lattice spacing per axis (`tile_starts`' step for a box whose span fits it exactly)."""
    return shape3([max(1, int(p * (1 - overlap))) for p in patch_vox])


def lattice_box(write: Box, patch_vox: Sequence[int], overlap: float) -> Box:
    """The box (ROI voxels) a member predicts for a write box so that its tiles sit on its lattice (module
    docstring): from the lattice point at or below the write box's start to the first span that
    `tile_starts` tiles exactly at the lattice step (context `context_margin` on each side) and that covers
    the write box."""
    from cellseg.infer.tiling import context_margin

    margin = context_margin(patch_vox)
    step = lattice_step(patch_vox, overlap)
    offset, shape = [], []
    for o, n, p, m, s in zip(*write, patch_vox, margin, step, strict=True):
        lo = o - o % s
        need = o + n - lo
        tiles = max(0, math.ceil((need + 2 * m - p) / s))  # lattice steps after the first tile
        span = max(need, p - 2 * m + tiles * s)
        offset.append(lo)
        shape.append(span)
    return shape3(offset), shape3(shape)


def block_boxes(shape_vox: Sequence[int], block_vox: Sequence[int]) -> list[Box]:
    """The write boxes that tile a grid of `shape_vox` at `block_vox`, z-major (the last of an axis shorter)."""
    ranges = [[(o, min(b, n - o)) for o in range(0, n, b)] for n, b in zip(shape_vox, block_vox, strict=True)]
    return [((z[0], y[0], x[0]), (z[1], y[1], x[1])) for z in ranges[0] for y in ranges[1] for x in ranges[2]]


def sub_grid(grid: Grid, box: Box) -> Grid:
    """The part of `grid` a box covers (a box may reach outside it: the lattice at the ROI's far end)."""
    offset, shape = box
    return Grid.of(translation_nm=[t + o * v for t, o, v in zip(grid.translation_nm, offset, grid.voxel_size_nm,
                                                                  strict=True)],
                   shape_vox=shape, voxel_size_nm=grid.voxel_size_nm)


def context_vox(patches: Sequence[Sequence[int]], overlap: float) -> tuple[int, int, int]:
    """Voxels a block reads around its write box: the largest member's context plus a lattice step."""
    from cellseg.infer.tiling import context_margin

    out = [0, 0, 0]
    for p in patches:
        for d, (m, s) in enumerate(zip(context_margin(p), lattice_step(p, overlap), strict=True)):
            out[d] = max(out[d], m + s)
    return shape3(out)


# ------------------------------------------------------------------------------------------ GPU memory

def block_sums_bytes(edge_vox: int, members: Sequence[tuple[int, Sequence[int], float]]) -> int:
    """GPU bytes of the blending sums of a block `edge_vox` wide in y and x: per member (channels it contributes,
    patch, overlap) one tile depth of K + 1 float32 planes over its lattice box and context (`stream_bytes`)."""
    from cellseg.infer.tiling import context_margin, stream_bytes

    total = 0
    for k, patch, overlap in members:
        step, margin = lattice_step(patch, overlap), context_margin(patch)
        plane = [edge_vox + s + 2 * m for s, m in zip(step[1:], margin[1:], strict=True)]
        total += stream_bytes(k, shape3(patch), plane)
    return total


def fit_block_edge(edge_vox: int, chunk_vox: int, members: Sequence[tuple[int, Sequence[int], float]],
                   gpu_bytes: int) -> int:
    """The largest block edge in y and x, at most `edge_vox` and a multiple of `chunk_vox`, whose members' sums
    fit the share of `gpu_bytes` a fused ensemble's sums may take (`GPU_FUSED_FRACTION`: the rest holds the models,
    one member's activations at a time, the EM and the finished planes), or `chunk_vox` when even that does not."""
    from cellseg.infer.tiling import GPU_FUSED_FRACTION

    edge = edge_vox
    while edge > chunk_vox and block_sums_bytes(edge, members) > GPU_FUSED_FRACTION * gpu_bytes:
        edge -= chunk_vox
    return edge


# ------------------------------------------------------------------------------------------ disk


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes the output store needs, uncompressed (an upper bound: blosc shrinks probabilities several-fold)."""

    probabilities: int
    labels: int

    @property
    def total(self) -> int:
        return self.probabilities + self.labels


def estimate_bytes(grid: Grid, channels: Sequence[str], label_bytes: Sequence[int]) -> DiskEstimate:
    """Uncompressed bytes of uint8 probabilities for `channels` and labels of `label_bytes` bytes per voxel (one
    entry per labelled class), with their pyramids."""
    voxels = math.prod(grid.shape_vox) * PYRAMID_FACTOR
    return DiskEstimate(probabilities=int(voxels * len(channels)), labels=int(voxels * sum(label_bytes)))


def check_disk(out: str | os.PathLike[str], estimate: DiskEstimate, *, compression: float) -> None:
    """Refuse to start when the free space where `out` goes is below the estimate divided by `compression` (the
    compression ratio assumed; 1 = none).

    Raises:
        OSError: too little free space, with both numbers and the key that relaxes the check.
    """
    from cellseg.data.inspect import free_disk, human_bytes

    where, free = free_disk(out)
    need = estimate.total / max(compression, 1.0)
    if need > free:
        raise OSError(f"{out}: the output needs about {human_bytes(need)} ({human_bytes(estimate.total)} "
                      f"uncompressed / volume.disk_compression={compression:g}), {where} has {human_bytes(free)} "
                      "free; free space, choose a smaller --roi-nm, or set volume.disk_compression higher if your "
                      "data compresses better")
    log.info("output: about %s (uncompressed %s); %s free", human_bytes(need), human_bytes(estimate.total),
             human_bytes(free))
