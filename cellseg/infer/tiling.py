"""How a crop is cut for prediction: blocks (what memory allows, each with its context margin), the
sliding-window tiles inside them, and where the blending sums live.

A crop is cut in y and x only, into columns that span its whole depth (`auto_column_vox`): the sliding window
streams each column in z (`cellseg.infer.sliding_window.sliding_window_slabs`), so its sums hold one tile
depth of K float32 planes, and the host holds the finished planes until a whole chunk of them can be written.
Most crops are one column; every cut re-predicts one layer of tiles (and the context margin) along it.
A 2D model averaged over slices across z, y and x cannot stream: it is cut into cubic blocks
(`auto_block_vox`), each predicted whole (K float16 volumes on the host, K + 3 float32 volumes of sums).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from cellseg.data.grid import Grid
from cellseg.data.write import DEFAULT_CHUNK
from cellseg.infer.sliding_window import tile_starts, window_tiles

AXIS_INDEX = {"z": 0, "y": 1, "x": 2}
GPU_ACCUMULATE_FRACTION = 0.5  # blend on the GPU when image + sums need at most this share of its free memory
GPU_BLOCK_FRACTION = 0.4  # automatic blocks: image + sums of a block need at most this share of the GPU's memory
# An ensemble predicted in one pass: the sums of all its members at most this share; the rest holds one member's
# slab being finished, the slabs others are ahead by, and the activations. The 8-model ensemble's four 3D members
# need 68 GB for a 1000² column of 25 channels: 0.46 of an H200, so such a crop stays one column there.
GPU_FUSED_FRACTION = 0.5
HOST_BLOCK_BYTES = 16 * 2**30  # a block's float16 probabilities in host memory: at most 16 GiB
MAX_BLOCK_VOX = 1024  # largest cubic block edge (voxels) the automatic choice considers
MAX_COLUMN_VOX = 4096  # largest column edge in y and x (voxels) the automatic choice considers


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
                slice_axes: Sequence[str] = ("z",), *, start_plane: int = 0, batch_size: int = 1) -> int:
    """Tiles `predict_volume` runs over a context-padded volume of `shape_vox` (for progress bars); a column
    resumed at `start_plane` (a box plane, one slicing axis) runs fewer (`window_tiles`)."""
    margin = context_margin(patch_vox, slice_axes)
    padded = [n + 2 * m for n, m in zip(shape_vox, margin, strict=True)]
    if start_plane:
        if len(slice_axes) != 1:
            raise ValueError("a resumed column streams along one axis: 3D, or 2D slices across z")
        padded = [max(n, p) for n, p in zip(padded, patch_vox, strict=True)]
        return len(window_tiles(padded, patch_vox, overlap, start_plane=start_plane + margin[0],
                                batch_size=batch_size))
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


def stream_bytes(num_outputs: int, patch_vox: Sequence[int], plane: Sequence[int]) -> int:
    """Memory the streaming window's sums need: K + 1 (weights) float32 volumes of one tile depth."""
    return (num_outputs + 1) * patch_vox[0] * math.prod(plane) * 4


def working_device(device: torch.device, nbytes: int) -> torch.device:
    """Where `nbytes` of blending state (or image) live: the GPU when they fit comfortably, else host memory."""
    if device.type != "cuda":
        return device
    free, _ = torch.cuda.mem_get_info(device)
    return device if nbytes <= GPU_ACCUMULATE_FRACTION * free else torch.device("cpu")


def auto_column_vox(num_outputs: int, patch_vox: Sequence[int], margin: Sequence[int], device: torch.device,
                    gpu_bytes: int | None = None) -> int:
    """The largest column edge in y and x (a multiple of the store's chunk) for a streamed crop: the finished
    planes waiting for a whole chunk (one chunk plus one tile depth of K float16 planes) fit `HOST_BLOCK_BYTES`,
    and the sums fit the GPU's share. Depends only on the GPU model (`gpu_bytes`: its memory, default the
    device's), so a re-run resumes."""
    return fused_column_vox([(num_outputs, patch_vox, margin)], num_outputs, device, gpu_bytes,
                            gpu_fraction=GPU_BLOCK_FRACTION)


def fused_column_vox(streams: Sequence[tuple[int, Sequence[int], Sequence[int]]], num_outputs: int,
                     device: torch.device, gpu_bytes: int | None = None, *,
                     gpu_fraction: float = GPU_FUSED_FRACTION) -> int:
    """`auto_column_vox` for several sliding windows streaming the same column at once (an ensemble predicted
    in one pass, `cellseg.infer.fused`), each given as (its K, patch, context margin): their sums together fit
    `gpu_fraction` of the GPU; `num_outputs` channels wait on the host for a whole chunk."""
    on_gpu = device.type == "cuda"
    if on_gpu and gpu_bytes is None:
        gpu_bytes = torch.cuda.get_device_properties(device).total_memory
    gpu_bytes = gpu_bytes or 0
    depth = max((patch[0] for _, patch, _ in streams), default=1)
    best = DEFAULT_CHUNK
    for edge in range(DEFAULT_CHUNK, MAX_COLUMN_VOX + 1, DEFAULT_CHUNK):
        sums = sum(stream_bytes(k, patch, [edge + 2 * m for m in margin[1:]]) for k, patch, margin in streams)
        host = num_outputs * (DEFAULT_CHUNK + depth) * edge ** 2 * 2 + (0 if on_gpu else sums)
        if host > HOST_BLOCK_BYTES or (on_gpu and sums > gpu_fraction * gpu_bytes):
            break
        best = edge
    return best


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


def plan_blocks(shape_vox: Sequence[int], block_vox: int | Sequence[int]
                ) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """(offset, shape) of the blocks that tile a grid of `shape_vox`, at most `block_vox` per axis (one edge, or
    one per axis: columns are `(Z, edge, edge)`), z, y, x order.

    Each axis is cut into as few blocks as `block_vox` allows, of equal size rounded up to the store's chunk
    (the last one shorter): 1000 voxels at a 448 limit give 384 + 384 + 232, not 448 + 448 + 104, so no block
    is mostly context. Blocks then write whole chunks, as long as `block_vox` is at least a chunk."""
    def cuts(n: int, limit: int) -> list[tuple[int, int]]:
        pieces = math.ceil(n / limit)
        edge = math.ceil(n / pieces)
        if limit >= DEFAULT_CHUNK and pieces > 1:
            edge = min(limit, math.ceil(edge / DEFAULT_CHUNK) * DEFAULT_CHUNK)
        return [(o, min(edge, n - o)) for o in range(0, n, edge)]

    limits = [block_vox] * 3 if isinstance(block_vox, int) else list(block_vox)
    per_axis = [cuts(n, limit) for n, limit in zip(shape_vox, limits, strict=True)]
    return [((z[0], y[0], x[0]), (z[1], y[1], x[1])) for z in per_axis[0] for y in per_axis[1] for x in per_axis[2]]


def sub_grid(grid: Grid, offset: Sequence[int], shape: Sequence[int]) -> Grid:
    """The part of `grid` of `shape` voxels starting at voxel `offset`."""
    start = [t + o * v for t, o, v in zip(grid.translation_nm, offset, grid.voxel_size_nm, strict=True)]
    return Grid.of(translation_nm=start, shape_vox=shape, voxel_size_nm=grid.voxel_size_nm)
