"""How a crop is cut for prediction: blocks (what memory allows, each with its context margin) and the
sliding-window tiles inside them, and where a block's blending sums live.

A block's result is K float16 volumes in host memory and its blending sums K + 3 float32 volumes (image,
weights, sums, slack) of the block plus its context, on the GPU when they fit. `auto_block_vox` picks the largest
block edge (a multiple of the store's chunk) within both budgets; every block re-predicts one layer of tiles
along each cut, so larger blocks cost fewer tiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from cellseg.data.targets import Grid
from cellseg.data.write import DEFAULT_CHUNK
from cellseg.infer.sliding_window import tile_starts

AXIS_INDEX = {"z": 0, "y": 1, "x": 2}
GPU_ACCUMULATE_FRACTION = 0.5  # blend on the GPU when image + sums need at most this share of its free memory
GPU_BLOCK_FRACTION = 0.4  # automatic blocks: image + sums of a block need at most this share of the GPU's memory
HOST_BLOCK_BYTES = 16 * 2**30  # a block's float16 probabilities in host memory: at most 16 GiB
MAX_BLOCK_VOX = 1024  # largest block edge (voxels) the automatic choice considers


def context_margin(patch_vox: Sequence[int], slice_axes: Sequence[str] = ("z",)) -> tuple[int, int, int]:
    """Voxels of context read on each side of the box: half a patch on every axis a tile spans (3D: all;
    2D: the in-plane axes of each slicing axis), none across the slices of a 2D model."""
    if patch_vox[0] != 1:
        return tuple(p // 2 for p in patch_vox)  # type: ignore[return-value]
    margin = [0, 0, 0]
    for axis in slice_axes:
        a = AXIS_INDEX[axis]
        for d, p in zip([d for d in range(3) if d != a], patch_vox[1:], strict=True):
            margin[d] = max(margin[d], p // 2)
    return tuple(margin)  # type: ignore[return-value]


def count_tiles(shape_vox: Sequence[int], patch_vox: Sequence[int], overlap: float,
                slice_axes: Sequence[str] = ("z",)) -> int:
    """Tiles `predict_volume` runs over a context-padded volume of `shape_vox` (for progress bars)."""
    margin = context_margin(patch_vox, slice_axes)
    padded = [n + 2 * m for n, m in zip(shape_vox, margin, strict=True)]
    if patch_vox[0] != 1:
        return math.prod(len(tile_starts(n, p, overlap)) for n, p in zip(padded, patch_vox, strict=True))
    total = 0
    for axis in slice_axes:
        a = AXIS_INDEX[axis]
        plane = [padded[d] for d in range(3) if d != a]
        total += shape_vox[a] * math.prod(len(tile_starts(n, p, overlap))
                                          for n, p in zip(plane, patch_vox[1:], strict=True))
    return total


def _blend_bytes(num_outputs: int, shape: Sequence[int]) -> int:
    """Memory the sliding window needs for a volume: float32 image, weights, K sums and one slack channel."""
    return (num_outputs + 3) * math.prod(shape) * 4


def working_device(device: torch.device, num_outputs: int, shape: Sequence[int]) -> torch.device:
    """Where the image and the blending sums live: the GPU when they fit comfortably, else host memory."""
    if device.type != "cuda":
        return device
    free, _ = torch.cuda.mem_get_info(device)
    return device if _blend_bytes(num_outputs, shape) <= GPU_ACCUMULATE_FRACTION * free else torch.device("cpu")


def auto_block_vox(num_outputs: int, margin: Sequence[int], device: torch.device) -> int:
    """The largest block edge (a multiple of the store's chunk) whose float16 result fits `HOST_BLOCK_BYTES`
    and whose blending sums (block + context) fit the GPU's share: blocks as large as memory allows, since
    every block re-predicts its context margin. Depends only on the GPU model, so a re-run resumes."""
    on_gpu = device.type == "cuda"
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory if on_gpu else 0
    best = DEFAULT_CHUNK
    for edge in range(DEFAULT_CHUNK, MAX_BLOCK_VOX + 1, DEFAULT_CHUNK):
        blend = _blend_bytes(num_outputs, [edge + 2 * m for m in margin])
        host = num_outputs * edge ** 3 * 2 + (0 if on_gpu else blend)  # on CPU the sums are in host memory too
        if host > HOST_BLOCK_BYTES or (on_gpu and blend > GPU_BLOCK_FRACTION * gpu_bytes):
            break
        best = edge
    return best


def plan_blocks(shape_vox: Sequence[int], block_vox: int) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """(offset, shape) of the blocks that tile a grid of `shape_vox`, at most `block_vox` per axis, z, y, x order.

    Each axis is cut into as few blocks as `block_vox` allows, of equal size rounded up to the store's chunk
    (the last one shorter): 1000 voxels at a 448 limit give 384 + 384 + 232, not 448 + 448 + 104, so no block
    is mostly context. Blocks then write whole chunks, as long as `block_vox` is at least a chunk."""
    def cuts(n: int) -> list[tuple[int, int]]:
        pieces = math.ceil(n / block_vox)
        edge = math.ceil(n / pieces)
        if block_vox >= DEFAULT_CHUNK:
            edge = min(block_vox, math.ceil(edge / DEFAULT_CHUNK) * DEFAULT_CHUNK)
        return [(o, min(edge, n - o)) for o in range(0, n, edge)]

    per_axis = [cuts(n) for n in shape_vox]
    return [((z[0], y[0], x[0]), (z[1], y[1], x[1])) for z in per_axis[0] for y in per_axis[1] for x in per_axis[2]]


def sub_grid(grid: Grid, offset: Sequence[int], shape: Sequence[int]) -> Grid:
    """The part of `grid` of `shape` voxels starting at voxel `offset`."""
    start = [t + o * v for t, o, v in zip(grid.translation_nm, offset, grid.voxel_size_nm, strict=True)]
    return Grid(translation_nm=tuple(start), shape_vox=tuple(int(n) for n in shape),  # type: ignore[arg-type]
                voxel_size_nm=grid.voxel_size_nm)
