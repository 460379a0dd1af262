"""Blocks: one training crop's EM and targets read once, on the EM lattice at the training voxel size.

A block's grid holds every window a sample of the crop can read: the crop's box, widened by the reach of a
sample centre (class-balanced centres lie within the box ± `CENTRE_JITTER` of a patch) and by half the read
shape (with rotation context, `dataset.context_shape`; for 2D, across every slicing axis), on the lattice that
`PatchDataset.grid_for` snaps samples to (the EM level at the training voxel size; where there is none, the
closest level's origin with the training voxel size: the EM is then resampled once, for the whole block).

Only the EM covers all of it. Targets are stored over the crop's annotated box alone (and `BOX_MARGIN_VOX`):
outside it every label read pads, so the streaming loader's values there are known constants (`all` id
`ALL_OUTSIDE`, every bit 0), and the margin costs 1 byte per voxel instead of the W of a whole sample.

Memory per block: `em` uint8 `(z, y, x)` over the grid; `targets` uint8 `(z', y', x', T)` over the box (channel-last:
one gather moves a voxel's T bytes together), with T = the `all` id byte ("ids" encoding only), then the packed
target bytes and the packed known bytes (boundary channels in "ids", every channel in "bits"): `Layout` names
them. A `BlockStore` holds every block of a run in two tensors. A sample's window is cut into a `(1 + T,
*shape)` region: EM first, then the targets, as the streaming loader would have read them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from cellseg.data.arrays import GRID_ATOL_VOX
from cellseg.data.boundary_cache import lattice_grid
from cellseg.data.dataset import PatchDataset, oriented_shape
from cellseg.data.grid import Grid
from cellseg.data.sampling import CENTRE_JITTER
from cellseg.data.targets import ALL_OUTSIDE, CropSource

SLACK_VOX = 2  # extra voxels around every block: a window's origin snaps by up to half a voxel
HALO_VOX = 1  # label planes read above and below each slab: boundary channels compare 6-neighbours
SLAB_VOXELS = 2**22  # voxels read per slab while filling a block (bounds the reading's host memory)
# The annotated box is that of the labels' finest levels; a coarser level read at the training voxel size may
# reach past it by less than one of its voxels (an odd shape halved), at most 2 training voxels.
BOX_MARGIN_VOX = 2


def box_padding(crop: CropSource, box: Grid, em: np.ndarray, dataset: PatchDataset) -> np.ndarray:
    """The padding voxels of the crop's box (unknown for every channel) by the dataset's rule
    (`PatchDataset.padding`), decided once over the whole box: with the "edge" rule a black region inside the box
    is padding only when it reaches the volume's edge (or the crop's edge region), which the whole box shows
    better than a patch, where a black region crossing the patch's face must count as padding. So with "edge"
    resident batches can keep as data a few voxels a streamed patch masks; with "value" or "off" they are the same.
    """
    level = crop.em().choose_level(box.voxel_size_nm)
    axes = []
    for t, n, v, lt, ln, lv in zip(box.translation_nm, box.shape_vox, box.voxel_size_nm, level.translation_nm,
                                   level.shape_vox, level.voxel_size_nm, strict=True):
        centres = t + v * np.arange(n)
        axes.append((centres >= lt - lv / 2) & (centres <= lt + (ln - 0.5) * lv))
    inside = axes[0][:, None, None] & axes[1][None, :, None] & axes[2][None, None, :]
    return dataset.padding(crop, box, em, inside)


class Progress(Protocol):
    """Anything with tqdm's `update(n)`."""

    def update(self, n: int) -> object:
        """Count `n` more bytes read."""


@dataclass(frozen=True)
class Layout:
    """The channels of a sample: the EM, then T target channels: the `all` id ("ids" encoding only), `nbits`
    packed target bytes and `nbits` packed known bytes."""

    ids: bool
    nbits: int

    @classmethod
    def of(cls, dataset: PatchDataset) -> Layout:
        """The layout of the dataset's target encoding (`PatchDataset.target_mode`)."""
        crop = dataset.crops[0]
        ids = dataset.target_mode == "ids"
        return cls(ids=ids, nbits=-(-(len(crop.aux_classes) if ids else crop.num_channels) // 8))

    @property
    def targets(self) -> int:
        """T, target bytes per voxel."""
        return int(self.ids) + 2 * self.nbits

    @property
    def width(self) -> int:
        """W = 1 + T, bytes per voxel of a sample."""
        return 1 + self.targets

    def batch(self, cut: torch.Tensor) -> dict[str, torch.Tensor]:
        """`(B, W, *S)` → the volumes of the batch dict (views of `cut`), as `cellseg.data.dataset` names them."""
        first = 1 + int(self.ids)
        out = {"image": cut[:, :1]}
        if self.ids:
            out["ids"] = cut[:, 1:2]
        out["target_bits"] = cut[:, first:first + self.nbits]
        out["known_bits"] = cut[:, first + self.nbits:]
        return out


@dataclass
class Block:
    """One crop's resident data (views into a `BlockStore`): `em` on `grid`, `targets` channel-last on the box
    that starts at voxel `offset` of `grid`."""

    grid: Grid
    em: torch.Tensor  # (z, y, x) uint8
    targets: torch.Tensor  # (z', y', x', T) uint8
    offset: tuple[int, int, int]
    layout: Layout
    dataset: str  # the CellMap dataset it comes from (for the log)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return self.em.numel() + self.targets.numel()

    @property
    def target_grid(self) -> Grid:
        """The grid of `targets`."""
        t = [a + o * v for a, o, v in zip(self.grid.translation_nm, self.offset, self.grid.voxel_size_nm, strict=True)]
        return Grid.of(translation_nm=t, shape_vox=self.targets.shape[:3], voxel_size_nm=self.grid.voxel_size_nm)

    def cut(self, out: torch.Tensor, start: Sequence[int], *, zeroed: bool) -> None:
        """Copy the window at `start` of shape `out.shape[1:]` into `out` `(W, z, y, x)` (zero already if `zeroed`)."""
        shape = out.shape[1:]
        out[0].copy_(self.em[tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))])
        box = self.targets.shape[:3]
        lo = [max(s, o) for s, o in zip(start, self.offset, strict=True)]
        hi = [min(s + n, o + m) for s, n, o, m in zip(start, shape, self.offset, box, strict=True)]
        if lo != list(start) or hi != [s + n for s, n in zip(start, shape, strict=True)]:  # reaches past the box
            if not zeroed:
                out[1:].zero_()
            if self.layout.ids:  # the `all` id reads as ALL_OUTSIDE outside the crop
                out[1].fill_(ALL_OUTSIDE)
        if all(h > a for a, h in zip(lo, hi, strict=True)):
            dst = tuple(slice(a - s, h - s) for a, h, s in zip(lo, hi, start, strict=True))
            src = tuple(slice(a - o, h - o) for a, h, o in zip(lo, hi, self.offset, strict=True))
            out[(slice(1, None), *dst)].copy_(self.targets[src].permute(3, 0, 1, 2))


class BlockStore:
    """Every block's EM in one flat uint8 tensor and every block's targets in one `(voxels, T)` tensor, so that a
    single gather can cut windows out of any block (`cellseg.data.gather`); `blocks` are views into them.

    Args:
        grids: the blocks' grids (`block_grid`), one per crop.
        crops: the crops.
        layout: the target channels.
        device: where the memory is allocated (raises what the allocation raises, e.g. `torch.OutOfMemoryError`).
    """

    def __init__(self, grids: Sequence[Grid], crops: Sequence[CropSource], *, layout: Layout, device: torch.device):
        boxes = [_box_in(g, c) for g, c in zip(grids, crops, strict=True)]
        em_sizes = [math.prod(g.shape_vox) for g in grids]
        box_shapes = [tuple(b - a for a, b in zip(start, stop, strict=True)) for start, stop in boxes]
        self.em = torch.empty(sum(em_sizes), dtype=torch.uint8, device=device)
        self.targets = torch.empty((sum(math.prod(b) for b in box_shapes), layout.targets), dtype=torch.uint8,
                                   device=device)
        self.em_base = [0, *itertools.accumulate(em_sizes)][:-1]
        self.target_base = [0, *itertools.accumulate(math.prod(b) for b in box_shapes)][:-1]
        self.blocks = [
            Block(grid=g, em=self.em[e:e + n].view(g.shape_vox), offset=start, layout=layout,
                  targets=self.targets[t:t + math.prod(box)].view(*box, layout.targets),
                  dataset=_dataset_name(c.entry.em_url))
            for g, c, e, n, t, (start, _), box in zip(grids, crops, self.em_base, em_sizes, self.target_base, boxes,
                                                      box_shapes, strict=True)]

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return self.em.numel() + self.targets.numel()


def window_start(grid: Grid, window: Grid) -> tuple[int, int, int]:
    """The voxel of a block's `grid` where `window` starts (snapped to the lattice).

    Raises:
        RuntimeError: the window leaves the block (the block's margin is wrong: a bug, not a user error).
    """
    start = [round((t - b) / v) for t, b, v in zip(window.translation_nm, grid.translation_nm, grid.voxel_size_nm,
                                                    strict=True)]
    if any(s < 0 or s + n > m for s, n, m in zip(start, window.shape_vox, grid.shape_vox, strict=True)):
        raise RuntimeError(f"window {window} leaves its resident block {grid}")
    return start[0], start[1], start[2]


def block_grid(crop: CropSource, points: Sequence[np.ndarray], dataset: PatchDataset) -> Grid:
    """The lattice grid holding every window a sample of `crop` can read (see the module docstring).

    Args:
        points: the crop's foreground points per class (nm), the centres of class-balanced samples.
    """
    vs = np.asarray(dataset.voxel_size_nm)
    lo, hi = np.asarray(crop.start_nm), np.asarray(crop.stop_nm)  # uniform centres lie in the box
    found = [p for p in points if len(p)]
    if found:
        lo = np.minimum(lo, np.min([p.min(0) for p in found], axis=0))
        hi = np.maximum(hi, np.max([p.max(0) for p in found], axis=0))
    shapes = [oriented_shape(dataset.read_shape_vox, a) for a in dataset.sampler.slice_axes]
    margin = CENTRE_JITTER * dataset.sampler.extent + (np.max(shapes, axis=0) - 1) / 2 * vs + SLACK_VOX * vs
    level = crop.em().choose_level(vs)
    return lattice_grid(lo - margin, hi + margin, lattice_translation_nm=level.translation_nm, voxel_size_nm=vs)


def block_nbytes(grid: Grid, crop: CropSource, layout: Layout) -> int:
    """Bytes of the block of `crop` on `grid` (what a `BlockStore` allocates for it)."""
    start, stop = _box_in(grid, crop)
    return math.prod(grid.shape_vox) + layout.targets * math.prod(b - a for a, b in zip(start, stop, strict=True))


def _box_in(grid: Grid, crop: CropSource) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Voxels `[start, stop)` of `grid` whose centres lie in the crop's annotated box widened by `BOX_MARGIN_VOX`
    (closed, as label reads count a centre on the edge as inside): outside them every label read pads."""
    t, v = np.asarray(grid.translation_nm), np.asarray(grid.voxel_size_nm)
    lo, hi = np.asarray(crop.start_nm) - BOX_MARGIN_VOX * v, np.asarray(crop.stop_nm) + BOX_MARGIN_VOX * v
    start = np.clip(np.ceil((lo - t) / v - GRID_ATOL_VOX), 0, grid.shape_vox).astype(int)
    stop = np.clip(np.floor((hi - t) / v + GRID_ATOL_VOX) + 1, start, grid.shape_vox).astype(int)
    return (int(start[0]), int(start[1]), int(start[2])), (int(stop[0]), int(stop[1]), int(stop[2]))


def _planes(grid: Grid, z0: int, z1: int) -> Grid:
    """Planes `z0 <= z < z1` of `grid` (they may reach beyond it)."""
    (tz, ty, tx), (vz, _, _) = grid.translation_nm, grid.voxel_size_nm
    return Grid(translation_nm=(tz + z0 * vz, ty, tx), shape_vox=(z1 - z0, *grid.shape_vox[1:]),
                voxel_size_nm=grid.voxel_size_nm)


def _slabs(grid: Grid) -> list[tuple[int, int]]:
    """`[z0, z1)` plane ranges of about `SLAB_VOXELS` voxels each."""
    step = max(1, SLAB_VOXELS // max(1, math.prod(grid.shape_vox[1:])))
    return [(z0, min(grid.shape_vox[0], z0 + step)) for z0 in range(0, grid.shape_vox[0], step)]


def read_targets(crop: CropSource, grid: Grid, black: np.ndarray, dataset: PatchDataset, layout: Layout
                 ) -> np.ndarray:
    """`(T, *grid.shape_vox)` uint8: the targets of `grid` as the streaming loader reads them, the padding voxels
    (`black`, on `grid`: `box_padding`) made unknown."""
    halo = _planes(grid, -HALO_VOX, grid.shape_vox[0] + HALO_VOX)
    inner = (slice(None), slice(HALO_VOX, HALO_VOX + grid.shape_vox[0]))
    if layout.ids:
        ids, tbits, kbits = crop.read_ids_and_boundaries(halo)
        ids = ids[inner[1:]]
        ids[black] = ALL_OUTSIDE
        parts = [ids[None]]
    else:
        tbits, kbits = crop.read_targets_packed(halo, use_all=dataset.use_all)
        parts = []
    kbits = kbits[inner] & np.where(black, np.uint8(0), np.uint8(255))[None]
    return np.concatenate([*parts, tbits[inner], kbits])


def fill_block(block: Block, crop: CropSource, dataset: PatchDataset, layout: Layout, progress: Progress) -> None:
    """Read the block slab by slab (bounded host memory): the EM over its grid, then the targets over the box."""
    grid = block.grid
    for z0, z1 in _slabs(grid):
        em = crop.em().read(**_planes(grid, z0, z1).read_kwargs(), interpolation="area",
                            pad_value=dataset.em_pad_value, dtype=np.uint8)
        block.em[z0:z1].copy_(torch.from_numpy(em))
        progress.update(em.size)
    box = block.target_grid
    if min(box.shape_vox) <= 0:
        return
    index = tuple(slice(o, o + n) for o, n in zip(block.offset, box.shape_vox, strict=True))
    black = box_padding(crop, box, block.em[index].cpu().numpy(), dataset)
    for z0, z1 in _slabs(box):
        targets = read_targets(crop, _planes(box, z0, z1), black[z0:z1], dataset, layout)
        block.targets[z0:z1].copy_(torch.from_numpy(targets).permute(1, 2, 3, 0))
        progress.update(targets.size)


def _dataset_name(em_url: str) -> str:
    """`jrc_hela-2` from `.../jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8`."""
    parts = [p for p in em_url.replace("\\", "/").split("/") if p.endswith(".zarr")]
    return parts[-1][: -len(".zarr")] if parts else em_url
